#include "keraunos/codegen/kernel_ir.h"

#include "keraunos/ir/error.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace keraunos::kir {

DType compute_dtype(DType storage) {
  switch (storage) {
  case DType::Float16:
  case DType::BFloat16:
    return DType::Float32;
  case DType::Bool:
  case DType::UInt8:
  case DType::Int8:
  case DType::Int16:
  case DType::Int32:
  case DType::Int64:
  case DType::Float32:
  case DType::Float64:
    return storage;
  }
  KR_INTERNAL(false, "compute_dtype: bad dtype");
  return storage;
}

const char* ctype(DType d) {
  switch (d) {
  case DType::Bool:
    return "bool";
  case DType::UInt8:
    return "uint8_t";
  case DType::Int8:
    return "int8_t";
  case DType::Int16:
    return "int16_t";
  case DType::Int32:
    return "int32_t";
  case DType::Int64:
    return "int64_t";
  case DType::Float16:
  case DType::BFloat16:
    return "uint16_t"; // storage only; computed in float
  case DType::Float32:
    return "float";
  case DType::Float64:
    return "double";
  }
  KR_INTERNAL(false, "ctype: bad dtype");
  return "";
}

int64_t Index::coef(const std::string& var) const {
  for (const auto& [v, c] : terms)
    if (v == var) return c;
  return 0;
}

std::string Index::str() const {
  std::ostringstream os;
  bool first = true;
  for (const auto& [v, c] : terms) {
    if (!first) os << " + ";
    first = false;
    if (c == 1)
      os << v;
    else
      os << c << " * " << v;
  }
  if (opaque) {
    if (!first) os << " + ";
    first = false;
    os << "(" << c_text(opaque) << ")";
  }
  if (constant != 0 || first) {
    if (!first) os << " + ";
    os << constant;
  }
  return os.str();
}

bool Index::mentions(const std::string& var) const {
  for (const auto& [v, c] : terms)
    if (v == var) return true;
  return opaque && kir::mentions(opaque, var);
}

Index Index::renamed(const std::string& from, const std::string& to) const {
  Index out = *this;
  for (auto& [v, c] : out.terms)
    if (v == from) v = to;
  if (out.opaque) out.opaque = rename(out.opaque, from, to);
  return out;
}

Expr Index::expr(DType t) const {
  KR_INTERNAL(t == DType::Int64 || (t == DType::Int32 && !opaque), "Index::expr: ", dtype_name(t),
              " for ", str());
  Expr e = opaque;
  auto add = [&](const Expr& x) { e = e ? binary(ExprKind::Add, e, x) : x; };
  for (const auto& [v, c] : terms)
    add(c == 1 ? var(v, t) : binary(ExprKind::Mul, int_lit(c, t), var(v, t)));
  if (constant != 0 || !e) add(int_lit(constant, t));
  return e;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return "sum";
  case ReduceOp::Prod:
    return "prod";
  case ReduceOp::Max:
    return "max";
  case ReduceOp::Min:
    return "min";
  }
  return "?";
}

Stmt Stmt::of(Loop l) {
  Stmt s;
  s.kind = Kind::Loop;
  s.loop = std::make_shared<Loop>(std::move(l));
  return s;
}
Stmt Stmt::of(Load l) {
  Stmt s;
  s.kind = Kind::Load;
  s.load = std::move(l);
  return s;
}
Stmt Stmt::of(Let l) {
  Stmt s;
  s.kind = Kind::Let;
  s.let = std::move(l);
  return s;
}
Stmt Stmt::of(AccInit a) {
  Stmt s;
  s.kind = Kind::AccInit;
  s.acc = std::move(a);
  return s;
}
Stmt Stmt::of(AccUpdate u) {
  Stmt s;
  s.kind = Kind::AccUpdate;
  s.update = std::move(u);
  return s;
}
Stmt Stmt::of(Store st) {
  Stmt s;
  s.kind = Kind::Store;
  s.store = std::move(st);
  return s;
}

int Kernel::num_inputs() const {
  int n = 0;
  for (const auto& b : buffers) n += !b.output;
  return n;
}

namespace {
const char* loop_kind(LoopKind k) {
  switch (k) {
  case LoopKind::Parallel:
    return "parallel";
  case LoopKind::Reduce:
    return "reduce";
  case LoopKind::Inner:
    return "inner";
  case LoopKind::Scan:
    return "scan";
  }
  return "?";
}

void print(std::ostringstream& os, const Kernel& k, const Block& b, int depth) {
  std::string pad(2 * depth, ' ');
  for (const auto& s : b) {
    switch (s.kind) {
    case Stmt::Kind::Loop:
      os << pad << loop_kind(s.loop->kind) << " " << s.loop->var << " < " << s.loop->extent
         << ":";
      if (s.loop->deviations)
        os << "  // deviations of " << s.loop->deviations->sum << "'s values from "
           << s.loop->deviations->mean;
      os << "\n";
      print(os, k, s.loop->body, depth + 1);
      break;
    case Stmt::Kind::Load:
      os << pad << s.load.var << " = load " << k.buffers.at(s.load.buffer).name << "["
         << s.load.index.str() << "]\n";
      break;
    case Stmt::Kind::Let:
      os << pad << "let " << s.let.var << " = " << c_text(s.let.expr) << "\n";
      break;
    case Stmt::Kind::AccInit:
      os << pad << "acc " << s.acc.var << " " << reduce_op_name(s.acc.op) << "\n";
      break;
    case Stmt::Kind::AccUpdate:
      os << pad << "update " << s.update.var << " " << reduce_op_name(s.update.op) << " "
         << s.update.value << "\n";
      break;
    case Stmt::Kind::Store:
      os << pad << "store " << k.buffers.at(s.store.buffer).name << "[" << s.store.index.str()
         << "] = " << s.store.value << "\n";
      break;
    }
  }
}
} // namespace

std::string Kernel::str() const {
  std::ostringstream os;
  os << "kernel " << name << "(";
  for (size_t i = 0; i < buffers.size(); ++i) {
    const auto& b = buffers[i];
    os << (i ? ", " : "") << b.name << ": " << dtype_short(b.dtype) << shape_str(b.shape);
  }
  os << "):\n";
  print(os, *this, body, 1);
  return os.str();
}

namespace {

void updated_accs(const Block& b, std::vector<std::string>& out) {
  for (const Stmt& s : b) {
    if (s.kind == Stmt::Kind::AccUpdate) out.push_back(s.update.var);
    if (s.kind == Stmt::Kind::Loop) updated_accs(s.loop->body, out);
  }
}

} // namespace

namespace {

void stored_buffers(const Block& b, std::vector<int>& out) {
  for (const Stmt& s : b) {
    if (s.kind == Stmt::Kind::Store) out.push_back(s.store.buffer);
    if (s.kind == Stmt::Kind::Loop) stored_buffers(s.loop->body, out);
  }
}

void hoist(Block& body, const std::vector<int>& stored, bool loads) {
  Block out;
  out.reserve(body.size());
  for (Stmt& s : body) {
    if (s.kind != Stmt::Kind::Loop) {
      out.push_back(std::move(s));
      continue;
    }
    Loop& l = *s.loop;
    hoist(l.body, stored, loads);
    if (l.kind == LoopKind::Parallel) {
      out.push_back(std::move(s));
      continue;
    }
    std::vector<std::string> inside{l.var};
    updated_accs(l.body, inside);
    auto invariant = [&](auto&& mentions_name) {
      return std::none_of(inside.begin(), inside.end(), mentions_name);
    };
    Block kept;
    for (Stmt& b : l.body) {
      if (b.kind == Stmt::Kind::Let &&
          invariant([&](const std::string& n) { return mentions(b.let.expr, n); })) {
        out.push_back(std::move(b));
        continue;
      }
      // A load of a buffer the kernel never stores to, at an index the loop does not change,
      // out of an Inner loop that runs (a per-row statistic read in the row's pointwise loop:
      // GCC left such a loop scalar, "latch block not empty": a layer_norm backward took 3 ms
      // instead of 0.4). Reduce loops keep theirs: GCC vectorizes those, and the CPU column
      // schedule wants a column reduction's loop body whole.
      if (loads && b.kind == Stmt::Kind::Load && l.extent > 0 && l.kind == LoopKind::Inner &&
          std::find(stored.begin(), stored.end(), b.load.buffer) == stored.end() &&
          invariant([&](const std::string& n) { return b.load.index.mentions(n); })) {
        out.push_back(std::move(b));
        continue;
      }
      if (b.kind == Stmt::Kind::Load) inside.push_back(b.load.var);
      if (b.kind == Stmt::Kind::Let) inside.push_back(b.let.var);
      if (b.kind == Stmt::Kind::AccInit) inside.push_back(b.acc.var);
      kept.push_back(std::move(b));
    }
    l.body = std::move(kept);
    out.push_back(std::move(s));
  }
  body = std::move(out);
}

} // namespace

void hoist_invariants(Block& body, bool loads) {
  std::vector<int> stored;
  if (loads) stored_buffers(body, stored);
  hoist(body, stored, loads);
}

namespace {

bool has_loop(const Block& b) {
  return std::any_of(b.begin(), b.end(), [](const Stmt& s) { return s.kind == Stmt::Kind::Loop; });
}

// Renames loop variable `from` to `to` in a loop body without nested loops.
void rename_loop_var(Block& b, const std::string& from, const std::string& to) {
  for (Stmt& s : b) {
    if (s.kind == Stmt::Kind::Load) s.load.index = s.load.index.renamed(from, to);
    if (s.kind == Stmt::Kind::Store) s.store.index = s.store.index.renamed(from, to);
    if (s.kind == Stmt::Kind::Let) s.let.expr = rename(s.let.expr, from, to);
  }
}

bool block_mentions(const Block& b, const std::vector<std::string>& names) {
  auto any = [&](auto&& reads) { return std::any_of(names.begin(), names.end(), reads); };
  for (const Stmt& s : b) {
    if (s.kind == Stmt::Kind::Load &&
        any([&](const std::string& n) { return s.load.index.mentions(n); }))
      return true;
    if (s.kind == Stmt::Kind::Let &&
        any([&](const std::string& n) { return mentions(s.let.expr, n); }))
      return true;
    if (s.kind == Stmt::Kind::AccUpdate &&
        any([&](const std::string& n) { return s.update.value == n || s.update.var == n; }))
      return true;
    if (s.kind == Stmt::Kind::Store && any([&](const std::string& n) {
          return s.store.value == n || s.store.index.mentions(n);
        }))
      return true;
  }
  return false;
}

} // namespace

void fuse_sibling_reductions(Block& body) {
  for (Stmt& s : body)
    if (s.kind == Stmt::Kind::Loop && s.loop->kind == LoopKind::Parallel)
      fuse_sibling_reductions(s.loop->body);
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i].kind != Stmt::Kind::Loop || body[i].loop->kind != LoopKind::Reduce ||
        has_loop(body[i].loop->body))
      continue;
    for (;;) {
      Loop& first = *body[i].loop;
      // The statements after `first` up to the next loop: lets and declarations only.
      size_t j = i + 1;
      while (j < body.size() &&
             (body[j].kind == Stmt::Kind::Let || body[j].kind == Stmt::Kind::AccInit))
        ++j;
      if (j == body.size() || body[j].kind != Stmt::Kind::Loop) break;
      Loop& second = *body[j].loop;
      if (second.kind != LoopKind::Reduce || second.extent != first.extent ||
          has_loop(second.body))
        break;
      std::vector<std::string> blocked;
      updated_accs(first.body, blocked);
      std::vector<std::string> declared;
      for (size_t m = i + 1; m < j; ++m) {
        if (body[m].kind == Stmt::Kind::Let) blocked.push_back(body[m].let.var);
        if (body[m].kind == Stmt::Kind::AccInit) declared.push_back(body[m].acc.var);
      }
      if (block_mentions(second.body, blocked)) break;
      // The lets between must not read what the second loop updates (they run after it now).
      std::vector<std::string> updated2;
      updated_accs(second.body, updated2);
      bool lets_ok = true;
      for (size_t m = i + 1; m < j; ++m)
        if (body[m].kind == Stmt::Kind::Let)
          for (const std::string& n : updated2) lets_ok &= !mentions(body[m].let.expr, n);
      if (!lets_ok) break;
      rename_loop_var(second.body, second.var, first.var);
      for (Stmt& b : second.body) first.body.push_back(std::move(b));
      Block decls, lets;
      for (size_t m = i + 1; m < j; ++m)
        (body[m].kind == Stmt::Kind::AccInit ? decls : lets).push_back(std::move(body[m]));
      Stmt merged = std::move(body[i]);
      Block rebuilt(std::make_move_iterator(body.begin()),
                    std::make_move_iterator(body.begin() + static_cast<std::ptrdiff_t>(i)));
      for (Stmt& d : decls) rebuilt.push_back(std::move(d));
      const size_t at = rebuilt.size();
      rebuilt.push_back(std::move(merged));
      for (Stmt& l : lets) rebuilt.push_back(std::move(l));
      for (size_t m = j + 1; m < body.size(); ++m) rebuilt.push_back(std::move(body[m]));
      body = std::move(rebuilt);
      i = at; // try the next loop against the merged one
    }
  }
}

} // namespace keraunos::kir

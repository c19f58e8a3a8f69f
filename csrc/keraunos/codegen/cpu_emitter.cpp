#include "keraunos/codegen/cpu_emitter.h"

#include "keraunos/codegen/embedded.h"
#include "keraunos/ir/error.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>

namespace keraunos::codegen {

namespace {

// Work (loop iterations, reductions included) below which threads cost more than they save.
constexpr int64_t kParallelWork = 1 << 15;

std::string storage_ctype(DType d) { return kir::ctype(d); }

std::string load_expr(const kir::Kernel& k, const kir::Load& l) {
  const kir::Buffer& b = k.buffers.at(l.buffer);
  std::string e = b.name + "[" + l.index.str() + "]";
  if (b.dtype == DType::Float16) return "kr_h2f(" + e + ")";
  if (b.dtype == DType::BFloat16) return "kr_bf2f(" + e + ")";
  return "(" + std::string(kir::ctype(l.dtype)) + ")" + e;
}

std::string store_expr(const kir::Buffer& b, const std::string& v) {
  if (b.dtype == DType::Float16) return "kr_f2h(" + v + ")";
  if (b.dtype == DType::BFloat16) return "kr_f2bf(" + v + ")";
  return "(" + storage_ctype(b.dtype) + ")(" + v + ")";
}

std::string identity(kir::ReduceOp op, DType d) {
  const char* c = kir::ctype(d);
  switch (op) {
  case kir::ReduceOp::Sum:
    return is_bool(d) ? "false" : std::string("(") + c + ")0";
  case kir::ReduceOp::Prod:
    return is_bool(d) ? "true" : std::string("(") + c + ")1";
  case kir::ReduceOp::Max:
    if (d == DType::Float64) return "(-kr_inf_d())";
    if (is_float(d)) return "(-kr_inf_f())";
    if (is_bool(d)) return "false";
    return std::string("std::numeric_limits<") + c + ">::lowest()";
  case kir::ReduceOp::Min:
    if (d == DType::Float64) return "kr_inf_d()";
    if (is_float(d)) return "kr_inf_f()";
    if (is_bool(d)) return "true";
    return std::string("std::numeric_limits<") + c + ">::max()";
  }
  return "";
}

std::string combine(kir::ReduceOp op, const std::string& a, const std::string& b, DType d) {
  switch (op) {
  case kir::ReduceOp::Sum:
    return is_bool(d) ? a + " || " + b : a + " + " + b;
  case kir::ReduceOp::Prod:
    return is_bool(d) ? a + " && " + b : a + " * " + b;
  case kir::ReduceOp::Max:
    return "kr_maximum(" + a + ", " + b + ")";
  case kir::ReduceOp::Min:
    return "kr_minimum(" + a + ", " + b + ")";
  }
  return "";
}

int64_t work(const kir::Block& b) {
  int64_t w = 0;
  for (const auto& s : b)
    if (s.kind == kir::Stmt::Kind::Loop)
      w += s.loop->extent * std::max<int64_t>(1, work(s.loop->body));
  return w;
}

// A long chain of costly values per element (five exps in a row) is latency-bound: each
// element's chain is one dependency chain of hundreds of cycles, and the out-of-order window
// holds about two iterations of it. Such an innermost pointwise loop runs in stages over
// blocks of kStageBlock elements instead, each stage computing one costly value for the whole
// block (independent elements: throughput-bound), the values later stages read kept in
// per-block arrays (L1). On the EPYC host, exp(x * -0.5) five times over 2^24 floats:
// 53 ms one element at a time, 19 ms in stages (one thread).
constexpr int64_t kStageBlock = 256;

// The innermost pointwise loop's stages: statement ranges [begin, end), each holding at most
// one costly let (none when the loop has fewer than two, or accumulates, or is short).
std::vector<std::pair<size_t, size_t>> stages(const kir::Loop& l) {
  std::vector<std::pair<size_t, size_t>> out;
  if (l.extent < 2 * kStageBlock) return out;
  size_t costly = 0;
  for (const auto& s : l.body) {
    if (s.kind != kir::Stmt::Kind::Load && s.kind != kir::Stmt::Kind::Let &&
        s.kind != kir::Stmt::Kind::Store)
      return out;
    costly += s.kind == kir::Stmt::Kind::Let && s.let.costly();
  }
  if (costly < 2) return out;
  size_t begin = 0;
  bool has_costly = false;
  for (size_t i = 0; i < l.body.size(); ++i) {
    const auto& s = l.body[i];
    if (s.kind == kir::Stmt::Kind::Let && s.let.costly()) {
      if (has_costly) {
        out.emplace_back(begin, i);
        begin = i;
      }
      has_costly = true;
    }
  }
  out.emplace_back(begin, l.body.size());
  return out;
}

bool has_loop(const kir::Block& b) {
  for (const auto& s : b)
    if (s.kind == kir::Stmt::Kind::Loop) return true;
  return false;
}

// Column reductions: an outer point loop whose body is accumulators, one nest of Reduce loops
// and then per-point statements, where the nest's loads run along the points (a bias
// gradient: out[i] = sum_r in[r, i]). One point at a time walks memory with a row's stride and
// cannot vectorize; instead a tile of kColumnTile points is reduced together, each row of the
// tile one contiguous simd loop, with the tile's accumulators in an array (each point still
// combines its values in row order). The Reduce nest of such a loop, or null.
constexpr int64_t kColumnTile = 128;
const kir::Loop* column_nest(const kir::Loop& l) {
  if (l.kind != kir::LoopKind::Parallel || l.extent < 2) return nullptr;
  const kir::Loop* nest = nullptr;
  for (const auto& s : l.body) {
    if (s.kind == kir::Stmt::Kind::Loop) {
      if (nest || s.loop->kind != kir::LoopKind::Reduce) return nullptr;
      nest = s.loop.get();
    } else if (!nest && s.kind != kir::Stmt::Kind::AccInit) {
      return nullptr; // per-point values before the nest: keep the plain loop
    } else if (nest && (s.kind == kir::Stmt::Kind::AccInit ||
                        s.kind == kir::Stmt::Kind::AccUpdate)) {
      return nullptr; // a reduction over size-1 dims after the nest (its own accumulator)
    }
  }
  if (!nest) return nullptr;
  const kir::Loop* in = nest;
  while (in->body.size() == 1 && in->body[0].kind == kir::Stmt::Kind::Loop)
    in = in->body[0].loop.get();
  if (in->kind != kir::LoopKind::Reduce || has_loop(in->body)) return nullptr;
  bool column = false;
  for (const auto& s : in->body) {
    if (s.kind == kir::Stmt::Kind::AccInit || s.kind == kir::Stmt::Kind::Store) return nullptr;
    if (s.kind != kir::Stmt::Kind::Load) continue;
    const int64_t along_points = s.load.index.coef(l.var);
    if (along_points != 0 && s.load.index.coef(in->var) == 1) return nullptr; // a row
    column = column || along_points == 1;
  }
  return column ? nest : nullptr;
}

class Printer {
public:
  explicit Printer(const kir::Kernel& k) : k_(k) {}

  std::string run() {
    os_ << "extern \"C\" void " << k_.name << "(void** ptrs, const int64_t* args) {\n";
    os_ << "  (void)args;\n";
    for (size_t i = 0; i < k_.buffers.size(); ++i) {
      const auto& b = k_.buffers[i];
      std::string t = storage_ctype(b.dtype);
      os_ << "  " << (b.output ? "" : "const ") << t << (k_.noalias ? "* __restrict__ " : "* ")
          << b.name << " = ("
          << (b.output ? "" : "const ") << t << "*)ptrs[" << i << "];\n";
    }
    block(k_.body, 1, true);
    os_ << "}\n";
    return os_.str();
  }

private:
  // Accumulators declared outside a Reduce loop and updated in its body (or in nested Reduce
  // loops). One declared inside the body (a reduction over size-1 dims) is private already.
  static void updated(const kir::Block& b, std::vector<const kir::AccUpdate*>& out,
                      std::vector<std::string>& inner) {
    for (const auto& s : b) {
      if (s.kind == kir::Stmt::Kind::AccInit) inner.push_back(s.acc.var);
      if (s.kind == kir::Stmt::Kind::AccUpdate &&
          std::find(inner.begin(), inner.end(), s.update.var) == inner.end())
        out.push_back(&s.update);
      if (s.kind == kir::Stmt::Kind::Loop && s.loop->kind == kir::LoopKind::Reduce)
        updated(s.loop->body, out, inner);
    }
  }

  void block(const kir::Block& b, int depth, bool top) {
    std::string pad(2 * depth, ' ');
    for (const auto& s : b) {
      switch (s.kind) {
      case kir::Stmt::Kind::Loop: {
        const kir::Loop& l = *s.loop;
        bool innermost = !has_loop(l.body);
        bool threaded_child = false;
        // Not where an output shares memory with an input: a stage writes its block before
        // later stages read it.
        // A Scan loop carries its running sum from one iteration to the next: serial.
        const bool scan = l.kind == kir::LoopKind::Scan;
        const auto st = innermost && l.kind != kir::LoopKind::Reduce && !scan && k_.noalias
                            ? stages(l)
                            : std::vector<std::pair<size_t, size_t>>{};
        // A staged loop's simd pragmas go on its stage loops.
        const bool simd = innermost && st.empty() && !scan;
        if (top && l.kind == kir::LoopKind::Parallel && collapse_left_ == 0) {
          // Thread the perfectly nested parallel loops (collapsed) when there is enough work.
          int collapse = 1;
          const kir::Loop* c = &l;
          while (c->body.size() == 1 && c->body[0].kind == kir::Stmt::Kind::Loop &&
                 c->body[0].loop->kind == kir::LoopKind::Parallel &&
                 has_loop(c->body[0].loop->body)) {
            c = c->body[0].loop.get();
            ++collapse;
          }
          if (work(b) >= kParallelWork) {
            os_ << pad << "#pragma omp parallel for" << (simd ? " simd" : "")
                << " schedule(static)";
            if (collapse > 1) os_ << " collapse(" << collapse << ")";
            os_ << "\n";
            collapse_left_ = collapse - 1;
            threaded_child = collapse_left_ > 0;
          } else if (simd) {
            simd_pragma(l, pad);
          }
        } else if (top && collapse_left_ > 0) {
          --collapse_left_;
          threaded_child = collapse_left_ > 0;
        } else if (simd) {
          simd_pragma(l, pad);
        }
        if (!st.empty()) {
          staged(l, st, depth);
          break;
        }
        if (const kir::Loop* nest = collapse_left_ == 0 ? column_nest(l) : nullptr) {
          columns(l, *nest, depth);
          break;
        }
        os_ << pad << "for (int64_t " << l.var << " = 0; " << l.var << " < " << l.extent << "; ++"
            << l.var << ") {\n";
        block(l.body, depth + 1, threaded_child);
        os_ << pad << "}\n";
        break;
      }
      case kir::Stmt::Kind::Load:
        os_ << pad << "const " << kir::ctype(s.load.dtype) << " " << s.load.var << " = "
            << load_expr(k_, s.load) << ";\n";
        break;
      case kir::Stmt::Kind::Let:
        os_ << pad << "const " << kir::ctype(s.let.dtype) << " " << s.let.var << " = "
            << kir::c_text(s.let.expr) << ";\n";
        break;
      case kir::Stmt::Kind::AccInit:
        acc_dtype_[s.acc.var] = s.acc.dtype;
        os_ << pad << kir::ctype(s.acc.dtype) << " " << s.acc.var << " = "
            << identity(s.acc.op, s.acc.dtype) << ";\n";
        break;
      case kir::Stmt::Kind::AccUpdate:
        os_ << pad << s.update.var << " = "
            << combine(s.update.op, s.update.var, s.update.value, acc_dtype_.at(s.update.var))
            << ";\n";
        break;
      case kir::Stmt::Kind::Store: {
        const auto& buf = k_.buffers.at(s.store.buffer);
        os_ << pad << buf.name << "[" << s.store.index.str() << "] = " << store_expr(buf, s.store.value)
            << ";\n";
        break;
      }
      }
    }
  }

  // The loop over blocks of kStageBlock elements (its pragma already printed: threads over the
  // blocks, or none), then one simd loop per stage. Every value a stage defines is kept in a
  // per-block array and declared again at the top of each later stage: the compiler drops the
  // declarations a stage does not read.
  void staged(const kir::Loop& l, const std::vector<std::pair<size_t, size_t>>& st, int depth) {
    std::string pad(2 * depth, ' '), in(2 * depth + 2, ' '), body(2 * depth + 4, ' ');
    const std::string b = l.var + "_b", n = l.var + "_n", j = l.var + "_j";
    os_ << pad << "for (int64_t " << b << " = 0; " << b << " < " << l.extent << "; " << b
        << " += " << kStageBlock << ") {\n";
    os_ << in << "const int64_t " << n << " = " << l.extent << " - " << b << " < " << kStageBlock
        << " ? " << l.extent << " - " << b << " : " << kStageBlock << ";\n";
    // The value a load or let defines (nullptr for a store).
    auto value = [](const kir::Stmt& s) -> std::pair<const std::string*, DType> {
      if (s.kind == kir::Stmt::Kind::Load) return {&s.load.var, s.load.dtype};
      if (s.kind == kir::Stmt::Kind::Let) return {&s.let.var, s.let.dtype};
      return {nullptr, DType::Float32};
    };
    std::vector<std::pair<const std::string*, DType>> defined; // values of earlier stages
    for (size_t k = 0; k < st.size(); ++k) {
      const bool last = k + 1 == st.size();
      kir::Block part(l.body.begin() + static_cast<std::ptrdiff_t>(st[k].first),
                      l.body.begin() + static_cast<std::ptrdiff_t>(st[k].second));
      if (!last)
        for (size_t i = st[k].first; i < st[k].second; ++i)
          if (auto [var, dt] = value(l.body[i]); var)
            os_ << in << kir::ctype(dt) << " " << *var << "_s[" << kStageBlock << "];\n";
      os_ << in << "#pragma omp simd\n";
      os_ << in << "for (int64_t " << j << " = 0; " << j << " < " << n << "; ++" << j << ") {\n";
      os_ << body << "const int64_t " << l.var << " = " << b << " + " << j << ";\n";
      for (const auto& [var, dt] : defined)
        os_ << body << "const " << kir::ctype(dt) << " " << *var << " = " << *var << "_s[" << j
            << "];\n";
      block(part, depth + 2, false);
      if (!last)
        for (size_t i = st[k].first; i < st[k].second; ++i)
          if (auto [var, dt] = value(l.body[i]); var) {
            os_ << body << *var << "_s[" << j << "] = " << *var << ";\n";
            defined.emplace_back(var, dt);
          }
      os_ << in << "}\n";
    }
    os_ << pad << "}\n";
  }

  // The point loop `l` in tiles (its pragma already printed: threads over the tiles, or none):
  // the accumulators in per-tile arrays, the Reduce nest's loops serial around one simd loop
  // over the tile, then the per-point statements over the tile.
  void columns(const kir::Loop& l, const kir::Loop& nest, int depth) {
    std::string pad(2 * depth, ' '), in(2 * depth + 2, ' ');
    const std::string b = l.var + "_b", n = l.var + "_n", j = l.var + "_j";
    os_ << pad << "for (int64_t " << b << " = 0; " << b << " < " << l.extent << "; " << b
        << " += " << kColumnTile << ") {\n";
    os_ << in << "const int64_t " << n << " = " << l.extent << " - " << b << " < " << kColumnTile
        << " ? " << l.extent << " - " << b << " : " << kColumnTile << ";\n";
    std::vector<const kir::AccInit*> accs;
    for (const auto& s : l.body)
      if (s.kind == kir::Stmt::Kind::AccInit) {
        accs.push_back(&s.acc);
        acc_dtype_[s.acc.var] = s.acc.dtype;
        os_ << in << kir::ctype(s.acc.dtype) << " " << s.acc.var << "_t[" << kColumnTile << "];\n";
        os_ << in << "for (int64_t " << j << " = 0; " << j << " < " << n << "; ++" << j << ") "
            << s.acc.var << "_t[" << j << "] = " << identity(s.acc.op, s.acc.dtype) << ";\n";
      }
    // The nest's loops, serial; the innermost body once per point of the tile.
    int d = depth + 1;
    const kir::Loop* cur = &nest;
    for (;;) {
      os_ << std::string(2 * d, ' ') << "for (int64_t " << cur->var << " = 0; " << cur->var << " < "
          << cur->extent << "; ++" << cur->var << ") {\n";
      ++d;
      if (has_loop(cur->body)) {
        cur = cur->body[0].loop.get();
        continue;
      }
      break;
    }
    const std::string dp(2 * d, ' ');
    os_ << dp << "#pragma omp simd\n";
    os_ << dp << "for (int64_t " << j << " = 0; " << j << " < " << n << "; ++" << j << ") {\n";
    os_ << dp << "  const int64_t " << l.var << " = " << b << " + " << j << ";\n";
    for (const auto* a : accs)
      os_ << dp << "  " << kir::ctype(a->dtype) << " " << a->var << " = " << a->var << "_t[" << j
          << "];\n";
    block(cur->body, d + 1, false);
    for (const auto* a : accs) os_ << dp << "  " << a->var << "_t[" << j << "] = " << a->var << ";\n";
    os_ << dp << "}\n";
    for (int k = d - 1; k > depth; --k) os_ << std::string(2 * k, ' ') << "}\n";
    // The per-point statements after the nest.
    kir::Block after;
    bool past = false;
    for (const auto& s : l.body) {
      if (past) after.push_back(s);
      past = past || s.kind == kir::Stmt::Kind::Loop;
    }
    os_ << in << "#pragma omp simd\n";
    os_ << in << "for (int64_t " << j << " = 0; " << j << " < " << n << "; ++" << j << ") {\n";
    os_ << in << "  const int64_t " << l.var << " = " << b << " + " << j << ";\n";
    for (const auto* a : accs)
      os_ << in << "  const " << kir::ctype(a->dtype) << " " << a->var << " = " << a->var << "_t["
          << j << "];\n";
    block(after, depth + 2, false);
    os_ << in << "}\n";
    os_ << pad << "}\n";
  }

  void simd_pragma(const kir::Loop& l, const std::string& pad) {
    if (l.kind != kir::LoopKind::Reduce) {
      os_ << pad << "#pragma omp simd\n";
      return;
    }
    std::vector<const kir::AccUpdate*> ups;
    std::vector<std::string> inner;
    updated(l.body, ups, inner);
    // Sums and products vectorize with OpenMP's reductions (reassociation is what eager's
    // vectorized reductions do too); max/min propagate NaN, so they use our own combiners.
    std::ostringstream clauses;
    for (const auto* u : ups) {
      DType d = acc_dtype_.at(u->var);
      if (is_bool(d)) return; // no simd for logical reductions
      switch (u->op) {
      case kir::ReduceOp::Sum:
        clauses << " reduction(+:" << u->var << ")";
        break;
      case kir::ReduceOp::Prod:
        clauses << " reduction(*:" << u->var << ")";
        break;
      case kir::ReduceOp::Max:
        clauses << " reduction(kr_max_" << kir::ctype(d) << ":" << u->var << ")";
        break;
      case kir::ReduceOp::Min:
        clauses << " reduction(kr_min_" << kir::ctype(d) << ":" << u->var << ")";
        break;
      }
    }
    os_ << pad << "#pragma omp simd" << clauses.str() << "\n";
  }

  const kir::Kernel& k_;
  std::ostringstream os_;
  std::unordered_map<std::string, DType> acc_dtype_;
  int collapse_left_ = 0; // nested loops still part of the current OpenMP collapse
};

// OpenMP reductions for NaN-propagating max/min, one per compute type.
std::string declare_reductions() {
  std::ostringstream os;
  const char* types[] = {"float", "double", "int8_t", "uint8_t", "int16_t", "int32_t", "int64_t"};
  for (const char* t : types) {
    std::string lo = std::string("std::numeric_limits<") + t + ">::lowest()";
    std::string hi = std::string("std::numeric_limits<") + t + ">::max()";
    if (std::string(t) == "float") lo = "(-kr_inf_f())", hi = "kr_inf_f()";
    if (std::string(t) == "double") lo = "(-kr_inf_d())", hi = "kr_inf_d()";
    os << "#pragma omp declare reduction(kr_max_" << t << " : " << t
       << " : omp_out = kr_maximum(omp_out, omp_in)) initializer(omp_priv = " << lo << ")\n";
    os << "#pragma omp declare reduction(kr_min_" << t << " : " << t
       << " : omp_out = kr_minimum(omp_out, omp_in)) initializer(omp_priv = " << hi << ")\n";
  }
  return os.str();
}

} // namespace

std::string emit_cpu_kernel(const kir::Kernel& k) { return Printer(k).run(); }

std::string emit_cpu_source(const std::vector<const kir::Kernel*>& kernels) {
  std::ostringstream os;
  os << "// Generated by keraunos (CPU fusion executor).\n";
  os << embedded_file("kr_cpu.h") << "\n#include <limits>\n";
  os << declare_reductions() << "\n";
  for (const auto* k : kernels) os << emit_cpu_kernel(*k) << "\n";
  return os.str();
}

} // namespace keraunos::codegen

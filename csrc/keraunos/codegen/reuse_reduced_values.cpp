#include "keraunos/codegen/reuse_reduced_values.h"

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace keraunos::codegen {

namespace {

bool has_loop(const kir::Block& b) {
  for (const auto& s : b)
    if (s.kind == kir::Stmt::Kind::Loop) return true;
  return false;
}

// The values a loop body defines, in a form where two loops computing the same value at the
// same point agree: the loop variable reads "@", values of the body are replaced by the
// number of their own form ("#n", numbered in `forms`, shared by the loops compared),
// variables from outside keep their names. Forms are interned expressions: equal forms are
// one node.
struct Forms {
  // (buffer of a load or -1 for a let, form, dtype) -> number
  std::map<std::tuple<int, const kir::ExprNode*, DType>, int> ids;
  std::vector<kir::Expr> alive; // keeps the keys' nodes
  int id(int buffer, const kir::Expr& form, DType dtype) {
    alive.push_back(form);
    return ids.emplace(std::tuple{buffer, form.get(), dtype}, static_cast<int>(ids.size()))
        .first->second;
  }
};

struct BodyValues {
  std::unordered_map<std::string, int> form;         // var -> form id
  std::unordered_set<std::string> expensive;         // computes a costly op somewhere
  std::unordered_set<std::string> reads_accumulator; // depends on an accumulator of this loop
};

BodyValues describe(const kir::Loop& l, Forms& forms) {
  BodyValues v;
  std::unordered_set<std::string> accs;
  for (const auto& s : l.body)
    if (s.kind == kir::Stmt::Kind::AccUpdate) accs.insert(s.update.var);
  for (const auto& s : l.body) {
    bool costly = false, acc = false;
    auto sub = [&](const kir::ExprNode& x) -> kir::Expr {
      if (x.name == l.var) return kir::var("@", x.dtype);
      if (accs.count(x.name)) acc = true;
      auto it = v.form.find(x.name);
      if (it == v.form.end()) return nullptr;
      costly |= v.expensive.count(x.name) != 0;
      acc |= v.reads_accumulator.count(x.name) != 0;
      return kir::var("#" + std::to_string(it->second), x.dtype);
    };
    std::string var;
    int id;
    if (s.kind == kir::Stmt::Kind::Load) {
      var = s.load.var;
      id = forms.id(s.load.buffer, kir::substitute(s.load.index.expr(), sub), s.load.dtype);
    } else if (s.kind == kir::Stmt::Kind::Let) {
      var = s.let.var;
      costly |= s.let.costly();
      id = forms.id(-1, kir::substitute(s.let.expr, sub), s.let.dtype);
    } else {
      continue;
    }
    v.form[var] = id;
    if (costly) v.expensive.insert(var);
    if (acc) v.reads_accumulator.insert(var);
  }
  return v;
}

// Drops loads and lets of a loop body that nothing reads any more.
void drop_dead(kir::Block& body) {
  std::unordered_set<std::string> live;
  auto mark = [&](const kir::Expr& expr) {
    kir::for_each_var(expr, [&](const std::string& id) { live.insert(id); });
  };
  kir::Block kept;
  for (auto it = body.rbegin(); it != body.rend(); ++it) {
    const kir::Stmt& s = *it;
    switch (s.kind) {
    case kir::Stmt::Kind::Let:
      if (!live.count(s.let.var)) continue;
      mark(s.let.expr);
      break;
    case kir::Stmt::Kind::Load:
      if (!live.count(s.load.var)) continue;
      if (s.load.index.opaque) mark(s.load.index.opaque); // a gather reads its index's value
      break;
    case kir::Stmt::Kind::Store:
      live.insert(s.store.value);
      break;
    case kir::Stmt::Kind::AccUpdate:
      live.insert(s.update.value);
      break;
    case kir::Stmt::Kind::AccInit:
    case kir::Stmt::Kind::Loop:
      return; // not a flat pointwise body: leave it alone
    }
    kept.push_back(s);
  }
  body.assign(kept.rbegin(), kept.rend());
}

class Reuse {
public:
  explicit Reuse(kir::Kernel& k) : k_(k) { count_stores(k.body); }

  bool run() { return block(k_.body); }

private:
  void count_stores(const kir::Block& b) {
    for (const auto& s : b) {
      if (s.kind == kir::Stmt::Kind::Loop) count_stores(s.loop->body);
      if (s.kind == kir::Stmt::Kind::Store) ++stores_[s.store.buffer];
    }
  }

  bool block(kir::Block& b) {
    bool changed = false;
    for (auto& s : b)
      if (s.kind == kir::Stmt::Kind::Loop) changed |= block(s.loop->body);
    for (size_t q = 0; q < b.size(); ++q) {
      if (b[q].kind != kir::Stmt::Kind::Loop) continue;
      kir::Loop& inner = *b[q].loop;
      if (inner.kind != kir::LoopKind::Inner || has_loop(inner.body)) continue;
      // The nearest reduction loop first: it is the one most likely to compute the value.
      for (size_t p = q; p-- > 0;) {
        if (b[p].kind != kir::Stmt::Kind::Loop) continue;
        kir::Loop& red = *b[p].loop;
        if (red.kind != kir::LoopKind::Reduce || red.extent != inner.extent ||
            has_loop(red.body))
          continue;
        if (reuse(red, inner)) {
          changed = true;
          break;
        }
      }
    }
    return changed;
  }

  bool reuse(kir::Loop& red, kir::Loop& inner) {
    Forms forms;
    BodyValues rv = describe(red, forms);
    BodyValues iv = describe(inner, forms);
    std::unordered_map<int, std::string> in_red; // form -> var of the reduction loop
    for (const auto& s : red.body)
      if (s.kind == kir::Stmt::Kind::Let && !rv.reads_accumulator.count(s.let.var))
        in_red.emplace(rv.form.at(s.let.var), s.let.var);
    for (const auto& st : inner.body) {
      if (st.kind != kir::Stmt::Kind::Store) continue;
      const kir::Store& store = st.store;
      const kir::Buffer& buf = k_.buffers.at(store.buffer);
      // A buffer written once, by this store, at a different element in each iteration, in a
      // dtype that holds the value exactly.
      if (!buf.output || (buf.dtype != DType::Float32 && buf.dtype != DType::Float64)) continue;
      if (stores_[store.buffer] != 1 || store.index.coef(inner.var) == 0) continue;
      // The latest matching value: it covers the most computation.
      const kir::Let* pick = nullptr;
      for (const auto& s : inner.body)
        if (s.kind == kir::Stmt::Kind::Let && iv.expensive.count(s.let.var) &&
            s.let.dtype == buf.dtype && in_red.count(iv.form.at(s.let.var)))
          pick = &s.let;
      if (!pick) continue;
      kir::Store early;
      early.buffer = store.buffer;
      early.index = store.index.renamed(inner.var, red.var);
      early.value = in_red.at(iv.form.at(pick->var));
      kir::Load reload;
      reload.var = pick->var;
      reload.dtype = pick->dtype;
      reload.buffer = store.buffer;
      reload.index = store.index;
      red.body.push_back(kir::Stmt::of(early));
      ++stores_[store.buffer];
      for (auto& s : inner.body)
        if (s.kind == kir::Stmt::Kind::Let && s.let.var == reload.var) s = kir::Stmt::of(reload);
      drop_dead(inner.body);
      return true;
    }
    return false;
  }

  kir::Kernel& k_;
  std::unordered_map<int, int> stores_; // buffer -> number of stores into it
};

} // namespace

bool reuse_reduced_values(kir::Kernel& kernel) { return Reuse(kernel).run(); }

} // namespace keraunos::codegen

// Autodiff: the joint forward + backward trace of a functional trace, split into a forward
// and a backward program.
//
// Needs: a functional trace (no in-place symbol); its inputs' requires_grad. Guarantees: the
// backward computes eager's gradients (ops/backward.cpp follows derivatives.yaml); the
// forward is the input trace's computation, returning what the backward reads from it.
//
//   def computation(t0, t1):       # t1 requires grad
//     t2 = prims.mul(t0, t1)       forward:  t2 = prims.mul(t0, t1); return [t2, [t0]]
//     return t2                    backward: (t0, g) -> t4 = prims.mul(g, t0); return [None, t4]
//
// Steps: the trace is flattened to prims (language ops are differentiated through their
// decompositions); which tensors require grad is propagated forward (a float result of an
// op with a differentiable input, as in eager; detach and non-float results stop it); the
// backward rules run in reverse order, accumulating gradients; CSE and DCE run over the joint
// trace, so a value the backward recomputes is the forward's. The split: the forward keeps
// what the outputs need and every effect (random draws); everything else runs in the
// backward. What the backward reads from the forward is saved, except values that pointwise
// ops recompute from other saved values in no more bytes (remat below: a greedy pass; an exact
// min-cut of saved bytes is the next step).
#include "keraunos/passes/autodiff.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/backward.h"
#include "keraunos/passes/cse.h"
#include "keraunos/passes/dce.h"
#include "keraunos/passes/fold_remaps.h"
#include "keraunos/passes/pass_manager.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace keraunos {

namespace {

std::string where(const BoundSymbol& b) {
  return b.loc && b.loc->line > 0 ? " (at " + b.loc->str() + ")" : "";
}

bool differentiable_dtype(DType d) { return is_float(d); }

// Ops whose backward runs through torch (recorded by torch_vjp_record in the forward, handed
// to torch.autograd.grad by torch_vjp in the backward): a torch call with no table entry, and
// matmul-class language ops that record no prims (scaled_dot_product_attention).
bool via_torch(const BoundSymbol& b) {
  const OpDef& d = b.def();
  return b.op == OpId::torch_fallback || (!d.is_prim() && d.has(tags::T) && b.subsymbols.empty());
}

// Refuses what the split programs cannot express yet, by name. A write into a program input
// that does not require grad (batch_norm's running statistics; recorded_write has checked that
// eager's autograd does not see it) stays in the forward; any other write is refused.
void check_supported(const Trace& t) {
  std::unordered_set<int64_t> grad_storages;
  for (const auto& i : t.inputs)
    if (i->requires_grad) grad_storages.insert(i->storage_id);
  for (const auto& b : t.bsyms) {
    if (!writes_memory(b)) continue;
    const bool plain = b.op == OpId::prim_copy_ && b.args.at(0).is_tensor() &&
                       std::any_of(t.inputs.begin(), t.inputs.end(),
                                   [&](const TensorRef& i) { return i == b.args[0].tensor(); }) &&
                       !grad_storages.count(b.args[0].tensor()->storage_id);
    KR_CHECK(plain, NotImplemented, "keraunos: ", b.def().qualified_name(),
             " writes into a program input", where(b),
             "; programs that autograd records and that mutate their inputs run through torch");
  }
}
// The program inputs the forward writes (check_supported's copies).
std::unordered_set<const TensorProxy*> written_inputs(const Trace& t) {
  std::unordered_set<const TensorProxy*> w;
  for (const auto& b : t.bsyms)
    if (writes_memory(b)) w.insert(b.args.at(0).tensor().get());
  return w;
}

// The return's leaves; outputs that view a program input (found by following view symbols
// back to it) become Alias leaves.
std::vector<GradSplit::Leaf> classify_leaves(const Trace& t) {
  std::unordered_map<const TensorProxy*, int64_t> input_index;
  std::unordered_set<int64_t> input_storage;
  for (size_t i = 0; i < t.inputs.size(); ++i) {
    input_index[t.inputs[i].get()] = static_cast<int64_t>(i);
    input_storage.insert(t.inputs[i]->storage_id);
  }
  std::unordered_map<const TensorProxy*, const BoundSymbol*> view_of;
  for (const auto& b : t.bsyms)
    if (b.def().has(tags::V))
      for (const auto& o : b.outputs()) view_of[o.get()] = &b;
  const Arg& ret = t.output();
  const Arg::List leaves_args = ret.is_list() ? ret.list() : Arg::List{ret};
  std::vector<GradSplit::Leaf> leaves;
  std::unordered_set<const TensorProxy*> seen;
  for (const auto& a : leaves_args) {
    GradSplit::Leaf leaf;
    if (a.is_tensor()) {
      const TensorRef& o = a.tensor();
      leaf.kind = GradSplit::Leaf::Tensor;
      if (input_storage.count(o->storage_id)) {
        const TensorProxy* cur = o.get();
        bool detached = false;
        while (!input_index.count(cur)) {
          auto it = view_of.find(cur);
          KR_CHECK(it != view_of.end(), NotImplemented, "keraunos: output ", o->name,
                   " shares memory with a program input but is not a view of one; such "
                   "programs run through torch when autograd records them");
          detached = detached || it->second->op == OpId::detach;
          cur = it->second->args.at(0).tensor().get();
        }
        leaf.kind = GradSplit::Leaf::Alias;
        leaf.input = input_index[cur];
        leaf.identity = cur == o.get();
        leaf.detached = detached;
        leaf.shape = o->shape;
        leaf.strides = o->strides;
        leaf.offset = o->storage_offset;
      } else {
        KR_CHECK(seen.insert(o.get()).second, NotImplemented, "keraunos: output ", o->name,
                 " is returned twice; such programs run through torch when autograd records them");
      }
    }
    leaves.push_back(std::move(leaf));
  }
  return leaves;
}

// Maximum flow (Dinic) on a small graph, for the rematerialization cut.
class FlowGraph {
public:
  static constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
  explicit FlowGraph(int n) : adj_(n), level_(n), next_(n) {}
  void edge(int u, int v, int64_t cap) {
    adj_[u].push_back(static_cast<int>(to_.size()));
    to_.push_back(v);
    cap_.push_back(cap);
    adj_[v].push_back(static_cast<int>(to_.size()));
    to_.push_back(u);
    cap_.push_back(0);
  }
  void max_flow(int s, int t) {
    while (bfs(s, t)) {
      std::fill(next_.begin(), next_.end(), 0);
      while (push(s, t, kInf) > 0) {
      }
    }
  }
  // After max_flow: the nodes the source still reaches in the residual graph.
  std::vector<bool> source_side(int s) {
    bfs(s, -1);
    std::vector<bool> r(level_.size());
    for (size_t i = 0; i < level_.size(); ++i) r[i] = level_[i] >= 0;
    return r;
  }

private:
  bool bfs(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::vector<int> q{s};
    level_[s] = 0;
    for (size_t h = 0; h < q.size(); ++h)
      for (int e : adj_[q[h]])
        if (cap_[e] > 0 && level_[to_[e]] < 0) {
          level_[to_[e]] = level_[q[h]] + 1;
          q.push_back(to_[e]);
        }
    return t >= 0 && level_[t] >= 0;
  }
  int64_t push(int u, int t, int64_t f) {
    if (u == t) return f;
    for (int& i = next_[u]; i < static_cast<int>(adj_[u].size()); ++i) {
      int e = adj_[u][i];
      int v = to_[e];
      if (cap_[e] <= 0 || level_[v] != level_[u] + 1) continue;
      int64_t d = push(v, t, std::min(f, cap_[e]));
      if (d > 0) {
        cap_[e] -= d;
        cap_[e ^ 1] += d;
        return d;
      }
    }
    return 0;
  }
  std::vector<std::vector<int>> adj_;
  std::vector<int> to_;
  std::vector<int64_t> cap_;
  std::vector<int> level_, next_;
};

// Rematerialization as a minimum cut (as torch's min-cut partitioner): each forward tensor is
// an edge in -> out whose capacity is the memory saving it costs (nothing for a program input,
// alive anyway); a recomputable symbol joins its inputs' out to its outputs' in, a symbol the
// backward may not recompute is fed by the source, every tensor the backward reads feeds the
// sink. The cheapest cut is the cheapest set of saved tensors from which the backward
// recomputes the rest: a cross-entropy saves its bfloat16 logits and row statistics rather
// than the float32 shifted logits, a GELU its input rather than its intermediates. (A tensor
// costs 2 * bytes + 1: of two cuts of equal bytes, the one saving fewer tensors.)
void remat(const Trace& joint, const std::unordered_map<const TensorProxy*, size_t>& definer,
           const std::vector<TensorRef>& inputs, std::unordered_set<const TensorProxy*>& saved) {
  std::unordered_map<const TensorProxy*, int> id;
  std::vector<const TensorProxy*> tensors;
  auto node = [&](const TensorProxy* t) {
    auto [it, fresh] = id.emplace(t, static_cast<int>(tensors.size()));
    if (fresh) tensors.push_back(t);
    return it->second;
  };
  for (const auto& t : inputs) node(t.get());
  std::vector<size_t> symbols;
  for (const auto& [t, i] : definer) symbols.push_back(i);
  std::sort(symbols.begin(), symbols.end());
  symbols.erase(std::unique(symbols.begin(), symbols.end()), symbols.end());
  for (size_t i : symbols) {
    for (const auto& t : joint.bsyms[i].inputs()) node(t.get());
    for (const auto& t : joint.bsyms[i].outputs()) node(t.get());
  }
  const int n = static_cast<int>(tensors.size());
  const int src = 2 * n, sink = 2 * n + 1;
  FlowGraph g(2 * n + 2);
  std::unordered_set<const TensorProxy*> is_input;
  for (const auto& t : inputs) is_input.insert(t.get());
  // A tensor the forward materializes anyway (a matmul's or a torch call's result, a view of
  // one, an operand of one) costs its bytes to keep; one that lives only inside a fused
  // kernel costs twice (keeping it adds a store), as in torch's partitioner: a float32
  // cross-entropy keeps the matmul's logits and the row maximum rather than the shifted logits.
  std::unordered_set<const TensorProxy*> materialized(is_input.begin(), is_input.end());
  auto fusible = [](const BoundSymbol& b) {
    const OpDef& d = b.def();
    return d.is_prim() && !has_effect(b) && d.has(tags::E | tags::M | tags::R | tags::D | tags::Scan) &&
           !d.has(tags::T);
  };
  for (size_t i : symbols) {
    const BoundSymbol& b = joint.bsyms[i];
    const bool view = b.def().has(tags::M) && !b.def().has(tags::E);
    const bool fuses = fusible(b);
    bool made = !fuses;
    if (view)
      for (const auto& x : b.inputs()) made = made || materialized.count(x.get());
    if (made)
      for (const auto& o : b.outputs()) materialized.insert(o.get());
    if (!fuses)
      for (const auto& x : b.inputs()) materialized.insert(x.get());
  }
  for (int k = 0; k < n; ++k) {
    const TensorProxy* t = tensors[k];
    const int64_t bytes = memory_bytes(*t) * (materialized.count(t) ? 1 : 2);
    g.edge(2 * k, 2 * k + 1, is_input.count(t) ? 0 : 2 * bytes + 1);
    // Inputs, and tensors of other programs (none in a joint trace), come from the source.
    if (!definer.count(t)) g.edge(src, 2 * k, FlowGraph::kInf);
  }
  // A forward value that a backward comparison reads is saved, never recomputed: amax's rule
  // compares its input with the saved maximum, maximum's its two inputs, and a value
  // recomputed by another kernel may differ in its last bit (a vectorized cos against a scalar
  // one): no element equal to the maximum, 0/0, NaN. (A detached max shift has no rule, so
  // softmax's input is still recomputed from the logits.)
  {
    std::unordered_set<size_t> fwd_syms(symbols.begin(), symbols.end());
    for (size_t i = 0; i + 1 < joint.bsyms.size(); ++i) {
      const BoundSymbol& b = joint.bsyms[i];
      const bool compares = b.op == OpId::prim_eq || b.op == OpId::prim_ne || b.op == OpId::prim_lt ||
                            b.op == OpId::prim_le || b.op == OpId::prim_gt || b.op == OpId::prim_ge;
      if (!compares || fwd_syms.count(i)) continue;
      for (const auto& x : b.inputs())
        if (definer.count(x.get())) g.edge(src, 2 * id.at(x.get()), FlowGraph::kInf);
    }
  }
  for (size_t i : symbols) {
    const BoundSymbol& b = joint.bsyms[i];
    const bool re = recomputable(b);
    for (const auto& o : b.outputs()) {
      if (!re) {
        g.edge(src, 2 * id.at(o.get()), FlowGraph::kInf);
        continue;
      }
      for (const auto& x : b.inputs()) g.edge(2 * id.at(x.get()) + 1, 2 * id.at(o.get()), FlowGraph::kInf);
    }
  }
  for (const TensorProxy* t : saved) g.edge(2 * node(t) + 1, sink, FlowGraph::kInf);
  g.max_flow(src, sink);
  const std::vector<bool> reached = g.source_side(src);
  saved.clear();
  for (int k = 0; k < n; ++k)
    if (reached[2 * k] && !reached[2 * k + 1]) saved.insert(tensors[k]);
}

} // namespace

namespace {
void written_storages(const BoundSymbol& b, std::unordered_set<int64_t>& out) {
  if (b.def().is_inplace() && !b.args.empty() && b.args[0].is_tensor())
    out.insert(b.args[0].tensor()->storage_id);
  for (const auto& s : b.subsymbols) written_storages(s, out);
}
// Ops whose backward reads none of their inputs' values (eager's autograd saves nothing of
// them), so a later write into an input is no concern of autograd's.
bool saves_no_input(const BoundSymbol& b) {
  switch (b.op) {
  case OpId::add: case OpId::sub: case OpId::neg: case OpId::sum: case OpId::clone:
  case OpId::cat: case OpId::stack: case OpId::detach: case OpId::add_: case OpId::sub_:
  case OpId::copy_:
    return true;
  default:
    return b.def().has(tags::V);
  }
}
// Ops whose backward does not read their result (derivatives.yaml), so a later write into it
// is no concern of autograd's: a normalization's output rewritten by an in-place ReLU, a
// residual added in place. (relu, exp, sigmoid, tanh, softmax, ... save theirs.)
bool saves_no_output(const BoundSymbol& b) {
  switch (b.op) {
  case OpId::add: case OpId::add_: case OpId::sub: case OpId::sub_: case OpId::mul:
  case OpId::mul_: case OpId::div: case OpId::div_: case OpId::neg: case OpId::sum:
  case OpId::mean: case OpId::clone: case OpId::contiguous: case OpId::to: case OpId::cat:
  case OpId::stack: case OpId::matmul: case OpId::linear: case OpId::bmm: case OpId::embedding:
  case OpId::batch_norm: case OpId::batch_norm_update: case OpId::layer_norm:
  case OpId::rms_norm: case OpId::dropout: case OpId::getitem: case OpId::where:
  case OpId::masked_fill: case OpId::masked_fill_: case OpId::gelu: case OpId::setitem_:
  case OpId::index_put: case OpId::index_put_: case OpId::detach: case OpId::copy_:
    return true;
  case OpId::torch_fallback: {
    // Convolutions and pools save their inputs (and a pool's indices), not their output.
    static const std::unordered_set<std::string> names = {
        "torch.nn.functional.conv1d", "torch.nn.functional.conv2d", "torch.nn.functional.conv3d",
        "torch.conv1d", "torch.conv2d", "torch.conv3d", "torch.nn.functional.max_pool2d",
        "torch.nn.functional.avg_pool2d", "torch.nn.functional.adaptive_avg_pool2d"};
    return b.args.size() > 1 && b.args[1].is_str() && names.count(b.args[1].as_str());
  }
  default:
    return b.def().has(tags::V);
  }
}
// In-place ops whose new value is computed from the old one (abs_, add_, relu_, ...): the
// written tensor still requires grad after the write when it did before, functionally too.
// (Comparisons, bitwise and logical ops make a float tensor 0/1 that eager keeps requiring
// grad; zero_, fill_ and copy_ replace it outright.)
bool keeps_grad(const BoundSymbol& b) {
  switch (b.op) {
  case OpId::eq_: case OpId::ne_: case OpId::lt_: case OpId::le_: case OpId::gt_:
  case OpId::ge_: case OpId::logical_and_: case OpId::logical_or_: case OpId::logical_xor_:
  case OpId::logical_not_: case OpId::bitwise_and_: case OpId::bitwise_or_:
  case OpId::bitwise_xor_: case OpId::bitwise_not_: case OpId::zero_: case OpId::fill_:
    return false;
  case OpId::copy_:
    // (Eager's copy_ gives the old value a zero gradient; the functional copy is the source
    // alone, and the old value's inputs would get None.)
    return false;
  default:
    return true;
  }
}
} // namespace

std::string recorded_write(const Trace& acquired) {
  std::unordered_set<int64_t> req, inputs;
  // Storages autograd may have saved: read by a recorded op that saves its inputs, or the
  // result of one that saves its output.
  std::unordered_set<int64_t> saved;
  // copy_ symbols that write a torch call's result back into its argument (below).
  std::unordered_set<const BoundSymbol*> writes_back_copies;
  for (const auto& i : acquired.inputs) {
    inputs.insert(i->storage_id);
    if (i->requires_grad && differentiable_dtype(i->dtype)) req.insert(i->storage_id);
  }
  // Views out of ops that return several (split, chunk, unbind) and views of them: eager
  // refuses to write them in place where autograd records.
  std::unordered_set<const TensorProxy*> multi_view;
  for (size_t k = 0; k < acquired.bsyms.size(); ++k) {
    const BoundSymbol& b = acquired.bsyms[k];
    if (b.def().has(tags::Ret)) continue;
    bool any = false;
    for (const auto& t : b.inputs()) any = any || req.count(t->storage_id);
    if (b.def().has(tags::V)) {
      const auto outs = b.outputs();
      const bool from_multi = !b.args.empty() && b.args[0].is_tensor() &&
                              multi_view.count(b.args[0].tensor().get());
      if (b.out.is_list() || from_multi)
        for (const auto& o : outs) multi_view.insert(o.get());
    }
    // A torch call that writes an argument (F.hardswish(x, inplace=True)) is recorded as the
    // call on a copy, then copy_ of its result into the argument: its own read of what it
    // writes is eager's in-place op's business, not a saved tensor overwritten later.
    std::unordered_set<int64_t> writes_back;
    if (b.op == OpId::torch_fallback) {
      std::unordered_set<const TensorProxy*> outs;
      for (const auto& o : b.outputs()) outs.insert(o.get());
      for (size_t j = k + 1; j < acquired.bsyms.size(); ++j) {
        const BoundSymbol& c = acquired.bsyms[j];
        if (c.op != OpId::copy_ || !c.args.at(1).is_tensor() || !outs.count(c.args[1].tensor().get()))
          break;
        writes_back.insert(c.args[0].tensor()->storage_id);
        writes_back_copies.insert(&c);
      }
    }
    if (writes_memory(b)) {
      std::unordered_set<int64_t> written;
      written_storages(b, written);
      // A write autograd would have to see: into a program input where a tensor that requires
      // grad is involved (the input's history changes), or replacing a value that requires
      // grad by one that does not. Writes into the program's own tensors are functional
      // values like any other (batch_norm's update of its running statistics is outside
      // autograd in eager: the statistics never require grad).
      bool recorded = false;
      if (b.op == OpId::batch_norm_update) {
        for (int64_t s : written) recorded = recorded || req.count(s);
      } else {
        for (int64_t s : written)
          recorded = recorded || (any && inputs.count(s)) ||
                     (req.count(s) && !writes_back_copies.count(&b) && !keeps_grad(b));
        recorded = recorded || (any && b.def().is_inplace() && b.args.at(0).is_tensor() &&
                                multi_view.count(b.args[0].tensor().get()));
      }
      if (recorded)
        return "keraunos: " + b.def().qualified_name() +
               " writes in place where a tensor that requires grad is involved" + where(b) +
               "; the program runs as recorded through torch, so autograd sees the write as in "
               "eager";
      for (int64_t s : written)
        if (saved.count(s))
          return "keraunos: " + b.def().qualified_name() +
                 " writes in place into a tensor that an op autograd records may have saved" +
                 where(b) +
                 "; the program runs as recorded through torch, so that autograd checks the "
                 "write as in eager (its backward raises if it saved that tensor)";
    }
    if (!any) continue;
    // An in-place op's own target: eager saves a copy of the old value where its formula
    // needs it (mul_), or the result (relu_: saves_no_output says which), unless another
    // argument shares its memory (x.mul_(x) saves x itself).
    if (b.def().is_inplace() && !b.args.empty() && b.args[0].is_tensor()) {
      const int64_t target = b.args[0].tensor()->storage_id;
      int64_t uses = 0;
      for (const auto& t : b.inputs()) uses += t->storage_id == target;
      if (uses == 1) writes_back.insert(target);
    }
    if (!saves_no_input(b))
      for (const auto& t : b.inputs())
        if (!writes_back.count(t->storage_id)) saved.insert(t->storage_id);
    if (b.op == OpId::detach) continue;
    for (const auto& o : b.outputs())
      if (differentiable_dtype(o->dtype)) {
        req.insert(o->storage_id);
        if (!saves_no_output(b)) saved.insert(o->storage_id);
      }
    // An in-place op's result is its target (exp_ saves it, as exp saves its output).
    if (b.def().is_inplace() && !b.args.empty() && b.args[0].is_tensor() &&
        differentiable_dtype(b.args[0].tensor()->dtype)) {
      req.insert(b.args[0].tensor()->storage_id);
      if (!saves_no_output(b)) saved.insert(b.args[0].tensor()->storage_id);
    }
  }
  return {};
}

GradSplit autodiff(const Trace& trace, const Trace& acquired, const PassContext& ctx) {
  const std::string write = recorded_write(acquired);
  KR_CHECK(write.empty(), NotImplemented, write);
  check_supported(trace);
  const Trace flat = flatten_to_prims(trace);
  const std::vector<BoundSymbol> fwd(flat.bsyms.begin(), flat.bsyms.end() - 1);

  // Which tensors require grad.
  std::unordered_set<const TensorProxy*> req;
  for (const auto& i : flat.inputs)
    if (i->requires_grad && differentiable_dtype(i->dtype)) req.insert(i.get());
  for (const auto& b : fwd) {
    bool any = false;
    for (const auto& t : b.inputs()) any = any || req.count(t.get());
    if (!any) continue;
    const OpDef& d = b.def();
    // (A write into an input outside autograd: batch_norm's running statistics, see
    // check_supported.)
    if (b.op == OpId::detach || b.op == OpId::prim_copy_) continue;
    if (!d.is_prim() && d.has(tags::V)) { // a view: view_grad
      for (const auto& o : b.outputs())
        if (differentiable_dtype(o->dtype)) req.insert(o.get());
      continue;
    }
    if (via_torch(b)) {
      KR_CHECK(b.op != OpId::scaled_dot_product_attention || b.args.at(4).as_double() == 0.0,
               NotImplemented, "keraunos: scaled_dot_product_attention with dropout_p > 0",
               where(b), " has no backward here yet (its backward would draw other numbers); "
               "programs that autograd records and that use it run through torch");
      for (const auto& o : b.outputs())
        if (differentiable_dtype(o->dtype)) req.insert(o.get());
      continue;
    }
    KR_CHECK(d.is_prim(), NotImplemented, "keraunos: ", d.qualified_name(),
             " has no backward rule yet", where(b),
             "; programs that autograd records and that use it run through torch");
    const GradEntry& e = grad_entry(b.op);
    KR_CHECK(e.kind != GradKind::Refused, NotImplemented, "keraunos: ", d.qualified_name(), " (",
             e.why ? e.why : "no rule", ") has no backward rule yet", where(b),
             "; programs that autograd records and that use it run through torch");
    if (e.kind == GradKind::NoGrad) continue;
    for (const auto& o : b.outputs())
      if (differentiable_dtype(o->dtype)) req.insert(o.get());
  }

  GradSplit split;
  split.leaves = classify_leaves(trace);
  // What the forward returns: alias leaves are made by the caller.
  Arg fwd_output = flat.output();
  std::vector<TensorRef> outs;
  {
    Arg::List* list = fwd_output.is_list() ? &std::get<Arg::List>(fwd_output.v) : nullptr;
    for (size_t i = 0; i < split.leaves.size(); ++i) {
      Arg& a = list ? (*list)[i] : fwd_output;
      if (split.leaves[i].kind == GradSplit::Leaf::Alias) a = Arg();
      if (a.is_tensor()) outs.push_back(a.tensor());
    }
  }

  Builder bb(ctx.builder);
  bb.reserve_names(flat);
  bb.also_known(&fwd);
  // Each tensor's gradient contributions, summed (in arrival order, as eager's autograd sums
  // them) when the gradient is read: the adds then come right before the rule that reads the
  // sum and fuse with it (three projections' input gradients and RMSNorm's backward: one
  // kernel), rather than each after its matmul (see accumulate).
  std::unordered_map<const TensorProxy*, std::vector<TensorRef>> grads;
  // a + b for a gradient of `primal`, with an operand laid out like the primal first: the sum
  // takes the first operand's layout (TensorIterator's rule), so the gradient keeps the
  // primal's (a transposed q's gradient stays transposed and its reshape a view). Two operands
  // commute exactly, so the values are the arrival order's.
  auto add_grads = [&](const TensorProxy* primal, const TensorRef& a, const TensorRef& b) {
    const bool swap = a->strides != primal->strides && b->strides == primal->strides;
    return bb.call(OpId::prim_add, {Arg(swap ? b : a), Arg(swap ? a : b)}).tensor();
  };
  auto grad_of = [&](const TensorProxy* t) -> TensorRef {
    auto it = grads.find(t);
    if (it == grads.end()) return nullptr;
    auto& parts = it->second;
    while (parts.size() > 1) {
      TensorRef sum = add_grads(t, parts[0], parts[1]);
      parts.erase(parts.begin());
      parts[0] = sum;
    }
    return parts[0];
  };
  std::vector<TensorRef> grad_inputs;
  size_t k = 0;
  for (auto& leaf : split.leaves) {
    if (leaf.kind != GradSplit::Leaf::Tensor) continue;
    const TensorRef& o = outs.at(k++);
    leaf.differentiable = req.count(o.get()) > 0;
    if (!leaf.differentiable) continue;
    auto g = bb.new_tensor(o->dtype, o->device, o->shape);
    grad_inputs.push_back(g);
    grads[o.get()] = {g};
  }
  auto accumulate = [&](const TensorRef& t, const TensorRef& g) {
    KR_INTERNAL(g->shape == t->shape && g->dtype == t->dtype, "gradient of ", t->name,
                " has the wrong shape or dtype");
    auto& parts = grads[t.get()];
    // Two contributions a kernel computes are added at once (into the kernel that makes the
    // second); one from a matmul or a torch call waits for the read. Either way the sum runs
    // in arrival order.
    auto in_kernel = [&](const TensorRef& x) {
      const BoundSymbol* p = bb.producer(x);
      return p && p->def().has(tags::E | tags::M | tags::R | tags::D) && !p->def().has(tags::T);
    };
    if (parts.size() == 1 && in_kernel(parts[0]) && in_kernel(g))
      parts[0] = add_grads(t.get(), parts[0], g);
    else
      parts.push_back(g);
  };

  std::vector<std::pair<size_t, BoundSymbol>> recorded; // torch calls run under autograd
  for (size_t i = fwd.size(); i-- > 0;) {
    const BoundSymbol& b = fwd[i];
    if (b.op == OpId::detach) continue;
    if (!b.def().is_prim() && b.def().has(tags::V)) {
      const TensorRef& x = b.args.at(0).tensor();
      if (!req.count(x.get())) continue;
      for (const auto& o : b.outputs()) {
        if (TensorRef g = grad_of(o.get())) accumulate(x, view_grad(bb, b, o, g));
      }
      continue;
    }
    if (via_torch(b)) {
      std::vector<TensorRef> ins = b.inputs();
      std::vector<int64_t> wrt;
      const Shape no_grad =
          b.op == OpId::torch_fallback && b.args.size() > 4 ? b.args[4].int_list() : Shape{};
      for (size_t k = 0; k < ins.size(); ++k)
        if (req.count(ins[k].get()) &&
            std::find(no_grad.begin(), no_grad.end(), static_cast<int64_t>(k)) == no_grad.end())
          wrt.push_back(static_cast<int64_t>(k));
      std::vector<TensorRef> gl;
      bool any = false;
      for (const auto& o : b.outputs()) {
        if (!differentiable_dtype(o->dtype)) continue;
        TensorRef g = grad_of(o.get());
        any = any || g;
        gl.push_back(g ? g
                       : bb.call(OpId::prim_full, {Arg::int_list(o->shape), Arg(0.0),
                                                                   Arg(o->dtype), Arg(o->device)})
                                             .tensor());
      }
      if (!any || wrt.empty()) continue;
      // The forward runs the op under autograd (torch_vjp_record) and the backward hands its
      // graph to torch.autograd.grad: the op's forward runs once, as in eager.
      const std::string name(b.def().id_name);
      Arg::List rec_out;
      std::vector<TensorRef> graph, leaves;
      for (const auto& o : b.outputs()) rec_out.push_back(Arg(o));
      for (const auto& o : b.outputs())
        if (differentiable_dtype(o->dtype)) {
          graph.push_back(bb.new_view(o, o->shape, o->strides, o->storage_offset));
          rec_out.push_back(Arg(graph.back()));
        }
      for (int64_t k : wrt) {
        const TensorRef& x = ins[k];
        leaves.push_back(bb.new_view(x, x->shape, x->strides, x->storage_offset));
        rec_out.push_back(Arg(leaves.back()));
      }
      BoundSymbol rec;
      rec.op = OpId::torch_vjp_record;
      rec.args = {Arg(name), Arg(b.args), Arg::int_list(wrt)};
      rec.out = Arg(std::move(rec_out));
      rec.loc = b.loc;
      recorded.emplace_back(i, std::move(rec));
      // The op's arguments with the leaves in place of the tensors at `wrt`.
      size_t pos = 0, next = 0;
      std::function<Arg(const Arg&)> with_leaves = [&](const Arg& a) -> Arg {
        if (a.is_tensor()) {
          const bool leaf = next < wrt.size() && wrt[next] == static_cast<int64_t>(pos++);
          return leaf ? Arg(leaves[next++]) : a;
        }
        if (!a.is_list()) return a;
        Arg::List l;
        for (const auto& e : a.list()) l.push_back(with_leaves(e));
        return Arg(std::move(l));
      };
      Arg r = bb.call(OpId::torch_vjp, {Arg(name), with_leaves(Arg(b.args)), Arg::tensor_list(graph),
                                        Arg::tensor_list(gl), Arg::int_list(wrt)});
      const auto gs = r.tensor_list();
      for (size_t k = 0; k < wrt.size(); ++k) accumulate(ins[wrt[k]], gs[k]);
      continue;
    }
    if (!b.out.is_tensor()) continue;
    if (!grads.count(b.out.tensor().get()) || b.op == OpId::detach) continue;
    const GradEntry& e = grad_entry(b.op);
    if (e.kind != GradKind::Rule) continue;
    std::vector<bool> needs;
    std::vector<std::vector<bool>> list_needs;
    bool any = false;
    for (const auto& a : b.args) {
      needs.push_back(a.is_tensor() && req.count(a.tensor().get()));
      std::vector<bool> ln;
      if (a.is_list())
        for (const auto& el : a.list()) ln.push_back(el.is_tensor() && req.count(el.tensor().get()));
      any = any || needs.back() || std::count(ln.begin(), ln.end(), true);
      list_needs.push_back(std::move(ln));
    }
    if (!any) continue;
    const TensorRef g = grad_of(b.out.tensor().get());
    Arg::List res = e.fn(bb, GradRequest{b, g, needs, list_needs});
    KR_INTERNAL(res.size() == b.args.size(), "backward rule of ", b.def().qualified_name(),
                " returned ", res.size(), " gradients for ", b.args.size(), " arguments");
    for (size_t k = 0; k < res.size(); ++k) {
      if (needs[k] && res[k].is_tensor()) accumulate(b.args[k].tensor(), res[k].tensor());
      if (!list_needs[k].empty() && res[k].is_list()) {
        const auto& el = b.args[k].list();
        const auto& gl = res[k].list();
        for (size_t j = 0; j < el.size(); ++j)
          if (list_needs[k][j] && gl[j].is_tensor()) accumulate(el[j].tensor(), gl[j].tensor());
      }
    }
  }

  Arg::List input_grads;
  for (const auto& in : flat.inputs) {
    TensorRef g = req.count(in.get()) ? grad_of(in.get()) : nullptr;
    input_grads.push_back(g ? Arg(g) : Arg());
  }
  bb.set_return(Arg());
  Trace bwd_syms = bb.finish();
  bwd_syms.bsyms.pop_back();

  // The joint trace, cleaned as one program.
  Trace joint;
  joint.inputs = flat.inputs;
  joint.inputs.insert(joint.inputs.end(), grad_inputs.begin(), grad_inputs.end());
  joint.bsyms = fwd;
  for (auto& [i, rec] : recorded) joint.bsyms[i] = std::move(rec);
  for (auto& b : bwd_syms.bsyms) joint.bsyms.push_back(std::move(b));
  BoundSymbol ret;
  ret.op = OpId::return_;
  ret.args = {Arg(Arg::List{fwd_output, Arg(std::move(input_grads))})};
  joint.bsyms.push_back(std::move(ret));
  joint = dce(cse(joint, ctx).trace, ctx).trace;
  joint.stage = "autodiff";

  // The split: the forward is what the outputs need, and every effect.
  const auto& jret = joint.return_symbol().args.at(0).list();
  std::unordered_set<const TensorProxy*> need;
  {
    std::vector<TensorRef> o;
    jret.at(0).collect_tensors(o);
    for (const auto& t : o) need.insert(t.get());
  }
  std::vector<bool> in_fwd(joint.bsyms.size() - 1, false);
  for (size_t i = in_fwd.size(); i-- > 0;) {
    const BoundSymbol& b = joint.bsyms[i];
    bool needed = has_effect(b);
    for (const auto& t : b.outputs()) needed = needed || need.count(t.get());
    if (!needed) continue;
    in_fwd[i] = true;
    for (const auto& t : b.inputs()) need.insert(t.get());
  }
  // What the backward reads from the forward: saved, unless recomputing it from other saved
  // values saves at least as many bytes (rematerialize).
  std::unordered_map<const TensorProxy*, size_t> definer;
  for (size_t i = 0; i < in_fwd.size(); ++i)
    if (in_fwd[i])
      for (const auto& t : joint.bsyms[i].outputs()) definer[t.get()] = i;
  std::unordered_set<const TensorProxy*> is_input;
  for (const auto& t : flat.inputs) is_input.insert(t.get());
  // Every tensor the backward's own symbols and its returned gradients read.
  auto backward_reads = [&](const std::function<void(const TensorRef&)>& visit) {
    for (size_t i = 0; i < in_fwd.size(); ++i)
      if (!in_fwd[i])
        for (const auto& t : joint.bsyms[i].inputs()) visit(t);
    std::vector<TensorRef> g;
    jret.at(1).collect_tensors(g);
    for (const auto& t : g) visit(t);
  };
  std::unordered_set<const TensorProxy*> saved;
  backward_reads([&](const TensorRef& t) {
    if (definer.count(t.get()) || is_input.count(t.get())) saved.insert(t.get());
  });
  remat(joint, definer, flat.inputs, saved);

  // The backward: its own symbols, and the forward's that recompute what it reads unsaved.
  std::vector<bool> in_bwd(in_fwd.size(), false);
  std::vector<size_t> stack;
  for (size_t i = 0; i < in_fwd.size(); ++i)
    if (!in_fwd[i]) in_bwd[i] = true;
  std::unordered_set<const TensorProxy*> used; // the cut's saved tensors the backward reads
  auto reach = [&](const TensorRef& t) {
    if (saved.count(t.get())) {
      used.insert(t.get());
      return;
    }
    auto it = definer.find(t.get());
    if (it != definer.end() && !in_bwd[it->second]) {
      in_bwd[it->second] = true;
      stack.push_back(it->second);
    }
  };
  backward_reads(reach);
  while (!stack.empty()) {
    size_t i = stack.back();
    stack.pop_back();
    KR_INTERNAL(!has_effect(joint.bsyms[i]), "an effect recomputed in the backward");
    for (const auto& t : joint.bsyms[i].inputs()) reach(t);
  }
  // (A program input costs nothing to keep, so the cut counts every one saved; only those
  // the backward reads are.)
  saved = std::move(used);
  for (const TensorProxy* w : written_inputs(flat))
    KR_CHECK(!saved.count(w), NotImplemented, "keraunos: the backward reads program input ",
             w->name, " after the forward writes it; such programs run through torch");
  // Saved tensors in the order the forward defines them (inputs first).
  std::vector<TensorRef> saved_list;
  for (const auto& t : flat.inputs)
    if (saved.count(t.get())) saved_list.push_back(t);
  for (size_t i = 0; i < in_fwd.size(); ++i)
    if (in_fwd[i])
      for (const auto& t : joint.bsyms[i].outputs())
        if (saved.count(t.get())) saved_list.push_back(t);
  split.num_saved = saved_list.size();
  {
    std::unordered_set<int64_t> reachable; // storages the caller or the user holds
    for (const auto& t : flat.inputs) reachable.insert(t->storage_id);
    std::vector<TensorRef> outs;
    jret.at(0).collect_tensors(outs);
    for (const auto& t : outs) reachable.insert(t->storage_id);
    split.donatable.assign(saved_list.size() + grad_inputs.size(), false);
    for (size_t k = 0; k < saved_list.size(); ++k)
      split.donatable[k] = !is_input.count(saved_list[k].get()) && !reachable.count(saved_list[k]->storage_id);
  }

  split.forward.inputs = flat.inputs;
  split.backward.inputs = saved_list;
  split.backward.inputs.insert(split.backward.inputs.end(), grad_inputs.begin(), grad_inputs.end());
  for (size_t i = 0; i < in_fwd.size(); ++i)
    if (in_fwd[i]) split.forward.bsyms.push_back(joint.bsyms[i]);
  // The backward in joint order, except that a recomputed forward symbol comes right before
  // its first reader: recomputation then lands in its readers' fusion region instead of
  // materializing its results across a matmul.
  {
    std::vector<bool> emitted(in_fwd.size(), false);
    std::function<void(size_t)> emit = [&](size_t i) {
      if (emitted[i]) return;
      emitted[i] = true;
      for (const auto& t : joint.bsyms[i].inputs()) {
        auto it = definer.find(t.get());
        if (it != definer.end() && in_bwd[it->second] && in_fwd[it->second]) emit(it->second);
      }
      split.backward.bsyms.push_back(joint.bsyms[i]);
    };
    for (size_t i = 0; i < in_fwd.size(); ++i)
      if (in_bwd[i] && !in_fwd[i]) emit(i);
    for (size_t i = 0; i < in_fwd.size(); ++i)
      if (in_bwd[i]) emit(i);
  }
  BoundSymbol fret;
  fret.op = OpId::return_;
  fret.args = {Arg(Arg::List{jret.at(0), Arg::tensor_list(saved_list)})};
  split.forward.bsyms.push_back(std::move(fret));
  {
    // Detaches mean nothing inside the forward program (autograd sees only the Function
    // around it), and one between two regions (softmax's detached max shift) would keep the
    // max and the sum of exponentials in separate kernels: each becomes its input, except
    // where it is an output the user gets.
    std::unordered_set<const TensorProxy*> user;
    const Arg& outs = jret.at(0);
    for (const Arg& a : outs.is_list() ? outs.list() : Arg::List{outs})
      if (a.is_tensor()) user.insert(a.tensor().get());
    ProxyMap m;
    std::vector<BoundSymbol> kept;
    for (auto& b : split.forward.bsyms) {
      if (b.op == OpId::detach && b.args.at(0).is_tensor() && b.out.is_tensor() &&
          !user.count(b.out.tensor().get())) {
        m[b.out.tensor().get()] = substitute(b.args[0], m).tensor();
        continue;
      }
      kept.push_back(m.empty() ? std::move(b) : substitute(b, m));
    }
    split.forward.bsyms = std::move(kept);
  }
  BoundSymbol bret;
  bret.op = OpId::return_;
  bret.args = {jret.at(1)};
  split.backward.bsyms.push_back(std::move(bret));
  // The backward rules' chains of remaps (a weight permuted in the forward and back for the
  // input's gradient) fold away.
  split.forward = dce(fold_remaps(split.forward, ctx).trace, ctx).trace;
  split.backward = dce(fold_remaps(split.backward, ctx).trace, ctx).trace;
  split.forward.stage = "autodiff forward";
  split.backward.stage = "autodiff backward";
  split.joint = std::move(joint);
  return split;
}

} // namespace keraunos

// Grouped-query attention without the repeated heads: HF's repeat_kv (and every model that
// copies it) repeats each key/value head n_rep times before SDPA,
//
//   k = k[:, :, None].expand(b, nkv, n_rep, s, d).reshape(b, nkv * n_rep, s, d)
//
// which costs a copy of k and v in the forward (and keeps them for the backward) and a sum
// over the copies in the backward. SDPA computes the same attention from the kv heads with
// enable_gqa=True (its kernels index kv head h // n_rep, which is what the reshape of the
// expanded tensor holds at head h), so the symbol takes the unrepeated tensors and the
// repeats, unread, are dropped by DCE.
//
// Needs: a trace of language symbols. Guarantees: the same values (the repeat is matched by
// shapes and strides: a reshape merging a broadcast dim of size n_rep into the head dim, of a
// tensor that is the kv tensor with that unit dim inserted). Only without attn_mask (SDPA's
// fused kernels take enable_gqa without a mask; with one it may pick its math backend).
#include "keraunos/passes/grouped_query_attention.h"

#include <unordered_map>

namespace keraunos {

namespace {

using Producers = std::unordered_map<const TensorProxy*, const BoundSymbol*>;

bool is_reshape(const BoundSymbol& b) {
  return b.op == OpId::reshape || b.op == OpId::view || b.op == OpId::flatten;
}

// Shape with dim `j` removed.
Shape without(const Shape& s, size_t j) {
  Shape r = s;
  r.erase(r.begin() + static_cast<std::ptrdiff_t>(j));
  return r;
}

// The kv tensor `k` repeats (k = reshape(expand(unsqueeze(k0))) merging n_rep copies into the
// head dim, ndim - 3), and n_rep; {nullptr, 0} otherwise.
std::pair<TensorRef, int64_t> unrepeated(const TensorRef& k, const Producers& made_by) {
  if (k->ndim() < 3) return {nullptr, 0};
  const size_t j = static_cast<size_t>(k->ndim() - 3);
  auto p1 = made_by.find(k.get());
  if (p1 == made_by.end() || !is_reshape(*p1->second)) return {nullptr, 0};
  const TensorRef& e = p1->second->args.at(0).tensor();
  if (e->ndim() != k->ndim() + 1) return {nullptr, 0};
  const int64_t n_rep = e->shape[j + 1];
  Shape merged = without(e->shape, j + 1);
  merged[j] *= n_rep;
  if (n_rep < 2 || e->strides[j + 1] != 0 || merged != k->shape) return {nullptr, 0};
  // e = expand(u), u = k0 with a unit dim at j + 1.
  auto p2 = made_by.find(e.get());
  if (p2 == made_by.end() || p2->second->op != OpId::expand) return {nullptr, 0};
  const TensorRef& u = p2->second->args.at(0).tensor();
  if (u->ndim() != e->ndim() || u->shape[j + 1] != 1 || without(u->shape, j + 1) != without(e->shape, j + 1))
    return {nullptr, 0};
  auto p3 = made_by.find(u.get());
  if (p3 == made_by.end()) return {nullptr, 0};
  const BoundSymbol& s3 = *p3->second;
  if (!(s3.op == OpId::unsqueeze || s3.op == OpId::getitem || is_reshape(s3))) return {nullptr, 0};
  const TensorRef& k0 = s3.args.at(0).tensor();
  if (k0->shape != without(u->shape, j + 1) || k0->dtype != k->dtype) return {nullptr, 0};
  return {k0, n_rep};
}

} // namespace

PassResult grouped_query_attention(const Trace& trace, const PassContext&) {
  PassResult r;
  r.trace = trace;
  Producers made_by;
  for (auto& b : r.trace.bsyms) {
    if (b.op == OpId::scaled_dot_product_attention && b.args.size() == 8 && b.args[3].is_none() &&
        !b.args[7].as_bool()) {
      auto [k0, nk] = unrepeated(b.args[1].tensor(), made_by);
      auto [v0, nv] = unrepeated(b.args[2].tensor(), made_by);
      if (k0 && v0 && nk == nv) {
        b.args[1] = Arg(k0);
        b.args[2] = Arg(v0);
        b.args[7] = Arg(true);
        r.changed = true;
      }
    }
    for (const auto& o : b.outputs()) made_by[o.get()] = &b;
  }
  return r;
}

} // namespace keraunos

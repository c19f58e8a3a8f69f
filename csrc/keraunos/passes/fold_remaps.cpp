// Folds chains of index remaps: a permute of a permute is one permute, and none where the two
// cancel; a reshape of a reshape is one reshape, and none where it gives back its source's
// shape and layout. The backward rules leave such chains (a linear's weight is permuted in the
// forward and permuted back for the input's gradient); each link is a Python call in a torch
// program.
//
// Needs: a functional trace (prims are index remaps, not views, at this level). Guarantees:
// every value is the one it was; a returned tensor is never replaced by another (outputs stay
// distinct tensors). The links left unread are dropped by DCE after it.
//
//   t1 = prims.permute(t0, [1, 0])
//   t2 = prims.permute(t1, [1, 0])     ->   t3 = prims.matmul(t4, t0)
//   t3 = prims.matmul(t4, t2)
#include "keraunos/passes/fold_remaps.h"

#include <unordered_map>
#include <unordered_set>

namespace keraunos {

PassResult fold_remaps(const Trace& trace, const PassContext&) {
  std::vector<TensorRef> returned;
  trace.output().collect_tensors(returned);
  std::unordered_set<const TensorProxy*> kept;
  for (const auto& t : returned) kept.insert(t.get());
  std::unordered_map<const TensorProxy*, const BoundSymbol*> made_by;
  ProxyMap replace;
  PassResult r;
  r.trace.inputs = trace.inputs;
  r.trace.bsyms.reserve(trace.bsyms.size());
  for (const auto& orig : trace.bsyms) {
    BoundSymbol b = replace.empty() ? orig : substitute(orig, replace);
    const bool permute = b.op == OpId::prim_permute, reshape = b.op == OpId::prim_reshape;
    if (permute || reshape) {
      auto it = made_by.find(b.args.at(0).tensor().get());
      if (it != made_by.end() && it->second->op == b.op) {
        const BoundSymbol& inner = *it->second;
        Arg::List args = b.args;
        args[0] = inner.args.at(0);
        if (permute) {
          // out.dim(k) = mid.dim(p2[k]) = src.dim(p1[p2[k]])
          const Shape p1 = inner.args.at(1).int_list(), p2 = b.args.at(1).int_list();
          Shape q(p2.size());
          for (size_t k = 0; k < p2.size(); ++k) q[k] = p1.at(static_cast<size_t>(p2[k]));
          args[1] = Arg::int_list(q);
        }
        b.args = std::move(args);
        r.changed = true;
      }
      const TensorRef& src = b.args.at(0).tensor();
      const TensorRef& out = b.out.tensor();
      bool identity = out->shape == src->shape && out->strides == src->strides &&
                      out->storage_offset == src->storage_offset && out->dtype == src->dtype;
      if (permute) {
        const Shape p = b.args.at(1).int_list();
        for (size_t k = 0; k < p.size(); ++k) identity = identity && p[k] == static_cast<int64_t>(k);
      }
      if (identity && !kept.count(out.get())) {
        replace[out.get()] = src;
        r.changed = true;
        continue;
      }
    }
    r.trace.bsyms.push_back(std::move(b));
    for (const auto& o : r.trace.bsyms.back().outputs()) made_by[o.get()] = &r.trace.bsyms.back();
  }
  return r;
}

} // namespace keraunos

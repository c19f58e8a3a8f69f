// Dead code elimination: drops symbols whose outputs nothing live reads.
//
// Needs: a well-formed trace. Guarantees: the same observable effects; symbols with effects
// (in-place writes, random draws, which advance the generator as in eager, and return) stay.
//
//   t1 = ltorch.sin(t0)          t2 = ltorch.cos(t0)
//   t2 = ltorch.cos(t0)    ->    return t2
//   return t2
#include "keraunos/passes/dce.h"

#include <unordered_set>

namespace keraunos {

PassResult dce(const Trace& trace, const PassContext&) {
  std::unordered_set<const TensorProxy*> live;
  std::vector<bool> keep(trace.bsyms.size(), false);
  // Storages written in place stay live through every alias: a write to a view of x is read
  // through x.
  std::unordered_set<int64_t> live_storage;
  for (size_t i = trace.bsyms.size(); i-- > 0;) {
    const BoundSymbol& b = trace.bsyms[i];
    bool needed = has_effect(b);
    for (const auto& t : b.outputs())
      needed = needed || live.count(t.get()) || live_storage.count(t->storage_id);
    if (!needed) continue;
    keep[i] = true;
    for (const auto& t : b.inputs()) {
      live.insert(t.get());
      if (b.def().is_inplace()) live_storage.insert(t->storage_id);
    }
  }
  PassResult r;
  r.trace.inputs = trace.inputs;
  for (size_t i = 0; i < trace.bsyms.size(); ++i)
    if (keep[i]) r.trace.bsyms.push_back(trace.bsyms[i]);
  r.changed = r.trace.bsyms.size() != trace.bsyms.size();
  return r;
}

} // namespace keraunos

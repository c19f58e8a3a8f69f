// Common subexpression elimination: a pure symbol identical to an earlier one (same op, same
// arguments, reading the same contents) is replaced by the earlier one's outputs.
//
// Needs: a well-formed trace. Guarantees: no symbol with an effect is merged (random draws
// are never merged); views are never merged (eager returns distinct tensors); a tensor whose
// storage was written in between is a different value (the key carries storage versions).
//
//   t1 = ltorch.sin(t0)          t1 = ltorch.sin(t0)
//   t2 = ltorch.sin(t0)    ->    t3 = ltorch.add(t1, t1)
//   t3 = ltorch.add(t1, t2)      return t3
//   return t3
//
// A symbol whose outputs are returned (or viewed by a returned tensor) is never replaced:
// eager returns distinct tensors.
#include "keraunos/passes/cse.h"

#include <map>
#include <unordered_map>
#include <unordered_set>

namespace keraunos {

namespace {
void key_of(const Arg& a, const std::unordered_map<int64_t, int64_t>& version, std::string& k) {
  if (a.is_tensor()) {
    const auto& t = a.tensor();
    auto it = version.find(t->storage_id);
    k += "%" + t->name + "@" + std::to_string(it == version.end() ? 0 : it->second);
  } else if (a.is_list()) {
    k += "[";
    for (const auto& e : a.list()) {
      key_of(e, version, k);
      k += ",";
    }
    k += "]";
  } else {
    // Type-tagged so 1 and 1.0 and True stay distinct.
    k += std::to_string(a.v.index()) + ":" + a.str();
  }
}
} // namespace

PassResult cse(const Trace& trace, const PassContext&) {
  std::unordered_map<int64_t, int64_t> version; // storage id -> writes so far
  std::unordered_map<std::string, std::vector<TensorRef>> seen;
  ProxyMap replace;
  // Outputs stay distinct tensors, as in eager: a symbol whose result is returned, or is the
  // storage a returned view looks into, is kept.
  std::vector<TensorRef> returned;
  trace.output().collect_tensors(returned);
  std::unordered_set<int64_t> returned_storage;
  for (const auto& t : returned) returned_storage.insert(t->storage_id);
  PassResult r;
  r.trace.inputs = trace.inputs;
  for (const auto& orig : trace.bsyms) {
    BoundSymbol b = replace.empty() ? orig : substitute(orig, replace);
    const OpDef& d = b.def();
    if (d.is_inplace()) {
      ++version[b.args.at(0).tensor()->storage_id];
    } else if (!has_effect(b) && !d.has(tags::V) && !b.outputs().empty()) {
      std::string k = std::string(d.id_name) + "(";
      for (const auto& a : b.args) {
        key_of(a, version, k);
        k += ";";
      }
      auto mine = b.outputs();
      bool keep = false;
      for (const auto& t : mine) keep |= returned_storage.count(t->storage_id) > 0;
      auto [it, fresh] = seen.emplace(std::move(k), mine);
      if (!fresh && !keep) {
        for (size_t i = 0; i < mine.size(); ++i) replace[mine[i].get()] = it->second[i];
        r.changed = true;
        continue;
      }
    }
    r.trace.bsyms.push_back(std::move(b));
  }
  return r;
}

} // namespace keraunos

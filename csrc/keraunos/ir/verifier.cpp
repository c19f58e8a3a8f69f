#include "keraunos/ir/verifier.h"

#include "keraunos/ir/error.h"

#include <unordered_map>
#include <unordered_set>

namespace keraunos {

namespace {

bool defined_by_subsymbols(const BoundSymbol& b, const TensorProxy* t) {
  for (const auto& s : b.subsymbols) {
    for (const auto& o : s.outputs())
      if (o.get() == t) return true;
    if (defined_by_subsymbols(s, t)) return true;
  }
  return false;
}

std::string check_same(const TensorRef& recorded, const TensorRef& inferred) {
  if (recorded->shape != inferred->shape || recorded->dtype != inferred->dtype)
    return "recorded " + recorded->type_str() + " but the meta functions infer " +
           inferred->type_str();
  return "";
}

} // namespace

std::string verify(const Trace& trace, const VerifyOptions& opts) {
  std::unordered_set<const TensorProxy*> defined;
  std::unordered_set<std::string> names;
  auto define = [&](const TensorRef& t, const std::string& where) -> std::string {
    if (!names.insert(t->name).second) return "proxy " + t->name + " is defined twice (" + where + ")";
    defined.insert(t.get());
    return "";
  };
  for (const auto& t : trace.inputs)
    if (auto e = define(t, "input"); !e.empty()) return e;
  if (trace.bsyms.empty() || !trace.bsyms.back().def().has(tags::Ret))
    return "the trace does not end with return";
  bool epilogue = false;
  for (size_t i = 0; i < trace.bsyms.size(); ++i) {
    const BoundSymbol& b = trace.bsyms[i];
    const OpDef& d = b.def();
    std::string where = "line " + std::to_string(i) + ": " + bsym_line(b);
    if (d.has(tags::Ret) && i + 1 != trace.bsyms.size()) return "return is not last (" + where + ")";
    for (const auto& t : b.inputs())
      if (!defined.count(t.get())) return "proxy " + t->name + " is used before it is defined (" + where + ")";
    if (opts.functional) {
      if (d.is_inplace() && d.id != OpId::prim_copy_)
        return "in-place symbol after functionalization (" + where + ")";
      if (d.id == OpId::prim_copy_) {
        epilogue = true;
        bool is_input = false;
        for (const auto& t : trace.inputs) is_input |= t->storage_id == b.args[0].tensor()->storage_id;
        if (!is_input) return "copy_ into a non-input after functionalization (" + where + ")";
      } else if (epilogue && !d.has(tags::Ret)) {
        return "a symbol follows the epilogue copies (" + where + ")";
      }
    }
    if (d.has(tags::F)) {
      // A region: its members are re-inferred one by one; names they define are internal.
      for (const auto& m : b.subsymbols) {
        for (const auto& t : m.inputs())
          if (!defined.count(t.get()))
            return "proxy " + t->name + " is used before it is defined (in region: " + bsym_line(m) + ")";
        for (const auto& t : m.outputs()) {
          if (!names.insert(t->name).second) return "proxy " + t->name + " is defined twice (" + where + ")";
          defined.insert(t.get());
        }
        if (opts.reinfer) {
          Arg inferred = opts.reinfer(m);
          std::vector<TensorRef> re;
          if (!m.def().is_inplace()) inferred.collect_tensors(re);
          auto outs = m.outputs();
          if (re.size() != outs.size()) return "region member re-inferred differently: " + bsym_line(m);
          for (size_t k = 0; k < outs.size(); ++k)
            if (auto e = check_same(outs[k], re[k]); !e.empty()) return e + " (" + bsym_line(m) + ")";
        }
      }
      for (const auto& t : b.outputs())
        if (!defined.count(t.get())) return "region output " + t->name + " is not made by its members (" + where + ")";
      continue;
    }
    for (const auto& t : b.outputs()) {
      if (auto e = define(t, where); !e.empty()) return e;
      if (!d.is_prim() && !b.subsymbols.empty() && !defined_by_subsymbols(b, t.get()))
        return "output " + t->name + " is not produced by the decomposition (" + where + ")";
    }
    if (opts.reinfer && !d.has(tags::Ret)) {
      Arg inferred;
      try {
        inferred = opts.reinfer(b);
      } catch (const std::exception& e) {
        return "re-inferring failed (" + where + "): " + e.what();
      }
      std::vector<TensorRef> re;
      if (!d.is_inplace()) inferred.collect_tensors(re);
      auto outs = b.outputs();
      if (re.size() != outs.size())
        return "re-inferred " + std::to_string(re.size()) + " outputs, recorded " +
               std::to_string(outs.size()) + " (" + where + ")";
      for (size_t k = 0; k < outs.size(); ++k)
        if (auto e = check_same(outs[k], re[k]); !e.empty()) return e + " (" + where + ")";
    }
  }
  return "";
}

} // namespace keraunos

#include "keraunos/passes/pass.h"

#include <cstdlib>

namespace keraunos {

Arg substitute(const Arg& a, const ProxyMap& m) {
  if (a.is_tensor()) {
    auto it = m.find(a.tensor().get());
    return it == m.end() ? a : Arg(it->second);
  }
  if (a.is_list()) {
    Arg::List l;
    l.reserve(a.list().size());
    for (const auto& e : a.list()) l.push_back(substitute(e, m));
    return Arg(std::move(l));
  }
  return a;
}

BoundSymbol substitute(const BoundSymbol& b, const ProxyMap& m) {
  BoundSymbol r;
  r.op = b.op;
  r.out = b.out;
  r.loc = b.loc;
  r.args.reserve(b.args.size());
  for (const auto& a : b.args) r.args.push_back(substitute(a, m));
  r.subsymbols.reserve(b.subsymbols.size());
  for (const auto& s : b.subsymbols) r.subsymbols.push_back(substitute(s, m));
  return r;
}

bool writes_memory(const BoundSymbol& b) {
  if (b.def().is_inplace()) return true;
  for (const auto& s : b.subsymbols)
    if (writes_memory(s)) return true;
  return false;
}

int64_t memory_bytes(const TensorProxy& t) {
  int64_t extent = 1;
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (t.shape[d] > 1) extent += (t.shape[d] - 1) * std::abs(t.strides[d]);
  return t.numel() == 0 ? 0 : extent * itemsize(t.dtype);
}

bool recomputable(const BoundSymbol& b) {
  const OpDef& d = b.def();
  return d.is_prim() && !has_effect(b) && d.has(tags::E | tags::M) && !d.has(tags::T | tags::R);
}

bool has_effect(const BoundSymbol& b) {
  const OpDef& d = b.def();
  return d.has(tags::I | tags::S | tags::N | tags::Ret) || writes_memory(b);
}

} // namespace keraunos

// The op table's implementations: for each symbol of ir/symbols.h, the function that records
// its decomposition through the builder (or, for a prim, its meta function).
#pragma once
#include "keraunos/ir/symbols.h"

namespace keraunos {

class Builder;

// An op's implementation: records its decomposition through the builder and returns the
// outputs. For a prim it is the meta function: checks arguments and makes the output proxies.
// In-place variants run their base op's and write the result into their first argument.
using ImplFn = Arg (*)(Builder&, const Arg::List&);
ImplFn op_impl(OpId id);

// Declarations of every implementation function.
namespace ops {
#define KR_OP(id, schema, tg, torch_fn) Arg impl_##id(Builder&, const Arg::List&);
#define KR_INPLACE(id, base, torch_fn)
#include "keraunos/ir/ops.def"
#undef KR_OP
#undef KR_INPLACE
} // namespace ops

} // namespace keraunos

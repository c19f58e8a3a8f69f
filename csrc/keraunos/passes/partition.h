#pragma once
#include "keraunos/passes/pass.h"

namespace keraunos {
// Whether a symbol may join a fusion region.
bool fusible(const BoundSymbol& b, const std::vector<TensorRef>& returned);
PassResult partition(const Trace& trace, const PassContext& ctx);
} // namespace keraunos

#pragma once
#include "keraunos/passes/pass.h"

namespace keraunos {
PassResult functionalize(const Trace& trace, const PassContext& ctx);
} // namespace keraunos

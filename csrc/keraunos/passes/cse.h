#pragma once
#include "keraunos/passes/pass.h"

namespace keraunos {
PassResult cse(const Trace& trace, const PassContext& ctx);
}

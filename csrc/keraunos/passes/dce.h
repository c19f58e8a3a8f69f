#pragma once
#include "keraunos/passes/pass.h"

namespace keraunos {
PassResult dce(const Trace& trace, const PassContext& ctx);
}

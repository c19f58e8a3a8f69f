#pragma once
#include "keraunos/passes/pass.h"

namespace keraunos {
// Attention over repeated key/value heads becomes grouped-query attention (see the .cpp).
PassResult grouped_query_attention(const Trace& trace, const PassContext& ctx);
}

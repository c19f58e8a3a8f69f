#pragma once
#include "keraunos/passes/pass.h"

namespace keraunos {
// Folds chains of index remaps (see fold_remaps.cpp).
PassResult fold_remaps(const Trace& trace, const PassContext& ctx);
}

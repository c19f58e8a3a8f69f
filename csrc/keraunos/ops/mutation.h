#pragma once
#include "keraunos/ops/builder.h"

namespace keraunos {
// Eager's check before writing into `dst`: no two elements may share memory (an expanded
// tensor). A RuntimeError naming `op` otherwise.
void check_no_internal_overlap(const TensorRef& dst, std::string_view op);
} // namespace keraunos

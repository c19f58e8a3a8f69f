#pragma once
#include "keraunos/ops/builder.h"

namespace keraunos {
// Eager's check before writing into `dst`: no two elements may share memory (an expanded
// tensor). A RuntimeError naming `op` otherwise.
void check_no_internal_overlap(const TensorRef& dst, std::string_view op);
// Eager's check that an input of an in-place op does not partially overlap the written tensor
// (ATen's get_overlap_status: both dense, same storage, intersecting but not identical).
void check_no_partial_overlap(const TensorRef& dst, const TensorRef& src, std::string_view op);
} // namespace keraunos

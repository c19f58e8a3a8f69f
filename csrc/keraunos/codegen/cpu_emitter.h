// The C++ backend of the kernel IR: one translation unit for the kernels of a program, each an
// `extern "C" void <name>(void** ptrs, const int64_t* args)` (runtime/cpu_compiler.h's ABI;
// `ptrs` holds the buffers' data pointers in order, `args` is unused). The outermost parallel
// loops are threaded with OpenMP when the kernel does enough work; innermost loops are marked
// `omp simd` (pointwise) or `omp simd reduction` (sums, products, max/min), so the compiler
// vectorizes them without -ffast-math. The helper library (device/kr_cpu.h) is pasted in front.
#pragma once
#include "keraunos/codegen/kernel_ir.h"

#include <string>
#include <vector>

namespace keraunos::codegen {

// The kernel function alone (no helper library).
std::string emit_cpu_kernel(const kir::Kernel& k);
// A complete translation unit: the helper library, then every kernel.
std::string emit_cpu_source(const std::vector<const kir::Kernel*>& kernels);

} // namespace keraunos::codegen

// The CUDA backend's printer: a kir::Kernel becomes one CUDA C++ translation unit (the device
// helpers of codegen/device/kr_cuda.cuh, then the kernels), ready for NVRTC.
//
// Every kernel takes one pointer per kir buffer, in order (`const T* __restrict__` for inputs,
// `T* __restrict__` for outputs), and nothing else: extents, strides and offsets are constants.
// Index math is 32-bit where every index and the iteration space provably fit, 64-bit otherwise.
//
// Schedules, chosen from the loop tree (kernel_ir.h):
//   pointwise  the body is Parallel loops around straight-line code. The loops are flattened into
//              one index over the product of their extents; one trip per thread of a grid-stride
//              loop (measured on an H200: a grid of one resident wave looping over the data
//              reached 93% of a device copy's bandwidth, one trip per thread 100%). A second, vectorized entry handles VEC consecutive elements of the
//              innermost loop per thread with 16-byte loads/stores when every access is unit-stride
//              (or a broadcast) along it and alignment allows; launch it only when every buffer
//              pointer is 16-byte aligned.
//   thread     outer points whose Reduce/Inner loops are tiny (or read with a stride while the
//              outer points are contiguous): one thread per outer point, loops run serially.
//   warp       rows of <= 256 elements: one warp per outer point, four per block, warp shuffles.
//   block      one block (128..1024 threads: 8 to 16 elements per thread) per outer point; threads stride over Reduce and Inner
//              loops, and accumulators are all-reduced (shuffles + shared memory) after each Reduce
//              loop. When a row fits in registers (<= 16 values per thread), loads of one buffer at
//              the same index in several loops of the row are read once and kept in registers.
//              Warp and block kernels get a vectorized entry too when a Reduce/Inner loop reads or
//              writes along its innermost variable (coefficient 1), its extent is a multiple of
//              VEC = 16 bytes / the widest item accessed that way, and the other coefficients and
//              the constant keep the alignment: each thread then takes VEC consecutive elements
//              per trip (16-byte loads/stores, 8-byte ones for narrower buffers of a mixed
//              kernel), the same per-element math, the same threads and launch; loops that do not
//              qualify stay scalar in it. Launch it only when every buffer pointer is 16-byte
//              aligned.
//   A kernel without loops runs on one thread.
#pragma once
#include "keraunos/codegen/kernel_ir.h"

#include <cstdint>
#include <string>

namespace keraunos::codegen {

struct CudaDeviceInfo {
  int sm_count = 132;
  int major = 9, minor = 0;
  int max_threads_per_block = 1024;
  int shared_mem_per_block = 48 * 1024;
};

struct CudaLaunch {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
  // Grid-stride kernels: the number of work items (one per thread and trip); 0 for the others.
  uint64_t work = 0;
};

struct CudaKernelSource {
  std::string source;    // complete translation unit (helper header text + kernels), extern "C"
  std::string entry;     // scalar variant: always correct
  std::string entry_vec; // vectorized variant or "": valid only when every buffer pointer is
                         // 16-byte aligned (the launcher checks)
  CudaLaunch launch, launch_vec;
  std::string schedule;  // "pointwise", "thread", "warp" or "block" (for tests and dumps)
  int vec = 1;           // elements per thread and trip of entry_vec (per vectorized loop of a
                         // warp/block kernel)
};

CudaKernelSource emit_cuda(const kir::Kernel& k, const CudaDeviceInfo& dev);

} // namespace keraunos::codegen

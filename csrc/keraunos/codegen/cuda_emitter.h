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
//   cluster    (sm_90+) rows longer than 16k: a thread-block cluster of 2..16 blocks
//              (cluster_threads each) per outer point, as the block schedule with the row's
//              threads spread over the cluster; each accumulator is all-reduced in the block,
//              then over the cluster through distributed shared memory (every block combines
//              the blocks' values in the same order: the same result everywhere). Loads reused
//              across the row's loops are cached in registers when they fit
//              (cluster_reg_values per thread), else in dynamic shared memory
//              (launch.shared_mem bytes), so a row of 256k floats is read once.
//              The clusters are persistent (as many as fit, walking the rows) and, in the
//              vectorized entry, a row cached in shared memory is copied in with cp.async: the
//              next row's copies start as soon as the current row's last read of the cache is
//              done, so they overlap the current row's reductions and stores.
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
  int shared_mem_optin = 227 * 1024; // dynamic shared memory a kernel may opt in to
  // Schedule tuning (defaults measured on an H200; cuda_device_info() lets
  // KERAUNOS_CUDA_TUNE="key=value,..." override them for experiments):
  int block_threads = 0;        // block schedule: threads per row (0: by row length)
  int block_min_blocks = 0;     // block schedule, vector entry: __launch_bounds__'s blocks per SM
  // Block schedule: as many blocks as fit walk the rows, a row that one loop reads after its
  // reduction prefetched into registers during the current row's last loop, as the clusters do
  // (0: a block per row). Slower on an H200 (session 7, x copy): bf16 rms_norm 16384x8192 0.88
  // against 0.95, softmax and layer_norm 8k 0.88 / 0.91 against 0.96 / 0.98.
  int block_persist = 0;
  // Block schedule: cache hints of the vectorized row loops (bits; 0: none): 1, loads of the row
  // read once (L1::evict_first); 2, loads every row reads at the same place (L1::evict_last,
  // rms_norm's weight); 4, stores streamed (st.global.cs). 16-byte accesses of kernels whose
  // buffers do not alias, on sm_70+, only. On an H200, keraunos / torch.compile time over 2-4 runs (session 7), bf16 rms_norm
  // 16384x8192 (HF, F.rms_norm) and f32 softmax: none 1.004-1.019 / 1.004-1.016 / 0.879-0.885;
  // 1 alone 1.056 / 1.047; 2 alone 1.014 / 1.013; 4 alone 1.012-1.016 / 1.008-1.009 / 0.882;
  // 5 1.006 / 1.002 / 0.869; 6 1.007 / 0.997 / 0.880; all 0.995-1.004 / 0.985-1.002 / 0.869-0.870.
  int cache_hints = 7;
  int pointwise_vec = 16;       // pointwise schedule: at most this many lanes per vector access
  // Persistent clusters: KB of shared memory per block for row-invariant operands (0: none).
  // On an H200, layer_norm on rows of 256k (x copy): 0 KB 0.83, 64 (the weight) 0.86, 72 0.87,
  // 80 0.88-0.89, 88 0.88, 96 0.73, 104 0.75: past ~88 KB per block (two per SM) the SM's
  // shared-memory carveout grows to 228 KB and leaves too little L1 for the rows' loads.
  int cluster_hoist_kb = 80;
  // Cluster defaults from sweeps on an H200 (scripts/dev/tune_sweep.sh, % of copy for softmax /
  // layer_norm / rms_norm f32 on rows of 256k; benchmarks/RESULTS.md, session 4): 512 threads,
  // up to 16 blocks, 32 values in registers, two blocks per SM, mbarrier all-reduces gave
  // 83 / 82 / 93%, against 72 / 58 / 75% at 256 threads (the row in shared memory) and
  // 79 / 82 / 91% at 1024 threads.
  int cluster_threads = 512;    // cluster schedule: threads per block
  int max_cluster = 16;         // blocks per cluster (over 8 is a non-portable size)
  int cluster_reg_values = 32;  // values per thread cached in registers
  int cluster_smem_bytes = -1;  // shared memory a block may cache its part of a row in (-1: all)
  // Persistent clusters: -1, as many clusters as fit on the device at once (the loader asks the
  // driver) walking the rows; 0, one cluster per row; N > 0, at most N clusters.
  int cluster_persist = -1;
  // Rows cached in shared memory are filled with cp.async, the next row's copies issued as soon
  // as the current row's last read of the cache is done (0: plain loads).
  int cluster_prefetch = 1;
  // Column schedule: at most this many blocks of a cluster take the rows of the same 32 columns
  // when the columns alone give fewer than two blocks per SM (1: none).
  int column_cluster = 8;
  // Cluster all-reduces: warps send their values to every block's buffer with st.async and each
  // block waits on an mbarrier (1), or a block all-reduce then a cluster barrier (0).
  int cluster_async_reduce = 1;
  // With them, a variance's sum and squared deviations in one round (each thread's pair, merged
  // across the cluster) instead of two: layer_norm on rows of 256k 0.81 -> 0.89 of copy.
  int cluster_merge_variance = 1;
  // The same for softmax's max and sum of exp(x - max): 0.88 -> 0.63 with a merge that chains
  // an exp per step; 0.87 against 0.87 for two rounds with the two-step merge in kr_cuda.cuh
  // (session 6). Off: no faster, and two rounds sum exp(x - max) as eager does.
  int cluster_merge_softmax = 0;
  // Row schedules with register caches: an expensive value a later loop computes again (softmax's
  // exp(x - max)) is kept in registers by the loop that computes it first (0: recomputed).
  int reuse_values = 1;
};

// Applies "key=value,..." (the keys of CudaDeviceInfo's tuning fields) to `info`; an unknown key
// or a malformed value is a user error naming it.
void apply_cuda_tuning(CudaDeviceInfo& info, const std::string& spec);

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
  std::string schedule;  // "pointwise", "thread", "warp", "block", "cluster" or "scan" (tests,
                         // dumps)
  int cluster = 1;       // blocks per thread-block cluster (compiled in: __cluster_dims__)
  // The grid holds one cluster per outer point; the loader caps it at the clusters resident on
  // the device at once (the kernels walk the points in a loop, so any grid is correct).
  bool fit_clusters = false;
  // > 0: persistent blocks (block schedule, block_persist): the loader caps the grid at the
  // blocks resident at once on this many SMs.
  int fit_blocks = 0;
  int vec = 1;           // elements per thread and trip of entry_vec (per vectorized loop of a
                         // warp/block kernel)
};

CudaKernelSource emit_cuda(const kir::Kernel& k, const CudaDeviceInfo& dev);

} // namespace keraunos::codegen

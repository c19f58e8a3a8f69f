#include "keraunos/executors/cuda_kernel.h"
#include "keraunos/support/options.h"

#include "keraunos/ir/error.h"
#include "keraunos/runtime/nvrtc.h"

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <tuple>
#include <vector>

namespace keraunos::executors {

using namespace keraunos::runtime; // the NVRTC and driver loaders

namespace {

constexpr int kAttrMaxThreadsPerBlock = 1;       // CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK
constexpr int kAttrMaxSharedMemoryPerBlock = 8;  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK
constexpr int kAttrMultiprocessorCount = 16;     // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97; // ..._MAX_SHARED_MEMORY_PER_BLOCK_OPTIN

int sm_arch(int major, int minor) { return major * 10 + minor; }

} // namespace

codegen::CudaDeviceInfo cuda_device_info(int device) {
  const CudaDriver& d = cuda_driver();
  CUdevice dev = 0;
  check_cuda(d.cuDeviceGet(&dev, device), "cuDeviceGet");
  codegen::CudaDeviceInfo info;
  check_cuda(d.cuDeviceGetAttribute(&info.sm_count, kAttrMultiprocessorCount, dev),
             "cuDeviceGetAttribute");
  check_cuda(d.cuDeviceGetAttribute(&info.max_threads_per_block, kAttrMaxThreadsPerBlock, dev),
             "cuDeviceGetAttribute");
  check_cuda(
      d.cuDeviceGetAttribute(&info.shared_mem_per_block, kAttrMaxSharedMemoryPerBlock, dev),
      "cuDeviceGetAttribute");
  check_cuda(d.cuDeviceGetAttribute(&info.shared_mem_optin, kAttrMaxSharedMemoryPerBlockOptin,
                                    dev),
             "cuDeviceGetAttribute");
  std::tie(info.major, info.minor) = compute_capability(device);
  if (auto tune = options::get("cuda_tune")) codegen::apply_cuda_tuning(info, *tune);
  return info;
}

CompiledCudaKernel::CompiledCudaKernel(codegen::CudaKernelSource source, const std::string& cubin,
                                       int device, int num_buffers)
    : source_(std::move(source)), device_(device), num_buffers_(num_buffers),
      module_(std::make_unique<CudaModule>(cubin, device)), launch_(source_.launch),
      launch_vec_(source_.launch_vec) {
  fn_ = module_->function(source_.entry);
  CudaModule::allow_dynamic_shared_memory(fn_, launch_.shared_mem);
  if (source_.cluster > 8) CudaModule::allow_non_portable_cluster(fn_);
  if (!source_.entry_vec.empty()) {
    fn_vec_ = module_->function(source_.entry_vec);
    CudaModule::allow_dynamic_shared_memory(fn_vec_, launch_vec_.shared_mem);
    if (source_.cluster > 8) CudaModule::allow_non_portable_cluster(fn_vec_);
  }
  if (source_.fit_clusters || source_.fit_blocks > 0) {
    // Persistent clusters or blocks: no more than fit on the device at once (a cluster launched
    // later would start only when a whole cluster's worth of SMs is free, after the others
    // walked their rows). The driver's count is 0 when it cannot say: the grid stays.
    auto fit = [&](CUfunction f, codegen::CudaLaunch& l) {
      const unsigned n =
          source_.fit_clusters
              ? static_cast<unsigned>(CudaModule::max_active_clusters(f, l.block, l.shared_mem)) *
                    static_cast<unsigned>(source_.cluster)
              : static_cast<unsigned>(CudaModule::max_active_blocks_per_sm(
                    f, l.block[0] * l.block[1] * l.block[2], l.shared_mem)) *
                    static_cast<unsigned>(source_.fit_blocks);
      if (n > 0) l.grid[0] = std::min(l.grid[0], n);
    };
    fit(fn_, launch_);
    if (fn_vec_) fit(fn_vec_, launch_vec_);
  }
}

std::shared_ptr<CompiledCudaKernel> compile_cuda_kernel(const kir::Kernel& k, int device) {
  const codegen::CudaDeviceInfo info = cuda_device_info(device);
  codegen::CudaKernelSource src = codegen::emit_cuda(k, info);
  const std::string cubin = compile_cuda_cached(src.source, k.name, sm_arch(info.major, info.minor));
  auto compiled = std::make_shared<CompiledCudaKernel>(std::move(src), cubin, device,
                                                       static_cast<int>(k.buffers.size()));
  return compiled;
}

void launch(const CompiledCudaKernel& k, void* const* buffer_ptrs, CUstream stream) {
  std::vector<void*> params(static_cast<size_t>(k.num_buffers_));
  bool aligned = true;
  for (int i = 0; i < k.num_buffers_; ++i) {
    params[i] = const_cast<void**>(&buffer_ptrs[i]);
    aligned &= reinterpret_cast<std::uintptr_t>(buffer_ptrs[i]) % 16 == 0;
  }
  const bool vec = aligned && k.fn_vec_;
  const codegen::CudaLaunch& l = vec ? k.launch_vec_ : k.launch_;
  CudaModule::launch(vec ? k.fn_vec_ : k.fn_, l.grid, l.block, l.shared_mem, stream,
                     params.data());
}

std::string compile_cuda_kernel_cubin_only(const kir::Kernel& k, int major, int minor,
                                           std::string* source_out) {
  codegen::CudaDeviceInfo info;
  info.major = major;
  info.minor = minor;
  if (auto tune = options::get("cuda_tune")) codegen::apply_cuda_tuning(info, *tune);
  codegen::CudaKernelSource src = codegen::emit_cuda(k, info);
  std::string cubin = compile_cuda(src.source, k.name, sm_arch(major, minor)).cubin;
  if (source_out) *source_out = std::move(src.source);
  return cubin;
}

} // namespace keraunos::executors

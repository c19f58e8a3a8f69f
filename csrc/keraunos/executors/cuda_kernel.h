// A kir::Kernel compiled for one CUDA device: the emitted source (codegen/cuda_emitter.h) through
// NVRTC and the CUBIN cache, loaded with the driver, launched on the caller's stream.
//
// The Python-facing fusion object reads tensors' data pointers, allocates outputs, and calls
// launch() with torch's current stream; this layer knows nothing of torch.
#pragma once
#include "keraunos/codegen/cuda_emitter.h"
#include "keraunos/codegen/kernel_ir.h"
#include "keraunos/runtime/cuda_driver.h"

#include <memory>
#include <string>

namespace keraunos::executors {

class CompiledCudaKernel {
public:
  CompiledCudaKernel(codegen::CudaKernelSource source, const std::string& cubin, int device,
                     int num_buffers);
  const codegen::CudaKernelSource& source() const { return source_; }
  int device() const { return device_; }
  int num_buffers() const { return num_buffers_; }
  // The launch configurations used.
  const codegen::CudaLaunch& launch_config() const { return launch_; }
  const codegen::CudaLaunch& launch_config_vec() const { return launch_vec_; }

private:
  friend void launch(const CompiledCudaKernel&, void* const*, runtime::CUstream);
  codegen::CudaKernelSource source_;
  int device_;
  int num_buffers_;
  std::unique_ptr<runtime::CudaModule> module_;
  runtime::CUfunction fn_ = nullptr;
  runtime::CUfunction fn_vec_ = nullptr; // nullptr when there is no vectorized variant
  codegen::CudaLaunch launch_, launch_vec_;
};

// The device's properties that the emitter's schedules depend on (SM count, compute capability).
codegen::CudaDeviceInfo cuda_device_info(int device);

// Emits `k` for `device`, compiles it with NVRTC for the device's architecture (through the
// CUBIN cache) and loads it.
std::shared_ptr<CompiledCudaKernel> compile_cuda_kernel(const kir::Kernel& k, int device);

// Launches on `stream`: `buffer_ptrs` holds one device pointer per kir buffer, in order. The
// vectorized variant runs when every pointer is 16-byte aligned.
void launch(const CompiledCudaKernel& k, void* const* buffer_ptrs, runtime::CUstream stream);

// For machines without a GPU (CI): emits `k` for an H100/H200-like device of compute capability
// major.minor and compiles it with NVRTC (no cache, no driver); returns the CUBIN and, when
// `source_out` is given, stores the CUDA source there (dumps, resource-usage checks).
std::string compile_cuda_kernel_cubin_only(const kir::Kernel& k, int major, int minor,
                                           std::string* source_out = nullptr);

} // namespace keraunos::executors

// The CUDA executor: each kernel is emitted for the device's schedules, compiled by NVRTC
// through the CUBIN cache and loaded with the driver (executors/cuda_kernel.h), then launched on
// the caller's stream.
#include "keraunos/executors/executor.h"
#include "keraunos/ir/error.h"
#include "keraunos/executors/cuda_kernel.h"

namespace keraunos::executors {

namespace {

class CudaKernel final : public CompiledKernel {
public:
  explicit CudaKernel(std::shared_ptr<CompiledCudaKernel> k) : k_(std::move(k)) {}
  void launch(void* const* buffers, void* stream) const override {
    runtime::ensure_context(k_->device());
    executors::launch(*k_, buffers, reinterpret_cast<runtime::CUstream>(stream));
  }
  const std::string& source() const override { return k_->source().source; }

private:
  std::shared_ptr<CompiledCudaKernel> k_;
};

class CudaExecutor final : public Executor {
public:
  DeviceType device() const override { return DeviceType::CUDA; }
  std::vector<std::shared_ptr<const CompiledKernel>>
  compile(const std::vector<const kir::Kernel*>& kernels, int device_index) override {
    std::vector<std::shared_ptr<const CompiledKernel>> out;
    for (const auto* k : kernels)
      out.push_back(std::make_shared<CudaKernel>(compile_cuda_kernel(*k, device_index)));
    return out;
  }
};

} // namespace

Executor& cuda_executor() {
  static CudaExecutor e;
  return e;
}

std::string check_cuda_codegen(const kir::Kernel& k, int major, int minor) {
  kir::Kernel c = k;
  c.device = DeviceType::CUDA;
  std::string src;
  compile_cuda_kernel_cubin_only(c, major, minor, &src);
  return src;
}

} // namespace keraunos::executors

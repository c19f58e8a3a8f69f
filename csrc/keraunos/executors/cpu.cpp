// The CPU executor: kernels become one C++ translation unit (codegen/cpu_emitter.h), built by
// the host compiler into a shared library (runtime/cpu_compiler.h, cached on disk by
// runtime/kernel_cache.h) and called through their function pointers.
#include "keraunos/codegen/cpu_emitter.h"
#include "keraunos/executors/executor.h"
#include "keraunos/runtime/cpu_compiler.h"

namespace keraunos::executors {

namespace {

class CpuKernel final : public CompiledKernel {
public:
  CpuKernel(std::shared_ptr<cpu::CompiledLibrary> lib, const std::string& name, std::string src)
      : lib_(std::move(lib)), fn_(lib_->kernel(name)), source_(std::move(src)) {}
  void launch(void* const* buffers, void*) const override {
    fn_(const_cast<void**>(buffers), nullptr);
  }
  const std::string& source() const override { return source_; }

private:
  std::shared_ptr<cpu::CompiledLibrary> lib_; // keeps the library loaded
  cpu::KernelFn fn_;
  std::string source_;
};

class CpuExecutor final : public Executor {
public:
  DeviceType device() const override { return DeviceType::CPU; }
  std::vector<std::shared_ptr<const CompiledKernel>>
  compile(const std::vector<const kir::Kernel*>& kernels, int) override {
    std::vector<std::shared_ptr<const CompiledKernel>> out;
    if (kernels.empty()) return out;
    auto lib = cpu::compile_and_load(codegen::emit_cpu_source(kernels));
    for (const auto* k : kernels)
      out.push_back(std::make_shared<CpuKernel>(lib, k->name, codegen::emit_cpu_kernel(*k)));
    return out;
  }
};

} // namespace

Executor& cpu_executor() {
  static CpuExecutor e;
  return e;
}

} // namespace keraunos::executors

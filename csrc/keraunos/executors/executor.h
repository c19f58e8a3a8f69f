// Executors: one per device kind, each owning how the kernels it claims are compiled, cached
// and launched. Fusion (codegen/fused_program.h) decides which regions become kernels and
// for which device; an executor turns those kernels into launchable code:
//   cpu   the C++ emitter, the host compiler, the CPU library cache, a call through a
//         function pointer (executors/cpu.cpp);
//   cuda  the CUDA emitter, NVRTC, the CUBIN cache, a launch through the driver on the
//         caller's stream (executors/cuda.cpp).
// The Python binding (python/bind_fusion.cpp) only moves tensors in and out.
#pragma once
#include "keraunos/codegen/kernel_ir.h"

#include <memory>
#include <string>
#include <vector>

namespace keraunos::executors {

// One kernel compiled for its device.
class CompiledKernel {
public:
  virtual ~CompiledKernel() = default;
  // `buffers`: one data pointer per kir buffer (inputs, then outputs). `stream`: the CUDA
  // stream to launch on (a CUstream), null on the CPU.
  virtual void launch(void* const* buffers, void* stream) const = 0;
  // The generated source it was compiled from.
  virtual const std::string& source() const = 0;
};

class Executor {
public:
  virtual ~Executor() = default;
  virtual DeviceType device() const = 0;
  // Compiles `kernels` (all for this executor's device; `device_index` names the GPU) and
  // returns one launchable kernel for each, in order. The CPU executor builds them into one
  // library.
  virtual std::vector<std::shared_ptr<const CompiledKernel>>
  compile(const std::vector<const kir::Kernel*>& kernels, int device_index) = 0;
};

// The executor of a device kind (process-wide: compiled kernels stay valid for the process).
Executor& executor_for(DeviceType device);

// For machines without a GPU (CI): the CUDA source `k` gets and its compilation with NVRTC for
// compute capability major.minor (no cache, no driver, not launched). Returns the source.
std::string check_cuda_codegen(const kir::Kernel& k, int major, int minor);

} // namespace keraunos::executors

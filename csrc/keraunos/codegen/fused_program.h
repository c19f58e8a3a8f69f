// The program of a partitioned trace with fusion executors: each fusion region (and each lone
// fusible symbol that computes something) is lowered to kernels (lower.h); the program calls
// the kernels' objects and runs everything else through torch, like the torch executor.
//
//   t5, t6, = k0_0(t0, t1)      # a kernel: reads t0, t1; allocates and returns t5, t6
//   t7 = torch.matmul(t5, t6)   # the rest: torch
//
// Epilogue writes into inputs are fused into the kernel that computes their value when that
// is safe (`k1_0(t2, t0)` then writes into t0 and the `copy_` disappears).
#pragma once
#include "keraunos/codegen/lower.h"

#include <string>
#include <vector>

namespace keraunos::codegen {

struct FusionOptions {
  bool cpu = true;  // claim regions on CPU tensors
  bool cuda = true; // claim regions on CUDA tensors
  bool cuda_twins = false; // also lower CPU regions for CUDA (KernelCall::cuda_twin)
  bool kernel_stages = false; // record each kernel after every kernel pass (KernelCall::stages)
  // `def <name>(args)`: the program takes its inputs as a list and empties it.
  bool boxed = false;
  // Of a boxed program's inputs, those whose memory a kernel may reuse once it has read them
  // for the last time (saved tensors that alias nothing the user holds); the kernel checks at
  // run time that nothing else references the tensor (bind_fusion.cpp: lendable).
  std::vector<bool> donatable;
};

struct FusedProgram {
  std::string source; // `def <name>(...)`; calls the kernels by their names
  std::vector<KernelCall> kernels;
};

FusedProgram fused_program(const Trace& trace, const std::string& name, const FusionOptions& opt);

} // namespace keraunos::codegen

// The kernel passes: what runs on a kernel between lowering and a backend's emitter, as a list
// (the way passes/pass_manager runs the trace passes). Each pass is a function of the kernel IR
// alone, with golden tests (text in, text out) in tests/cpp/kernel_passes_test.cpp.
//
//   lower  ->  fuse_sibling_reductions  ->  reuse_reduced_values (CPU)  ->  hoist_invariants
//
// KERAUNOS_DUMP=kernels prints every kernel after lowering and after each pass that ran
// (keraunos.last_traces(f)[-1].kernels[i].stages holds the same listings).
#pragma once
#include "keraunos/codegen/kernel_ir.h"

#include <string>
#include <string_view>
#include <vector>

namespace keraunos::codegen {

struct KernelPass {
  std::string_view name;
  bool cpu = true, cuda = true; // the devices whose kernels it runs on
  void (*run)(kir::Kernel&);
  std::string_view what; // one line, for listings
};

// The passes, in the order they run.
const std::vector<KernelPass>& kernel_passes();

// A kernel's listing after a stage: "lower" (as lowering made it), then each pass that ran.
struct KernelStage {
  std::string pass;
  std::string listing;
};

// Runs the passes that apply to `k.device`, in order. With `stages`, records the listing after
// lowering and after each pass.
void run_kernel_passes(kir::Kernel& k, std::vector<KernelStage>* stages = nullptr);

} // namespace keraunos::codegen

// Lowering of fusion regions into kernels of the kernel IR (kernel_ir.h).
//
// A region's members, flattened to prims, are split into segments: maximal runs of prims a
// kernel can compute, separated by prims that run through torch (indexing, random draws,
// integer division, ...). Each segment becomes one or more kernels: the values read after the
// segment are materialized, grouped by shape into loop nests; everything else is computed
// inline at the index where it is needed (index remaps compose into the loads' indices),
// reductions are placed at the outermost loop their index depends on (so softmax's max and
// sum are computed once per row), and a reduction that would be recomputed (its result
// broadcast along an outer loop) is materialized by an earlier kernel instead.
#pragma once
#include "keraunos/codegen/kernel_ir.h"
#include "keraunos/codegen/kernel_passes.h"
#include "keraunos/ir/trace.h"

#include <memory>
#include <string>
#include <vector>

namespace keraunos::codegen {

// One kernel of a lowered program and the program values it reads and defines.
struct KernelCall {
  kir::Kernel kernel;
  std::vector<TensorRef> inputs;  // one per input buffer, in order
  std::vector<TensorRef> outputs; // one per output buffer, in order
  // Outputs written into an existing tensor instead of a new one (reinplaced epilogue
  // writes): for each output, the program input it writes into, or nullptr.
  std::vector<TensorRef> write_into;
  // Outputs that may take the memory of an input the program reads for the last time (a
  // backward's saved tensor, fused_program.cpp: donate): for each output, that input's index,
  // or -1. The program passes that input in a one-element list; the kernel checks it at run time.
  std::vector<int> donor;
  // With FusionOptions::cuda_twins, for a CPU kernel: the same region's kernel lowered for CUDA
  // (what a GPU would run; CI without a GPU compiles it through NVRTC). Null otherwise.
  std::shared_ptr<const kir::Kernel> cuda_twin;
  // With `record_stages`: the kernel after lowering and after each kernel pass (kernel_passes.h).
  std::vector<KernelStage> stages;
  // The index tensors a CPU kernel gathers by, which the program checks before it runs (a
  // prim_check_index step: eager's error for an index out of range).
  struct IndexCheck {
    TensorRef index;
    int64_t size, dim, error; // error: which op's error (prims.def, prim_take)
  };
  std::vector<IndexCheck> index_checks;
};

// One statement of a lowered region: a kernel call or a prim run through torch.
struct Step {
  int kernel = -1;  // index into LoweredRegion::kernels, or -1
  BoundSymbol bsym; // the prim, when kernel == -1
};

struct LoweredRegion {
  std::vector<KernelCall> kernels;
  std::vector<Step> steps;
};

// Whether a kernel can compute this prim (given its operand and result dtypes). Every prim of
// the op table has a rule in lower.cpp's table: lowered by a kernel (for some dtypes) or run
// through torch, for a reason the rule names.
bool kernel_supports(const BoundSymbol& prim);
bool has_kernel_rule(OpId prim);
// The prims whose rule computes them by their device helper (kir::prim_helper).
std::vector<OpId> helper_prims();

// Lowers `prims` (a region's members flattened to prims, in order); `needed` are the values
// read after the region. Kernel names are `prefix` + a number. Each kernel goes through the
// kernel passes (kernel_passes.h); with `record_stages`, KernelCall::stages lists it after each.
LoweredRegion lower_region(const std::vector<BoundSymbol>& prims,
                           const std::vector<TensorRef>& needed, DeviceType device,
                           const std::string& prefix, bool record_stages = false);

} // namespace keraunos::codegen

// Reverse-mode differentiation of a functional trace, and the split of the joint forward +
// backward trace into the two programs autograd runs (passes/autodiff.cpp).
#pragma once
#include "keraunos/passes/pass.h"

#include <vector>

namespace keraunos {

struct GradSplit {
  // The forward trace (flattened to prims) followed by the backward; returns
  // [output, grads of the inputs]. Kept for keraunos.last_traces.
  Trace joint;
  // The inputs' trace, returning [output, [saved tensors]].
  Trace forward;
  // Takes (saved tensors..., gradients of the differentiable outputs...) and returns the
  // gradient of each forward input (None where it needs none or gets none).
  Trace backward;
  // For each tensor of the output (depth-first order): whether it is differentiable (eager's
  // result would require grad); only these get a gradient input in `backward`.
  std::vector<bool> output_differentiable;
  size_t num_saved = 0;
};

// Differentiates `trace` (functional: after functionalize, DCE and CSE) with respect to its
// inputs that require grad. A program that autograd cannot run this way raises
// NotImplementedError naming what is missing: a write into an input, an output that aliases
// an input, a symbol with no backward rule. Returns the split pair.
GradSplit autodiff(const Trace& trace, const PassContext& ctx);

} // namespace keraunos

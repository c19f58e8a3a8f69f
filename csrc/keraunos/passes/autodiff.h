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
  // For each leaf of the trace's return (the list's elements, or the one value): a value
  // the program returns, or a view of a program input, which the caller makes itself (with
  // torch.as_strided under autograd, so eager's autograd records it as a view of that input;
  // `forward` returns None there).
  struct Leaf {
    enum Kind { Value, Tensor, Alias } kind = Value;
    bool differentiable = false; // Tensor: eager's result would require grad (gets a gradient)
    int64_t input = -1;          // Alias: the input it views
    bool identity = false;       // Alias: the input itself
    bool detached = false;       // Alias: a view through detach
    Shape shape, strides;
    int64_t offset = 0;
  };
  std::vector<Leaf> leaves;
  size_t num_saved = 0;
  // Of the backward's inputs, the saved tensors whose memory nothing outside the pair can
  // reach: forward intermediates sharing no storage with a forward input or a user output. The
  // backward may let a kernel write into one after its last read (fused_program.cpp: donate).
  std::vector<bool> donatable;
};

// Differentiates `trace` (functional: after functionalize, DCE and CSE) with respect to its
// inputs that require grad; `acquired` is the same program before functionalization. A
// program that autograd cannot run this way raises NotImplementedError naming what is
// missing: an in-place write involving a tensor that requires grad, a write into an input, an
// output that aliases an input, a symbol with no backward rule. Returns the split pair.
GradSplit autodiff(const Trace& trace, const Trace& acquired, const PassContext& ctx);

// The first in-place write in `acquired` (before functionalization) that eager's autograd
// must see, or nothing, tracked per storage (a view counts), as a message naming the op and
// the user's line: a write into a program input where a tensor that requires grad is involved
// (the input's history changes), one that replaces a value requiring grad by one that does
// not (zero_), or one into a tensor autograd may have saved (eager's backward raises). Such
// a program runs as recorded, in place, through torch. Other writes (an in-place ReLU or
// residual add on the program's own tensors, batch_norm's running statistics) are functional
// values to autodiff.
std::string recorded_write(const Trace& acquired);

} // namespace keraunos

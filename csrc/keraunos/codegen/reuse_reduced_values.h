// reuse_reduced_values: a CPU kernel IR pass that computes an expensive per-element value once
// when both a reduction loop and the pointwise loop after it compute it.
//
// Softmax lowers to three loops per row: the max, the sum of exp(x - max), and the output
// exp(x - max) / sum. Recomputing exp in the last loop is what a GPU wants (registers are
// cheap, memory is not), but on a CPU the row is still in L1 when the last loop runs, and the
// exp is the dominant cost. So when the pointwise loop stores into an output buffer of the
// value's own compute dtype, the reduction loop also stores the value there, and the pointwise
// loop loads it back instead of recomputing it (eager PyTorch's CPU softmax does the same):
//
//   acc a1 sum                              acc a1 sum
//   reduce r1 < 128:                        reduce r1 < 128:
//     v1 = load in0[128 * i0 + r1]            v1 = load in0[128 * i0 + r1]
//     let v2 = kr_exp(v1 - v0)                let v2 = kr_exp(v1 - v0)
//     update a1 sum v2                        update a1 sum v2
//   inner i1 < 128:                 =>        store out0[128 * i0 + r1] = v2
//     v3 = load in0[128 * i0 + i1]          inner i1 < 128:
//     let v4 = kr_exp(v3 - v0)                v4 = load out0[128 * i0 + i1]
//     let v5 = v4 / a1                        let v5 = v4 / a1
//     store out0[128 * i0 + i1] = v5          store out0[128 * i0 + i1] = v5
//
// Needs: a kernel fresh from lowering (outputs never alias inputs in a kernel with reduction
// loops: the reinplacing of epilogue writes refuses those). Guarantees: the same values are
// stored (the cached value is stored losslessly: only into float32/float64 buffers of its own
// dtype, and every element the pointwise loop reads was written by the reduction loop of the
// same outer point). Results are bitwise unchanged.
#pragma once
#include "keraunos/codegen/kernel_ir.h"

namespace keraunos::codegen {

// Returns whether it changed the kernel.
bool reuse_reduced_values(kir::Kernel& kernel);

} // namespace keraunos::codegen

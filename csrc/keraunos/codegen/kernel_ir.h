// The kernel IR: what a fusion region becomes before a backend prints it.
//
// A kernel is a loop tree over concrete extents. Its statements load elements of input
// buffers, compute per-element values (expressions in a small C subset shared by the C++ and
// CUDA backends), accumulate reductions and store elements of output buffers. Shapes, strides
// and offsets are constants (the program cache specializes on them), so every index is a
// constant-coefficient expression of the loop variables.
//
//   softmax(x: f32[64, 128]) over dim 1, lowered:
//
//   parallel i0 < 64:
//     acc a0 max = -inf
//     reduce r0 < 128:                      // a reduction loop inside one outer point
//       v0 = load in0[128*i0 + r0]
//       update a0 max v0
//     acc a1 sum = 0
//     reduce r1 < 128:
//       v1 = load in0[128*i0 + r1]
//       let v2 = kr_exp((v1 - a0))
//       update a1 sum v2
//     inner i1 < 128:                        // a pointwise loop inside one outer point
//       v3 = load in0[128*i0 + i1]
//       let v4 = (kr_exp((v3 - a0)) / a1)
//       store out0[128*i0 + i1] = v4
//
// Backends map the tree: the C++ emitter threads over the outermost parallel loops and lets
// the compiler vectorize innermost loops; the CUDA emitter maps the parallel loops to the
// grid (one element per thread for pure pointwise kernels, one block per outer point when an
// outer point holds reduce/inner loops).
//
// Values have a compute dtype: float16 and bfloat16 are computed in float32, every other dtype
// in itself. Loads convert from the buffer's dtype to the compute dtype, stores back.
#pragma once
#include "keraunos/codegen/kir_expr.h"
#include "keraunos/ir/types.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace keraunos::kir {

// A buffer index: constant + sum(coef * var) + an optional non-affine part (an int64
// expression over loop variables, e.g. ((6 * i0 + i1) / 4) % 3). Units: elements.
struct Index {
  std::vector<std::pair<std::string, int64_t>> terms; // loop variable, coefficient (nonzero)
  int64_t constant = 0;
  Expr opaque; // added to the affine part when set

  // The coefficient of `var` in the affine part (0 when absent). Backends use it to find
  // contiguous accesses (coefficient 1 on the innermost loop, no opaque part).
  int64_t coef(const std::string& var) const;
  bool affine() const { return !opaque; }
  bool mentions(const std::string& var) const;
  // The index with loop variable `from` renamed `to`.
  Index renamed(const std::string& from, const std::string& to) const;
  // The whole index as one expression, in int64 or (an affine index whose values fit) int32:
  // 32-bit arithmetic lets the device compiler see through it (merging equal helper calls).
  Expr expr(DType t = DType::Int64) const;
  std::string str() const; // C expression, int64_t arithmetic
};

// A kernel parameter: one tensor's data pointer (already offset by its storage_offset).
struct Buffer {
  std::string name; // "in0", "out0"
  DType dtype;      // storage dtype
  bool output = false;
  Shape shape;   // for documentation and, for outputs, allocation
  Shape strides; // elements
};

enum class ReduceOp : uint8_t { Sum, Prod, Max, Min };
const char* reduce_op_name(ReduceOp op);

struct Stmt;
using Block = std::vector<Stmt>;

enum class LoopKind : uint8_t {
  Parallel, // iterations independent; only at the top of the tree, nested in one another
  Reduce,   // its body updates accumulators declared just before it
  Inner,    // a pointwise loop inside an outer point (after its reductions)
  // A running accumulation (cumsum): iterations in order, each updating accumulators declared
  // just before the loop and then reading their running value (to store it). Never split or
  // reordered: backends run it serially.
  Scan,
};

struct Loop {
  std::string var;
  int64_t extent = 0;
  LoopKind kind = LoopKind::Parallel;
  Block body;
  // A variance's second pass (Reduce loops): this loop sums the squared deviations of the values
  // an earlier Reduce loop of the same extent sums into accumulator `sum` from their mean, the
  // let `mean` (sum / extent). Backends that combine partial results across threads may then
  // compute both sums in one round (Chan's combine of (sum, squared deviations) pairs); the
  // statements mean the same either way. Printed after the loop's header.
  struct Deviations {
    std::string sum, mean;
  };
  std::optional<Deviations> deviations;
};

// `var = (compute dtype) buffer[index]`.
struct Load {
  std::string var;
  DType dtype; // compute dtype of var
  int buffer;  // index into Kernel::buffers
  Index index;
};

// `var = expr` with expr over earlier vars, literals and the helper functions (kr_exp, ...).
// expr's dtype may differ from the let's: the declaration converts (as C does).
struct Let {
  std::string var;
  DType dtype; // compute dtype
  Expr expr;
  // Computes an op tagged costly (tags::X: a transcendental).
  bool costly() const { return expr->costly; }
};

// Declares accumulator `var` with the identity of `op` (for Max, -inf / the dtype's lowest;
// NaN propagates like torch.amax).
struct AccInit {
  std::string var;
  DType dtype;
  ReduceOp op;
};

// Inside a Reduce loop: `var = combine_op(var, value)`.
struct AccUpdate {
  std::string var;
  ReduceOp op;
  std::string value; // a var
};

// `buffer[index] = (storage dtype) value`.
struct Store {
  int buffer;
  Index index;
  std::string value; // a var
};

struct Stmt {
  enum class Kind : uint8_t { Loop, Load, Let, AccInit, AccUpdate, Store };
  Kind kind = Kind::Let;
  // Exactly one of these is set, by kind (a variant would do; this keeps printing simple).
  std::shared_ptr<Loop> loop;
  Load load;
  Let let;
  AccInit acc;
  AccUpdate update;
  Store store;

  static Stmt of(Loop l);
  static Stmt of(Load l);
  static Stmt of(Let l);
  static Stmt of(AccInit a);
  static Stmt of(AccUpdate u);
  static Stmt of(Store s);
};

struct Kernel {
  std::string name; // a C identifier, unique within its program
  std::vector<Buffer> buffers; // inputs first, then outputs
  Block body;                  // starts with the Parallel loops (none for a 0-d output)
  DeviceType device = DeviceType::CPU;
  // False when an output is written into memory an input buffer also points to (a reinplaced
  // epilogue write reads and writes the same elements): backends then drop `__restrict__`.
  bool noalias = true;

  int num_inputs() const;
  // Readable listing (the format of the example above); tests compare it.
  std::string str() const;
};

// Moves each Let of a Reduce or Inner loop that reads nothing the loop defines or updates
// (its variable, loads and lets in it, accumulators updated in it) to just before the loop,
// innermost loops first, so a value that is constant per outer point — rms_norm's
// rsqrt(mean + eps), softmax's 1 / sum — is computed once per point, not per element. With
// `loads` (CPU kernels) also each Load of an Inner loop at an index the loop does not change,
// from a buffer the kernel never stores to, when the loop runs at least once (a row's saved
// statistics). Parallel loops keep their statements (backends map them to threads).
void hoist_invariants(Block& body, bool loads = false);

// Merges a Reduce loop into an earlier one of the same extent when only lets and accumulator
// declarations stand between them and the later loop reads nothing they define nor any
// accumulator the earlier one updates: layer_norm's float sum (the mean) and double sum (the
// variance's mean) become one pass over the row. The declarations move before the merged loop,
// the lets after it. Loops whose bodies hold loops are left alone.
void fuse_sibling_reductions(Block& body);

} // namespace keraunos::kir

// Shared pieces of meta functions: broadcasting, PyTorch's type promotion and the output
// layout rule of TensorIterator, so that inferred shapes, dtypes and strides match eager.
#pragma once
#include "keraunos/ops/builder.h"

#include <string_view>
#include <utility>
#include <vector>

namespace keraunos {

// torch.broadcast_shapes; a user error naming `op` when the shapes don't broadcast.
Shape broadcast_shapes(const std::vector<Shape>& shapes, std::string_view op);

// torch.result_type over tensors and Python numbers (dimensioned tensors > 0-d tensors >
// numbers, by category).
DType result_type(const Arg::List& operands, DType default_float);

// ATen's is_non_overlapping_and_dense.
bool non_overlapping_dense(const Shape& sizes, const Shape& strides);

// Output strides of an elementwise op over `operands` (already broadcast to `shape`), as
// TensorIterator computes them.
Shape elementwise_strides(const std::vector<TensorRef>& operands, const Shape& shape);

// How an elementwise op maps its promoted input dtype to its computation and result dtypes.
enum class Promotion {
  Default,    // result = promoted type
  IntToFloat, // integers and bool compute in the default float (sin, div, ...)
  AlwaysBool, // comparisons: compute in the promoted type, return bool
  BoolToLong, // bool becomes int64 (sum)
  NoPromote,  // the first tensor's dtype
};

struct PromotedTypes {
  DType compute; // dtype the prims compute in (float16/bfloat16 compute in float32)
  DType result;
};
PromotedTypes promote(const Arg::List& operands, Promotion kind, DType default_float);

// Helpers for decompositions.
Arg to_dtype(Builder& b, const Arg& a, DType d);      // converts tensors; numbers pass through
TensorRef expand_to(Builder& b, const TensorRef& t, const Shape& shape);
// Applies an elementwise prim to operands: broadcasts, promotes per `kind`, computes in the
// computation dtype and converts to the result dtype.
TensorRef elementwise(Builder& b, OpId prim, const Arg::List& operands, Promotion kind,
                      std::string_view op);

// base[indices] as prims (advanced indexing: the (dim, index tensor) pairs in dim order, the
// other dims taken whole), laid out as eager lays it out. Negative indices count from the end.
TensorRef advanced_index(Builder& b, const TensorRef& base,
                         const std::vector<std::pair<int64_t, TensorRef>>& indices);

// `t` itself when contiguous, else a contiguous copy (kernels that start with
// input.contiguous() in eager give contiguous outputs: softmax, layer_norm, ...).
TensorRef make_contiguous(Builder& b, const TensorRef& t);

// First tensor among operands (user error naming `op` when there is none).
const TensorRef& first_tensor(const Arg::List& operands, std::string_view op);
// Dims normalized for reductions: empty or None means all dims; sorted, unique.
std::vector<int64_t> reduction_dims(const Arg& dims, int64_t ndim, std::string_view op);

} // namespace keraunos

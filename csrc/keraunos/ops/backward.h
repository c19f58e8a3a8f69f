// Backward rules: for each prim, how the gradient of its output becomes gradients of its
// tensor arguments (a vector-Jacobian product recorded through the builder as prims). Language
// ops get theirs from their decompositions (passes/autodiff.cpp differentiates the prims), so
// the table is over prims, and a test checks that every prim has an entry.
#pragma once
#include "keraunos/ops/builder.h"

#include <vector>

namespace keraunos {

enum class GradKind {
  Rule,       // a rule below
  NoGrad,     // no float output, or no tensor input: nothing to differentiate (comparisons)
  Refused,    // no rule yet: a program that needs it runs through torch, where autograd records
  Torch,      // the backward runs through torch (a torch_vjp symbol; passes/autodiff.cpp)
};

struct GradRequest {
  const BoundSymbol& bsym; // the prim, with its arguments
  const TensorRef& grad;   // the gradient of its (single) output, same shape and dtype
  // For each argument (in order), whether a gradient is wanted; for a list argument (cat's
  // tensors), one flag per element in `list_needs`.
  const std::vector<bool>& needs;
  const std::vector<std::vector<bool>>& list_needs;
};

// A rule returns one Arg per argument of the prim: None where no gradient is wanted, a tensor
// (the argument's shape and dtype), or for a list argument a list of those.
using GradFn = Arg::List (*)(Builder&, const GradRequest&);

struct GradEntry {
  GradKind kind = GradKind::Refused;
  GradFn fn = nullptr;
  const char* why = nullptr; // Refused: what is missing
};

const GradEntry& grad_entry(OpId op);

// Views (tags::V language ops, which record no prims): the gradient of the viewed tensor
// (the first argument) from the gradient `g` of one view output `y`. Permutes, expands and
// reshapes of contiguous tensors get the inverse remap; other views (slices, selects,
// diagonals, splits) scatter `g` into zeros at the positions the view reads, by strides.
// Throws NotImplementedError for a view it cannot invert (a dtype view, an overlapping base).
TensorRef view_grad(Builder& b, const BoundSymbol& view, const TensorRef& y, const TensorRef& g);

} // namespace keraunos

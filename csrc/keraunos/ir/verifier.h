// The verifier: DESIGN.md §2's invariants, checked after every pass in tests and debug mode.
#pragma once
#include "keraunos/ir/trace.h"

#include <functional>
#include <string>

namespace keraunos {

struct VerifyOptions {
  bool functional = false;  // after functionalization: no in-place symbols but the epilogue
  // Re-runs a symbol's meta function (ops/builder.h, reinfer); when set, every symbol's outputs
  // are compared with what it infers (shapes, strides, dtypes).
  std::function<Arg(const BoundSymbol&)> reinfer;
};

// Empty when the trace is well formed; otherwise a description of the first violation.
std::string verify(const Trace& trace, const VerifyOptions& opts = {});

} // namespace keraunos

// The verifier: DESIGN.md §2's invariants, checked after every pass in tests and debug mode.
#pragma once
#include "keraunos/ir/trace.h"
#include "keraunos/ops/builder.h"

#include <string>

namespace keraunos {

struct VerifyOptions {
  bool functional = false;  // after functionalization: no in-place symbols but the epilogue
  bool reinfer = true;      // re-run meta functions and compare shapes/dtypes
  BuilderOptions builder;
};

// Empty when the trace is well formed; otherwise a description of the first violation.
std::string verify(const Trace& trace, const VerifyOptions& opts = {});

} // namespace keraunos

// The pipeline: a plain list of passes, each timed, optionally verified, every stage kept.
#pragma once
#include "keraunos/passes/pass.h"

#include <vector>

namespace keraunos {

// Runs the passes after acquisition. Returns every stage, the acquired trace first. In
// verify mode a broken invariant (or a false "unchanged" claim) raises an internal error
// naming the pass and printing the trace before and after it.
std::vector<Trace> run_pipeline(Trace acquired, const PassContext& ctx);

// Replaces each symbol by its decomposition, recursively, down to prims (tests run such
// traces to check decompositions against eager).
Trace flatten_to_prims(const Trace& trace);

} // namespace keraunos

// The torch executor: a trace printed as a Python function that calls torch (and the small
// helper modules `_kr` and `_prims` where torch has no one-to-one function).
#pragma once
#include "keraunos/ir/trace.h"

#include <string>

namespace keraunos {

// Source of `def <name>(<inputs>): ...` running the trace's top-level symbols through torch.
std::string torch_program(const Trace& trace, const std::string& name = "program");

// One top-level symbol as indented program lines (a region prints its members).
std::string torch_statement(const BoundSymbol& b);

} // namespace keraunos

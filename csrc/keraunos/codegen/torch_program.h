// The torch executor: a trace printed as a Python function that calls torch (and the small
// helper modules `_kr` and `_prims` where torch has no one-to-one function).
#pragma once
#include "keraunos/ir/trace.h"

#include <string>
#include <vector>

namespace keraunos {

// A program's text, statement by statement, that lets go of each tensor at its last use:
// after a statement, `del` of the tensors no later statement names (eager frees a temporary
// when its last reader is done; a function that holds every local until it returns peaks at
// the sum of its temporaries). A boxed program takes its inputs as one list and empties it,
// so it holds the only references to them and frees each input at its last use too (a
// backward's saved tensors, as AOTAutograd's boxed calling convention).
class ProgramWriter {
 public:
  ProgramWriter(const std::string& name, const std::vector<TensorRef>& inputs, bool boxed);
  // One statement (indented, newline-terminated lines) and the tensors it reads or binds.
  void add(std::string text, const std::vector<TensorRef>& reads, const std::vector<TensorRef>& binds);
  // A statement running one top-level symbol through torch (a region: each member).
  void add_torch(const BoundSymbol& b);
  std::string str() const;

 private:
  struct Statement {
    std::string text;
    std::vector<std::string> names;
  };
  std::string name_;
  std::vector<std::string> inputs_;
  bool boxed_;
  std::vector<Statement> statements_;
};

// Source of `def <name>(<inputs>): ...` running the trace's top-level symbols through torch
// (`def <name>(args):` when boxed).
std::string torch_program(const Trace& trace, const std::string& name = "program", bool boxed = false);

// One top-level symbol as indented program lines (a region prints its members).
std::string torch_statement(const BoundSymbol& b);

} // namespace keraunos

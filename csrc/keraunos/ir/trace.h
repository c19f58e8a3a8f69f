// Bound symbols and traces. A trace is a straight-line program over proxies; each bound symbol
// is one op applied to canonical arguments, with its decomposition into prims as subsymbols
// and the user's source location.
#pragma once
#include "keraunos/ir/value.h"
#include "keraunos/ir/symbols.h"

#include <memory>
#include <string>
#include <vector>

namespace keraunos {

struct SourceLoc {
  std::string file;
  int line = 0;
  std::string function;
  std::string str() const { return file + ":" + std::to_string(line); }
};

struct BoundSymbol {
  OpId op = OpId::kNumOps;
  Arg::List args;
  Arg out; // a tensor, a list of tensors, or None for statements (in-place ops, return)
  std::vector<BoundSymbol> subsymbols;
  std::shared_ptr<const SourceLoc> loc;

  const OpDef& def() const { return op_def(op); }
  // Tensors this symbol defines (its outputs).
  std::vector<TensorRef> outputs() const;
  // Tensors it reads (every tensor in its arguments).
  std::vector<TensorRef> inputs() const;
  // The tensor it writes in place, or nullptr.
  TensorRef written() const;
};

struct Trace {
  std::vector<TensorRef> inputs;
  std::vector<BoundSymbol> bsyms; // the last one is `return`
  std::string stage = "acquire";
  double ms = 0.0;

  const BoundSymbol& return_symbol() const;
  const Arg& output() const { return return_symbol().args.at(0); }
  // Python-like source of the trace; subsymbols appear as indented comments.
  std::string str(bool with_subsymbols = true) const;
};

// Prints one bound symbol as a line of source (`t2 = ltorch.add(t0, t1)`), without comments.
std::string bsym_line(const BoundSymbol& b);
// Canonical arguments printed Python-style, dropping trailing defaults.
std::string format_call_args(const OpDef& d, const Arg::List& args);

} // namespace keraunos

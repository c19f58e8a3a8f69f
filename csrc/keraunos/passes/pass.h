// What every pass shares: its context and result types, and trace rewriting helpers.
#pragma once
#include "keraunos/ir/trace.h"
#include "keraunos/ops/builder.h"

#include <string>
#include <unordered_map>

namespace keraunos {

struct PassContext {
  BuilderOptions builder;
  std::string fusion_type = "consecutive"; // or "dataflow"
  bool verify = false;                     // run the verifier after every pass
};

struct PassResult {
  Trace trace;
  bool changed = false; // the pipeline checks this claim in verify mode
};

using PassFn = PassResult (*)(const Trace&, const PassContext&);

// Replaces tensors by the map (by proxy identity), in arguments and subsymbols.
using ProxyMap = std::unordered_map<const TensorProxy*, TensorRef>;
Arg substitute(const Arg& a, const ProxyMap& m);
BoundSymbol substitute(const BoundSymbol& b, const ProxyMap& m);

// Whether `b` writes memory: an in-place op, or an op whose decomposition writes (batch_norm's
// running statistics).
bool writes_memory(const BoundSymbol& b);
// Bytes of memory a tensor keeps alive (a broadcast keeps only its base's elements).
int64_t memory_bytes(const TensorProxy& t);
// Whether a symbol is cheap to compute again where its value is needed instead of keeping it:
// an elementwise prim or an index remap; never a reduction, a matmul, a random draw, a torch
// call or an effect.
bool recomputable(const BoundSymbol& b);

// Whether a symbol must stay even when nothing reads its outputs (writes memory, draws
// random numbers, or returns).
bool has_effect(const BoundSymbol& b);

} // namespace keraunos

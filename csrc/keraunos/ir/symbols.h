// The symbols of the IR: one table (the X-macro lists in ir/*.def) from which the OpId enum,
// names, schemas, tags and torch callables come. Their implementations (meta functions and
// decompositions) live in ops/ (ops/op_table.h). A switch over OpId has no `default:`, so the
// compiler flags an op that a pass forgot.
#pragma once
#include "keraunos/ir/schema.h"

#include <cstdint>
#include <string_view>

namespace keraunos {

namespace tags {
inline constexpr uint32_t E = 1u << 0;  // elementwise
inline constexpr uint32_t R = 1u << 1;  // reduction
inline constexpr uint32_t V = 1u << 2;  // view: the output aliases an input's storage
inline constexpr uint32_t I = 1u << 3;  // in-place: writes its first tensor argument
inline constexpr uint32_t N = 1u << 4;  // random
inline constexpr uint32_t S = 1u << 5;  // side effect
inline constexpr uint32_t P = 1u << 6;  // prim: no decomposition
inline constexpr uint32_t C = 1u << 7;  // creation (no tensor inputs)
inline constexpr uint32_t T = 1u << 8;  // opaque: runs through torch only (matmul class)
inline constexpr uint32_t Ret = 1u << 9; // the return statement
inline constexpr uint32_t M = 1u << 10; // index remap (broadcast, reshape, permute, slice, ...)
inline constexpr uint32_t F = 1u << 11; // a fusion region (its members are its subsymbols)
// Costly per element: a transcendental (tens of dependent instructions). Kernel schedules use
// it (the CPU emitter splits long chains of them into stages; see cpu_emitter.cpp).
inline constexpr uint32_t X = 1u << 12;
// Data movement that is not a view: each output element is a copy of an input element picked
// by its index (concatenation, gathers). Fusible; the torch executor runs it as a fresh tensor.
inline constexpr uint32_t D = 1u << 13;
// A scan along one dim: each output element combines the input's elements up to it (cumsum).
// Fusible; a kernel computes it with a running accumulator (kir::LoopKind::Scan).
inline constexpr uint32_t Scan = 1u << 14;
} // namespace tags

enum class OpId : uint16_t {
#define KR_OP(id, schema, tg, torch_fn) id,
#define KR_INPLACE(id, base, torch_fn) id,
#include "keraunos/ir/ops.def"
#undef KR_OP
#undef KR_INPLACE
  kNumOps
};
inline constexpr int kNumOps = static_cast<int>(OpId::kNumOps);

struct OpDef {
  OpId id;
  std::string_view id_name; // e.g. "prim_add", "add", "add_"
  std::string_view name;    // printed name: "add" for both prims.add and ltorch.add
  Schema schema;
  uint32_t tags = 0;
  std::string_view torch_fn; // the Python callable the torch executor prints
  OpId inplace_of = OpId::kNumOps; // for in-place variants: the out-of-place op

  bool has(uint32_t t) const { return (tags & t) != 0; }
  bool is_prim() const { return has(tags::P); }
  bool is_inplace() const { return has(tags::I); }
  // "prims.add" / "ltorch.add"
  std::string qualified_name() const;
};

const OpDef& op_def(OpId id);
// Looks an op up by id name ("add", "prim_add"); nullptr when there is none.
const OpDef* find_op(std::string_view id_name);

} // namespace keraunos

#include "keraunos/ir/symbols.h"

#include "keraunos/ir/error.h"

#include <array>
#include <string>
#include <unordered_map>

namespace keraunos {

namespace {

// In-place variants share their base op's schema (with the name changed); their tags drop
// elementwise/reduction and add in-place.
struct Table {
  std::array<OpDef, kNumOps> defs;
  std::unordered_map<std::string_view, OpId> by_name;

  Table() {
    auto strip = [](std::string_view s) {
      return s.substr(0, 5) == "prim_" ? s.substr(5) : s;
    };
#define KR_OP(id_, schema_, tg, torch_fn_)                                                         \
  {                                                                                                \
    OpDef& d = defs[static_cast<int>(OpId::id_)];                                                  \
    d.id = OpId::id_;                                                                              \
    d.id_name = #id_;                                                                              \
    d.name = strip(#id_);                                                                          \
    d.schema = parse_schema(schema_);                                                              \
    d.tags = (tg);                                                                                 \
    d.torch_fn = torch_fn_;                                                                        \
  }
#define KR_INPLACE(id_, base, torch_fn_)
#include "keraunos/ir/ops.def"
#undef KR_OP
#undef KR_INPLACE
#define KR_OP(id_, schema_, tg, torch_fn_)
#define KR_INPLACE(id_, base, torch_fn_)                                                            \
  {                                                                                                \
    OpDef& d = defs[static_cast<int>(OpId::id_)];                                                  \
    const OpDef& bd = defs[static_cast<int>(OpId::base)];                                          \
    d.id = OpId::id_;                                                                              \
    d.id_name = #id_;                                                                              \
    d.name = #id_;                                                                                 \
    d.schema = bd.schema;                                                                          \
    d.schema.name = #id_;                                                                          \
    d.schema.returns = "Tensor(a!)";                                                               \
    d.tags = (bd.tags & ~(tags::E | tags::R)) | tags::I;                                           \
    d.torch_fn = torch_fn_;                                                                        \
    d.inplace_of = OpId::base;                                                                     \
  }
#include "keraunos/ir/ops.def"
#undef KR_OP
#undef KR_INPLACE
    for (const auto& d : defs) by_name.emplace(d.id_name, d.id);
  }
};

const Table& table() {
  static const Table t;
  return t;
}

} // namespace

std::string OpDef::qualified_name() const {
  if (has(tags::Ret)) return "return";
  return std::string(is_prim() ? "prims." : "ltorch.") + std::string(name);
}

const OpDef& op_def(OpId id) {
  KR_INTERNAL(static_cast<int>(id) < kNumOps, "bad op id");
  return table().defs[static_cast<int>(id)];
}

const OpDef* find_op(std::string_view id_name) {
  const auto& m = table().by_name;
  auto it = m.find(id_name);
  return it == m.end() ? nullptr : &op_def(it->second);
}

} // namespace keraunos

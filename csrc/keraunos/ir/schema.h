// Op signatures, written like PyTorch's native_functions.yaml (simplified) and parsed once.
// The binder turns a Python call (positional args + kwargs) into the canonical argument list
// every pass sees: one Arg per parameter, defaults filled, types checked.
#pragma once
#include "keraunos/ir/value.h"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace keraunos {

enum class ArgType {
  Tensor,       // Tensor
  TensorOrNum,  // Tensor|Scalar: a tensor or a Python number
  TensorList,   // Tensor[]
  OptTensorList, // Tensor?[]: entries may be None
  Scalar,       // a Python number
  Int,          // int
  IntList,      // int[] (a single int is accepted and wrapped)
  Float,        // float (ints accepted)
  Bool,         // bool
  Str,          // str
  ScalarType,   // ScalarType (a dtype)
  DeviceT,      // Device
  Index,        // an indexing expression (getitem/setitem)
  Any,          // anything
};

struct Param {
  std::string name;
  ArgType type = ArgType::Any;
  bool optional = false;   // `T?`: None is accepted
  bool kwarg_only = false; // after `*`
  bool has_default = false;
  Arg default_value;
};

struct Schema {
  std::string name;
  std::vector<Param> params;
  std::string returns;
  std::string str() const;
};

Schema parse_schema(std::string_view text);

using Kwargs = std::vector<std::pair<std::string, Arg>>;

// Binds a call to `schema`. `display` names the op in errors (e.g. "torch.sum").
Arg::List bind_args(const Schema& schema, const Arg::List& args, const Kwargs& kwargs,
                    std::string_view display);

} // namespace keraunos

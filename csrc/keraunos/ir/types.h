// dtypes, devices, shapes: the value types every other layer speaks.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace keraunos {

// X(enum, torch name, short name, itemsize, kind, c10 ScalarType name)
#define KERAUNOS_FOREACH_DTYPE(X)                                                                  \
  X(Bool, "bool", "b8", 1, Bool, "Bool")                                                           \
  X(UInt8, "uint8", "u8", 1, Int, "Byte")                                                          \
  X(Int8, "int8", "i8", 1, Int, "Char")                                                            \
  X(Int16, "int16", "i16", 2, Int, "Short")                                                        \
  X(Int32, "int32", "i32", 4, Int, "Int")                                                          \
  X(Int64, "int64", "i64", 8, Int, "Long")                                                         \
  X(Float16, "float16", "f16", 2, Float, "Half")                                                   \
  X(BFloat16, "bfloat16", "bf16", 2, Float, "BFloat16")                                            \
  X(Float32, "float32", "f32", 4, Float, "Float")                                                  \
  X(Float64, "float64", "f64", 8, Float, "Double")

enum class DType : uint8_t {
#define KR_X(e, n, s, sz, k, c) e,
  KERAUNOS_FOREACH_DTYPE(KR_X)
#undef KR_X
};
inline constexpr int kNumDTypes = 10;

enum class DTypeKind : uint8_t { Bool, Int, Float };

std::string_view dtype_name(DType d);  // "float32"
std::string_view dtype_short(DType d); // "f32"
std::string_view dtype_scalar_name(DType d); // c10's ScalarType name, as eager's errors say: "Float"
int itemsize(DType d);
DTypeKind dtype_kind(DType d);
inline bool is_float(DType d) { return dtype_kind(d) == DTypeKind::Float; }
inline bool is_int(DType d) { return dtype_kind(d) == DTypeKind::Int; }
inline bool is_bool(DType d) { return d == DType::Bool; }
bool dtype_from_name(std::string_view name, DType* out);
// torch.promote_types.
DType promote_types(DType a, DType b);
// Whether `from` can be cast to `to` by an in-place op (torch's canCast).
bool can_cast(DType from, DType to);

enum class DeviceType : uint8_t { CPU, CUDA };
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = -1; // -1: cpu; CUDA devices always carry an index once traced
  bool operator==(const Device&) const = default;
  std::string str() const;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t numel(const Shape& s);
Shape contiguous_strides(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); a user error naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op);

} // namespace keraunos

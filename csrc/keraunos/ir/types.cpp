#include "keraunos/ir/types.h"

#include "keraunos/ir/error.h"

#include <sstream>

namespace keraunos {

namespace {
struct DTypeInfo {
  std::string_view name, short_name;
  int size;
  DTypeKind kind;
  std::string_view scalar_name;
};
constexpr DTypeInfo kInfo[] = {
#define KR_X(e, n, s, sz, k, c) {n, s, sz, DTypeKind::k, c},
    KERAUNOS_FOREACH_DTYPE(KR_X)
#undef KR_X
};
const DTypeInfo& info(DType d) { return kInfo[static_cast<int>(d)]; }
} // namespace

std::string_view dtype_name(DType d) { return info(d).name; }
std::string_view dtype_short(DType d) { return info(d).short_name; }
std::string_view dtype_scalar_name(DType d) { return info(d).scalar_name; }
int itemsize(DType d) { return info(d).size; }
DTypeKind dtype_kind(DType d) { return info(d).kind; }

bool dtype_from_name(std::string_view name, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kInfo[i].name == name) {
      *out = static_cast<DType>(i);
      return true;
    }
  return false;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  const bool fa = is_float(a), fb = is_float(b);
  if (fa && fb) {
    if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
    return DType::Float32; // f16+bf16, f16+f32, bf16+f32
  }
  if (fa) return a;
  if (fb) return b;
  // Both integral. uint8 with a signed type needs the next wider signed type.
  if (a == DType::UInt8 || b == DType::UInt8) {
    DType other = a == DType::UInt8 ? b : a;
    return other == DType::Int8 ? DType::Int16 : other;
  }
  return itemsize(a) >= itemsize(b) ? a : b;
}

bool can_cast(DType from, DType to) {
  // torch: float -> integral and non-bool -> bool are not allowed.
  if (is_float(from) && !is_float(to)) return false;
  if (!is_bool(from) && is_bool(to)) return false;
  return true;
}

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return "cuda:" + std::to_string(index < 0 ? 0 : index);
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op) {
  int64_t n = std::max<int64_t>(ndim, 1); // 0-d tensors accept dim 0 and -1
  KR_CHECK(dim >= -n && dim < n, Index, op, ": Dimension out of range (expected to be in range of [",
           -n, ", ", n - 1, "], but got ", dim, ")");
  return dim < 0 ? dim + n : dim;
}

} // namespace keraunos

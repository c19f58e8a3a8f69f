// Proxies and arguments. A TensorProxy stands for a tensor during tracing: concrete shape,
// strides and storage offset (the cache key specializes on them), and the storage it lives in
// (views share their base's storage id; inputs that share memory share one id).
#pragma once
#include "keraunos/ir/types.h"

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace keraunos {

struct TensorProxy {
  std::string name;
  DType dtype = DType::Float32;
  Device device;
  Shape shape;
  Shape strides;
  int64_t storage_offset = 0;
  int64_t storage_id = -1;
  bool requires_grad = false;

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return keraunos::numel(shape); }
  bool is_contiguous() const;
  // One line: `cpu f32[4, 4]`, plus strides when they are not contiguous.
  std::string type_str() const;
};
using TensorRef = std::shared_ptr<const TensorProxy>;

struct Slice {
  std::optional<int64_t> start, stop;
  std::optional<int64_t> step;
  bool operator==(const Slice&) const = default;
};
struct EllipsisArg {
  bool operator==(const EllipsisArg&) const = default;
};
struct NoneArg {
  bool operator==(const NoneArg&) const = default;
};

// A bound argument: None, bool, int, float, str, dtype, device, tensor, slice, Ellipsis or a
// list of these. Python scalars are constants: the cache key specializes on their values.
struct Arg {
  using List = std::vector<Arg>;
  using Variant = std::variant<NoneArg, bool, int64_t, double, std::string, DType, Device,
                               TensorRef, Slice, EllipsisArg, List>;
  Variant v;

  Arg() : v(NoneArg{}) {}
  Arg(bool b) : v(b) {}
  Arg(int i) : v(int64_t{i}) {}
  Arg(int64_t i) : v(i) {}
  Arg(double d) : v(d) {}
  Arg(std::string s) : v(std::move(s)) {}
  Arg(const char* s) : v(std::string(s)) {}
  Arg(DType d) : v(d) {}
  Arg(Device d) : v(d) {}
  Arg(TensorRef t) : v(std::move(t)) {}
  Arg(Slice s) : v(s) {}
  Arg(EllipsisArg e) : v(e) {}
  Arg(List l) : v(std::move(l)) {}
  static Arg int_list(const Shape& s);
  static Arg tensor_list(const std::vector<TensorRef>& ts);

  bool is_none() const { return std::holds_alternative<NoneArg>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<int64_t>(v); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_str() const { return std::holds_alternative<std::string>(v); }
  bool is_dtype() const { return std::holds_alternative<DType>(v); }
  bool is_device() const { return std::holds_alternative<Device>(v); }
  bool is_tensor() const { return std::holds_alternative<TensorRef>(v); }
  bool is_slice() const { return std::holds_alternative<Slice>(v); }
  bool is_ellipsis() const { return std::holds_alternative<EllipsisArg>(v); }
  bool is_list() const { return std::holds_alternative<List>(v); }

  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const; // any number
  const std::string& as_str() const { return std::get<std::string>(v); }
  DType as_dtype() const { return std::get<DType>(v); }
  Device as_device() const { return std::get<Device>(v); }
  const TensorRef& tensor() const;
  const Slice& as_slice() const { return std::get<Slice>(v); }
  const List& list() const;
  Shape int_list() const;                  // an int or a list of ints
  std::vector<TensorRef> tensor_list() const;
  // The dtype a Python number takes in type promotion (bool, int64, or the default float).
  DType number_dtype() const;

  // Structural equality (tensors compare by identity).
  bool operator==(const Arg& o) const;

  // Python-like source text of the argument (tensors print as their names).
  std::string str() const;
  // Every tensor in this argument tree, in order.
  void collect_tensors(std::vector<TensorRef>& out) const;
};

} // namespace keraunos

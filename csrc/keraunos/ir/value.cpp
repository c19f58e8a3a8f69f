#include "keraunos/ir/value.h"

#include "keraunos/ir/error.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace keraunos {

bool TensorProxy::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = ndim() - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return numel() == 0;
    expected *= shape[i];
  }
  return true;
}

std::string TensorProxy::type_str() const {
  std::ostringstream os;
  os << device.str() << " " << dtype_short(dtype) << shape_str(shape);
  if (!is_contiguous()) os << " strides=" << shape_str(strides);
  if (storage_offset) os << " offset=" << storage_offset;
  return os.str();
}

Arg Arg::int_list(const Shape& s) {
  List l;
  l.reserve(s.size());
  for (auto i : s) l.emplace_back(i);
  return Arg(std::move(l));
}

Arg Arg::tensor_list(const std::vector<TensorRef>& ts) {
  List l;
  for (const auto& t : ts) l.emplace_back(t);
  return Arg(std::move(l));
}

bool Arg::as_bool() const {
  KR_INTERNAL(is_bool(), "expected a bool, got ", str());
  return std::get<bool>(v);
}

int64_t Arg::as_int() const {
  if (is_bool()) return std::get<bool>(v);
  KR_INTERNAL(is_int(), "expected an int, got ", str());
  return std::get<int64_t>(v);
}

double Arg::as_double() const {
  if (is_float()) return std::get<double>(v);
  return static_cast<double>(as_int());
}

const TensorRef& Arg::tensor() const {
  KR_INTERNAL(is_tensor(), "expected a tensor, got ", str());
  return std::get<TensorRef>(v);
}

const Arg::List& Arg::list() const {
  KR_INTERNAL(is_list(), "expected a list, got ", str());
  return std::get<List>(v);
}

Shape Arg::int_list() const {
  if (is_int()) return {as_int()};
  Shape s;
  for (const auto& a : list()) s.push_back(a.as_int());
  return s;
}

std::vector<TensorRef> Arg::tensor_list() const {
  std::vector<TensorRef> ts;
  for (const auto& a : list()) ts.push_back(a.tensor());
  return ts;
}

DType Arg::number_dtype() const {
  if (is_bool()) return DType::Bool;
  if (is_int()) return DType::Int64;
  KR_INTERNAL(is_float(), "expected a number, got ", str());
  return DType::Float32;
}

static std::string float_str(double d) {
  if (std::isnan(d)) return "float('nan')";
  if (std::isinf(d)) return d > 0 ? "float('inf')" : "float('-inf')";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  std::string s = buf;
  // Shortest round-tripping form.
  for (int prec = 1; prec < 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) {
      s = buf;
      break;
    }
  }
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string Arg::str() const {
  struct V {
    std::string operator()(NoneArg) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return float_str(d); }
    std::string operator()(const std::string& s) const { return "'" + s + "'"; }
    std::string operator()(DType d) const { return "torch." + std::string(dtype_name(d)); }
    std::string operator()(Device d) const { return "torch.device('" + d.str() + "')"; }
    std::string operator()(const TensorRef& t) const { return t->name; }
    std::string operator()(const Slice& s) const {
      auto o = [](const std::optional<int64_t>& x) { return x ? std::to_string(*x) : "None"; };
      return "slice(" + o(s.start) + ", " + o(s.stop) + ", " + o(s.step) + ")";
    }
    std::string operator()(EllipsisArg) const { return "..."; }
    std::string operator()(const List& l) const {
      std::string s = "[";
      for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + l[i].str();
      return s + "]";
    }
  };
  return std::visit(V{}, v);
}

bool Arg::operator==(const Arg& o) const {
  if (v.index() != o.v.index()) return false;
  if (is_list()) {
    const auto &a = list(), &b = o.list();
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!(a[i] == b[i])) return false;
    return true;
  }
  return v == o.v;
}

void Arg::collect_tensors(std::vector<TensorRef>& out) const {
  if (is_tensor()) {
    out.push_back(tensor());
  } else if (is_list()) {
    for (const auto& a : list()) a.collect_tensors(out);
  }
}

} // namespace keraunos

#include "keraunos/ir/schema.h"

#include "keraunos/ir/error.h"

#include <cctype>
#include <cstdlib>

namespace keraunos {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits on commas that are not nested in brackets.
std::vector<std::string_view> split_top(std::string_view s) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '[' || c == '(') ++depth;
    if (c == ']' || c == ')') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  auto last = trim(s.substr(start));
  if (!last.empty()) parts.push_back(last);
  return parts;
}

Arg parse_default(std::string_view v) {
  v = trim(v);
  if (v == "None") return Arg();
  if (v == "True") return Arg(true);
  if (v == "False") return Arg(false);
  if (!v.empty() && v.front() == '[') {
    Arg::List l;
    for (auto p : split_top(v.substr(1, v.size() - 2))) l.push_back(parse_default(p));
    return Arg(std::move(l));
  }
  if (!v.empty() && (v.front() == '"' || v.front() == '\''))
    return Arg(std::string(v.substr(1, v.size() - 2)));
  std::string s(v);
  if (s.find_first_of(".eE") != std::string::npos || s == "inf" || s == "-inf")
    return Arg(std::strtod(s.c_str(), nullptr));
  return Arg(static_cast<int64_t>(std::strtoll(s.c_str(), nullptr, 10)));
}

ArgType parse_type(std::string_view t) {
  if (t == "Tensor") return ArgType::Tensor;
  if (t == "Tensor|Scalar") return ArgType::TensorOrNum;
  if (t == "Tensor[]") return ArgType::TensorList;
  if (t == "Tensor?[]") return ArgType::OptTensorList;
  if (t == "Scalar") return ArgType::Scalar;
  if (t == "int") return ArgType::Int;
  if (t == "int[]") return ArgType::IntList;
  if (t == "float") return ArgType::Float;
  if (t == "bool") return ArgType::Bool;
  if (t == "str") return ArgType::Str;
  if (t == "ScalarType") return ArgType::ScalarType;
  if (t == "Device") return ArgType::DeviceT;
  if (t == "Index") return ArgType::Index;
  if (t == "Any") return ArgType::Any;
  KR_INTERNAL(false, "unknown schema type '", t, "'");
  return ArgType::Any;
}

const char* type_name(ArgType t) {
  switch (t) {
  case ArgType::Tensor: return "Tensor";
  case ArgType::TensorOrNum: return "Tensor or number";
  case ArgType::TensorList: return "sequence of Tensors";
  case ArgType::OptTensorList: return "sequence of optional Tensors";
  case ArgType::Scalar: return "number";
  case ArgType::Int: return "int";
  case ArgType::IntList: return "tuple of ints";
  case ArgType::Float: return "float";
  case ArgType::Bool: return "bool";
  case ArgType::Str: return "str";
  case ArgType::ScalarType: return "torch.dtype";
  case ArgType::DeviceT: return "torch.device";
  case ArgType::Index: return "index";
  case ArgType::Any: return "any";
  }
  return "?";
}

// Checks (and lightly normalizes) one argument against its parameter type.
bool accept(const Param& p, Arg& a) {
  if (a.is_none()) return p.optional || p.type == ArgType::Any;
  switch (p.type) {
  case ArgType::Tensor: return a.is_tensor();
  case ArgType::TensorOrNum: return a.is_tensor() || a.is_number();
  case ArgType::TensorList:
    if (!a.is_list()) return false;
    for (const auto& e : a.list())
      if (!e.is_tensor()) return false;
    return true;
  case ArgType::OptTensorList:
    if (!a.is_list()) return false;
    for (const auto& e : a.list())
      if (!e.is_tensor() && !e.is_none()) return false;
    return true;
  case ArgType::Scalar: return a.is_number();
  case ArgType::Int: return a.is_int() || a.is_bool();
  case ArgType::IntList:
    if (a.is_int()) {
      a = Arg(Arg::List{a});
      return true;
    }
    if (!a.is_list()) return false;
    for (const auto& e : a.list())
      if (!e.is_int()) return false;
    return true;
  case ArgType::Float:
    if (a.is_int()) a = Arg(static_cast<double>(a.as_int()));
    return a.is_float();
  case ArgType::Bool: return a.is_bool();
  case ArgType::Str: return a.is_str();
  case ArgType::ScalarType: return a.is_dtype();
  case ArgType::DeviceT: return a.is_device();
  case ArgType::Index:
  case ArgType::Any: return true;
  }
  return false;
}

std::string describe(const Arg& a) {
  if (a.is_tensor()) return "Tensor";
  if (a.is_bool()) return "bool";
  if (a.is_int()) return "int";
  if (a.is_float()) return "float";
  if (a.is_str()) return "str";
  if (a.is_none()) return "None";
  if (a.is_list()) return "list";
  if (a.is_dtype()) return "torch.dtype";
  if (a.is_device()) return "torch.device";
  return "object";
}

} // namespace

Schema parse_schema(std::string_view text) {
  Schema s;
  auto open = text.find('(');
  auto arrow_at = text.find("->");
  auto close = text.rfind(')', arrow_at == std::string_view::npos ? text.npos : arrow_at);
  KR_INTERNAL(open != std::string_view::npos && close != std::string_view::npos,
              "bad schema: ", text);
  s.name = std::string(trim(text.substr(0, open)));
  auto arrow = text.find("->", close);
  s.returns = arrow == std::string_view::npos ? "" : std::string(trim(text.substr(arrow + 2)));
  bool kwonly = false;
  for (auto part : split_top(text.substr(open + 1, close - open - 1))) {
    if (part == "*") {
      kwonly = true;
      continue;
    }
    Param p;
    p.kwarg_only = kwonly;
    auto eq = part.find('=');
    auto decl = trim(part.substr(0, eq));
    if (eq != std::string_view::npos) {
      p.has_default = true;
      p.default_value = parse_default(part.substr(eq + 1));
    }
    auto sp = decl.rfind(' ');
    KR_INTERNAL(sp != std::string_view::npos, "bad schema param: ", part);
    auto type = trim(decl.substr(0, sp));
    p.name = std::string(trim(decl.substr(sp + 1)));
    if (!type.empty() && type.back() == '?') {
      p.optional = true;
      type.remove_suffix(1);
    }
    p.type = parse_type(type);
    s.params.push_back(std::move(p));
  }
  return s;
}

std::string Schema::str() const {
  std::string out = name + "(";
  bool kw = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (i) out += ", ";
    if (p.kwarg_only && !kw) {
      out += "*, ";
      kw = true;
    }
    out += std::string(type_name(p.type)) + (p.optional ? "?" : "") + " " + p.name;
    if (p.has_default) out += "=" + p.default_value.str();
  }
  return out + ") -> " + returns;
}

Arg::List bind_args(const Schema& schema, const Arg::List& args, const Kwargs& kwargs,
                    std::string_view display) {
  const auto& ps = schema.params;
  Arg::List out(ps.size());
  std::vector<bool> set(ps.size(), false);
  size_t npos = 0;
  for (const auto& p : ps)
    if (!p.kwarg_only) ++npos;
  KR_CHECK(args.size() <= npos, Type, display, "() takes ", npos, " positional arguments but ",
           args.size(), " were given");
  for (size_t i = 0; i < args.size(); ++i) {
    out[i] = args[i];
    set[i] = true;
  }
  for (const auto& [name, value] : kwargs) {
    size_t i = 0;
    while (i < ps.size() && ps[i].name != name) ++i;
    KR_CHECK(i < ps.size(), Type, display, "() got an unexpected keyword argument '", name, "'");
    KR_CHECK(!set[i], Type, display, "() got multiple values for argument '", name, "'");
    out[i] = value;
    set[i] = true;
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!set[i]) {
      KR_CHECK(ps[i].has_default, Type, display, "() missing required argument '", ps[i].name,
               "'");
      out[i] = ps[i].default_value;
    }
    KR_CHECK(accept(ps[i], out[i]), Type, display, "(): argument '", ps[i].name, "' must be ",
             type_name(ps[i].type), (ps[i].optional ? " or None" : ""), ", not ",
             describe(out[i]));
  }
  return out;
}

} // namespace keraunos

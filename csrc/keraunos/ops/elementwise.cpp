// Elementwise language ops: PyTorch's broadcasting and type promotion, decomposed into prims
// that compute in float32 for float16/bfloat16 inputs (like eager's kernels) and convert back.
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/meta.h"

#include <cmath>
#include <limits>

namespace keraunos::ops {

namespace {

using P = Promotion;

TensorRef ew(Builder& b, OpId prim, const Arg::List& operands, P kind, std::string_view op) {
  return elementwise(b, prim, operands, kind, op);
}

void check_not_bool(const TensorRef& t, std::string_view op, std::string_view what) {
  KR_CHECK(t->dtype != DType::Bool, Runtime, op, ": ", what, " is not supported for bool tensors");
}

void check_integral(const Arg::List& operands, std::string_view op) {
  for (const auto& a : operands) {
    if (a.is_tensor())
      KR_CHECK(!is_float(a.tensor()->dtype), Runtime, op, ": not implemented for '",
               dtype_name(a.tensor()->dtype), "'");
    if (a.is_float())
      KR_USER_ERROR(Runtime, op, ": not implemented for float operands");
  }
}

// `a` in the computation dtype of `like` (a tensor produced by a prim in that dtype).
Arg num(double v) { return Arg(v); }

// Decompositions compute in float32 for reduced-precision floats.
struct Upcast {
  TensorRef x;
  DType result;
};
Upcast upcast(Builder& b, const TensorRef& a, P kind) {
  auto [compute, result] = promote({Arg(a)}, kind, b.options().default_float);
  return {to_dtype(b, Arg(a), compute).tensor(), result};
}
Arg finish(Builder& b, const TensorRef& t, DType result) { return to_dtype(b, Arg(t), result); }

TensorRef p1(Builder& b, OpId prim, const Arg& a) { return b.call(prim, {a}).tensor(); }
TensorRef p2(Builder& b, OpId prim, const Arg& a, const Arg& c) {
  return b.call(prim, {a, c}).tensor();
}
TensorRef p3(Builder& b, OpId prim, const Arg& a, const Arg& c, const Arg& d) {
  return b.call(prim, {a, c, d}).tensor();
}

} // namespace

#define KR_UNARY(n, kind, check)                                                                   \
  Arg impl_##n(Builder& b, const Arg::List& a) {                                                  \
    check;                                                                                         \
    return Arg(ew(b, OpId::prim_##n, {a[0]}, P::kind, "torch." #n));                               \
  }
#define KR_NOBOOL(n) check_not_bool(a[0].tensor(), "torch." #n, #n)
KR_UNARY(abs, Default, KR_NOBOOL(abs))
KR_UNARY(neg, Default,
         KR_CHECK(a[0].tensor()->dtype != DType::Bool, Runtime,
                  "Negation, the `-` operator, on a bool tensor is not supported. If you are "
                  "trying to invert a mask, use the `~` or `logical_not()` operator instead."))
KR_UNARY(exp, IntToFloat, )
KR_UNARY(exp2, IntToFloat, )
KR_UNARY(log, IntToFloat, )
KR_UNARY(log2, IntToFloat, )
KR_UNARY(log1p, IntToFloat, )
KR_UNARY(expm1, IntToFloat, )
KR_UNARY(sin, IntToFloat, )
KR_UNARY(cos, IntToFloat, )
KR_UNARY(tan, IntToFloat, )
KR_UNARY(tanh, IntToFloat, )
KR_UNARY(sigmoid, IntToFloat, )
KR_UNARY(sqrt, IntToFloat, )
KR_UNARY(rsqrt, IntToFloat, )
KR_UNARY(erf, IntToFloat, )
KR_UNARY(reciprocal, IntToFloat, )
KR_UNARY(floor, Default, KR_NOBOOL(floor))
KR_UNARY(ceil, Default, KR_NOBOOL(ceil))
KR_UNARY(round, Default, KR_NOBOOL(round))
KR_UNARY(trunc, Default, KR_NOBOOL(trunc))
KR_UNARY(sign, Default, )
KR_UNARY(isnan, AlwaysBool, )
KR_UNARY(isinf, AlwaysBool, )
KR_UNARY(logical_not, AlwaysBool, )
KR_UNARY(bitwise_not, Default, check_integral(a, "torch.bitwise_not"))
#undef KR_UNARY

Arg impl_isfinite(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  if (!is_float(x->dtype)) return Arg(p2(b, OpId::prim_eq, Arg(x), Arg(x)));
  auto nan = p1(b, OpId::prim_isnan, Arg(x));
  auto inf = p1(b, OpId::prim_isinf, Arg(x));
  auto bad = p2(b, OpId::prim_logical_or, Arg(nan), Arg(inf));
  return Arg(p1(b, OpId::prim_logical_not, Arg(bad)));
}

Arg impl_relu(Builder& b, const Arg::List& a) {
  KR_NOBOOL(relu);
  auto x = a[0].tensor();
  auto pos = p2(b, OpId::prim_gt, Arg(x), Arg(int64_t{0}));
  return Arg(p3(b, OpId::prim_where, Arg(pos), Arg(x), Arg(int64_t{0})));
}

Arg impl_silu(Builder& b, const Arg::List& a) {
  KR_CHECK(is_float(a[0].tensor()->dtype), Runtime, "silu: not implemented for '",
           dtype_name(a[0].tensor()->dtype), "'");
  auto [x, result] = upcast(b, a[0].tensor(), P::Default);
  auto s = p1(b, OpId::prim_sigmoid, Arg(x));
  return finish(b, p2(b, OpId::prim_mul, Arg(x), Arg(s)), result);
}

// a + alpha * b (sub: a - alpha * b).
static Arg add_sub(Builder& b, const Arg::List& a, OpId prim, std::string_view name) {
  Arg x = a[0], y = a[1];
  const Arg& alpha = a[2];
  for (const auto& t : {x, y})
    if (prim == OpId::prim_sub)
      KR_CHECK(!(t.is_tensor() ? t.tensor()->dtype == DType::Bool : t.is_bool()), Runtime,
               "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
               "trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  DType r = result_type({x, y}, b.options().default_float);
  if (alpha.is_float())
    KR_CHECK(is_float(r), Runtime, name,
             ": For integral input tensors, argument alpha must not be a floating point number.");
  if (!(alpha.is_int() && alpha.as_int() == 1) && !(alpha.is_bool() && alpha.as_bool())) {
    if (y.is_tensor()) {
      auto [compute, res] = promote({x, y}, P::Default, b.options().default_float);
      TensorRef yt = to_dtype(b, y, compute).tensor();
      y = Arg(b.call(OpId::prim_mul, {Arg(yt), alpha}).tensor());
      y = to_dtype(b, y, res);
    } else {
      y = Arg(y.as_double() * alpha.as_double());
      if (a[1].is_int() && alpha.is_int()) y = Arg(a[1].as_int() * alpha.as_int());
    }
  }
  return Arg(ew(b, prim, {x, y}, P::Default, name));
}
Arg impl_add(Builder& b, const Arg::List& a) { return add_sub(b, a, OpId::prim_add, "torch.add"); }
Arg impl_sub(Builder& b, const Arg::List& a) { return add_sub(b, a, OpId::prim_sub, "torch.sub"); }

Arg impl_mul(Builder& b, const Arg::List& a) {
  return Arg(ew(b, OpId::prim_mul, {a[0], a[1]}, P::Default, "torch.mul"));
}

Arg impl_div(Builder& b, const Arg::List& a) {
  const Arg& mode = a[2];
  if (mode.is_none()) {
    // Eager CUDA divides by a CPU scalar as a multiplication by its reciprocal, computed in the
    // opmath type (div_true_kernel_cuda); the CPU divides. Match the device's results.
    if (a[0].is_tensor() && a[0].tensor()->device.type == DeviceType::CUDA && a[1].is_number()) {
      DType r = result_type({a[0], a[1]}, b.options().default_float);
      if (is_float(r)) {
        double c = a[1].as_double();
        double inv = r == DType::Float64 ? 1.0 / c
                                         : static_cast<double>(1.0f / static_cast<float>(c));
        return Arg(ew(b, OpId::prim_mul, {a[0], Arg(inv)}, P::IntToFloat, "torch.div"));
      }
    }
    return Arg(ew(b, OpId::prim_div, {a[0], a[1]}, P::IntToFloat, "torch.div"));
  }
  const std::string& m = mode.as_str();
  KR_CHECK(m == "trunc" || m == "floor", Value,
           "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '", m,
           "'");
  DType r = result_type({a[0], a[1]}, b.options().default_float);
  if (m == "floor") return Arg(ew(b, OpId::prim_floor_divide, {a[0], a[1]}, P::Default, "torch.div"));
  if (!is_float(r)) return Arg(ew(b, OpId::prim_div, {a[0], a[1]}, P::Default, "torch.div"));
  auto [compute, res] = promote({a[0], a[1]}, P::Default, b.options().default_float);
  auto q = ew(b, OpId::prim_div, {a[0], a[1]}, P::Default, "torch.div");
  auto qc = to_dtype(b, Arg(q), compute).tensor();
  return finish(b, p1(b, OpId::prim_trunc, Arg(qc)), res);
}

#define KR_BINARY(n, kind, check)                                                                  \
  Arg impl_##n(Builder& b, const Arg::List& a) {                                                  \
    check;                                                                                         \
    return Arg(ew(b, OpId::prim_##n, {a[0], a[1]}, P::kind, "torch." #n));                          \
  }
KR_BINARY(floor_divide, Default, )
KR_BINARY(remainder, Default, )
KR_BINARY(fmod, Default, )
KR_BINARY(maximum, Default, )
KR_BINARY(minimum, Default, )
KR_BINARY(eq, AlwaysBool, )
KR_BINARY(ne, AlwaysBool, )
KR_BINARY(lt, AlwaysBool, )
KR_BINARY(le, AlwaysBool, )
KR_BINARY(gt, AlwaysBool, )
KR_BINARY(ge, AlwaysBool, )
KR_BINARY(logical_and, AlwaysBool, )
KR_BINARY(logical_or, AlwaysBool, )
KR_BINARY(logical_xor, AlwaysBool, )
KR_BINARY(bitwise_and, Default, check_integral(a, "torch.bitwise_and"))
KR_BINARY(bitwise_or, Default, check_integral(a, "torch.bitwise_or"))
KR_BINARY(bitwise_xor, Default, check_integral(a, "torch.bitwise_xor"))
#undef KR_BINARY

Arg impl_pow(Builder& b, const Arg::List& a) {
  DType r = result_type({a[0], a[1]}, b.options().default_float);
  if (!is_float(r) && a[1].is_int())
    KR_CHECK(a[1].as_int() >= 0, Runtime, "Integers to negative integer powers are not allowed.");
  return Arg(ew(b, OpId::prim_pow, {a[0], a[1]}, P::Default, "torch.pow"));
}

Arg impl_where(Builder& b, const Arg::List& a) {
  const auto& c = a[0].tensor();
  KR_CHECK(c->dtype == DType::Bool, Runtime,
           "where expected condition to be a boolean tensor, but got a tensor with dtype ",
           dtype_name(c->dtype));
  std::vector<Shape> shapes{c->shape};
  for (int i = 1; i < 3; ++i)
    if (a[i].is_tensor()) shapes.push_back(a[i].tensor()->shape);
  Shape shape = broadcast_shapes(shapes, "torch.where");
  auto [compute, result] = promote({a[1], a[2]}, P::Default, b.options().default_float);
  Arg::List args{Arg(expand_to(b, c, shape))};
  for (int i = 1; i < 3; ++i) {
    if (a[i].is_tensor()) {
      args.emplace_back(expand_to(b, to_dtype(b, a[i], result).tensor(), shape));
    } else if (!a[1].is_tensor() && !a[2].is_tensor()) {
      // Both scalars: materialize one so the prim has a tensor operand.
      args.push_back(b.call(OpId::prim_full, {Arg::int_list(shape), a[i], Arg(result),
                                              Arg(c->device)}));
    } else {
      args.push_back(a[i]);
    }
  }
  return b.call(OpId::prim_where, std::move(args));
}

Arg impl_clamp(Builder& b, const Arg::List& a) {
  const Arg &lo = a[1], &hi = a[2];
  KR_CHECK(!lo.is_none() || !hi.is_none(), Runtime,
           "torch.clamp: At least one of 'min' or 'max' must not be None");
  Arg::List ops{a[0]};
  if (!lo.is_none()) ops.push_back(lo);
  if (!hi.is_none()) ops.push_back(hi);
  auto [compute, result] = promote(ops, P::Default, b.options().default_float);
  std::vector<Shape> shapes;
  for (const auto& o : ops)
    if (o.is_tensor()) shapes.push_back(o.tensor()->shape);
  Shape shape = broadcast_shapes(shapes, "torch.clamp");
  auto prep = [&](const Arg& v) -> Arg {
    if (!v.is_tensor()) return v;
    return Arg(expand_to(b, to_dtype(b, v, compute).tensor(), shape));
  };
  TensorRef x = prep(a[0]).tensor();
  // clamp propagates NaN from the input: where(x < lo, lo, x) keeps x when it is NaN.
  if (!lo.is_none()) {
    Arg l = prep(lo);
    auto m = p2(b, OpId::prim_lt, Arg(x), l);
    x = p3(b, OpId::prim_where, Arg(m), l, Arg(x));
  }
  if (!hi.is_none()) {
    Arg h = prep(hi);
    auto m = p2(b, OpId::prim_gt, Arg(x), h);
    x = p3(b, OpId::prim_where, Arg(m), h, Arg(x));
  }
  return finish(b, x, result);
}

Arg impl_lerp(Builder& b, const Arg::List& a) {
  Arg::List ops{a[0], a[1], a[2]};
  for (const auto& o : ops)
    if (o.is_tensor())
      KR_CHECK(is_float(o.tensor()->dtype), Runtime, "lerp: expected floating point tensors");
  KR_CHECK(a[0].tensor()->dtype == a[1].tensor()->dtype, Runtime,
           "expected dtype ", dtype_name(a[0].tensor()->dtype), " for `end` but got dtype ",
           dtype_name(a[1].tensor()->dtype));
  std::vector<Shape> shapes{a[0].tensor()->shape, a[1].tensor()->shape};
  if (a[2].is_tensor()) shapes.push_back(a[2].tensor()->shape);
  Shape shape = broadcast_shapes(shapes, "torch.lerp");
  DType result = a[0].tensor()->dtype;
  DType compute = is_float(result) && itemsize(result) == 2 ? DType::Float32 : result;
  auto prep = [&](const Arg& v) -> Arg {
    if (!v.is_tensor()) return v;
    return Arg(expand_to(b, to_dtype(b, v, compute).tensor(), shape));
  };
  Arg s = prep(a[0]), e = prep(a[1]), w = prep(a[2]);
  // Eager's formula: weight < 0.5 ? start + weight * diff : end - diff * (1 - weight).
  auto diff = p2(b, OpId::prim_sub, e, s);
  auto lo = p2(b, OpId::prim_add, s, Arg(p2(b, OpId::prim_mul, w, Arg(diff))));
  Arg one_minus_w = w.is_tensor() ? Arg(p2(b, OpId::prim_sub, num(1.0), w)) : num(1.0 - w.as_double());
  auto hi = p2(b, OpId::prim_sub, e, Arg(p2(b, OpId::prim_mul, Arg(diff), one_minus_w)));
  TensorRef out;
  if (w.is_tensor()) {
    auto wabs = p1(b, OpId::prim_abs, w);
    auto m = p2(b, OpId::prim_lt, Arg(wabs), num(0.5));
    out = p3(b, OpId::prim_where, Arg(m), Arg(lo), Arg(hi));
  } else {
    out = std::abs(w.as_double()) < 0.5 ? lo : hi;
  }
  return finish(b, out, result);
}

static Arg addc(Builder& b, const Arg::List& a, OpId prim, std::string_view name) {
  Arg::List ops{a[0], a[1], a[2]};
  if (prim == OpId::prim_div)
    KR_CHECK(is_float(a[1].tensor()->dtype) || is_float(a[2].tensor()->dtype), Runtime,
             "Integer division with addcdiv is no longer supported.");
  std::vector<Shape> shapes{a[0].tensor()->shape, a[1].tensor()->shape, a[2].tensor()->shape};
  Shape shape = broadcast_shapes(shapes, name);
  auto [compute, result] = promote(ops, P::Default, b.options().default_float);
  auto prep = [&](const Arg& v) { return Arg(expand_to(b, to_dtype(b, v, compute).tensor(), shape)); };
  auto q = p2(b, prim, prep(a[1]), prep(a[2]));
  if (a[3].as_double() != 1.0) q = p2(b, OpId::prim_mul, Arg(q), a[3]);
  return finish(b, p2(b, OpId::prim_add, prep(a[0]), Arg(q)), result);
}
Arg impl_addcmul(Builder& b, const Arg::List& a) {
  return addc(b, a, OpId::prim_mul, "torch.addcmul");
}
Arg impl_addcdiv(Builder& b, const Arg::List& a) {
  return addc(b, a, OpId::prim_div, "torch.addcdiv");
}

Arg impl_nan_to_num(Builder& b, const Arg::List& a) {
  auto x = a[0].tensor();
  if (!is_float(x->dtype)) return b.call(OpId::prim_clone, {Arg(x)}); // a copy, like eager
  double big, nan = a[1].is_none() ? 0.0 : a[1].as_double();
  switch (x->dtype) {
  case DType::Float16: big = 65504.0; break;
  case DType::BFloat16: big = 3.3895313892515355e38; break;
  case DType::Float32: big = std::numeric_limits<float>::max(); break;
  default: big = std::numeric_limits<double>::max(); break;
  }
  double pinf = a[2].is_none() ? big : a[2].as_double();
  double ninf = a[3].is_none() ? -big : a[3].as_double();
  auto isnan = p1(b, OpId::prim_isnan, Arg(x));
  auto pos = p2(b, OpId::prim_eq, Arg(x), Arg(std::numeric_limits<double>::infinity()));
  auto neg = p2(b, OpId::prim_eq, Arg(x), Arg(-std::numeric_limits<double>::infinity()));
  auto y = p3(b, OpId::prim_where, Arg(isnan), num(nan), Arg(x));
  y = p3(b, OpId::prim_where, Arg(pos), num(pinf), Arg(y));
  return Arg(p3(b, OpId::prim_where, Arg(neg), num(ninf), Arg(y)));
}

Arg impl_gelu(Builder& b, const Arg::List& a) {
  const std::string& approx = a[1].as_str();
  KR_CHECK(approx == "none" || approx == "tanh", Runtime,
           "approximate argument must be either none or tanh.");
  KR_CHECK(is_float(a[0].tensor()->dtype), Runtime, "\"GeluKernelImpl\" not implemented for '",
           dtype_name(a[0].tensor()->dtype), "'");
  auto [x, result] = upcast(b, a[0].tensor(), P::Default);
  TensorRef inner;
  if (approx == "none") {
    // 0.5 * x * (1 + erf(x / sqrt(2)))
    auto e = p1(b, OpId::prim_erf, Arg(p2(b, OpId::prim_mul, Arg(x), num(M_SQRT1_2))));
    inner = p2(b, OpId::prim_add, num(1.0), Arg(e));
  } else {
    // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    auto x3 = p2(b, OpId::prim_mul, Arg(p2(b, OpId::prim_mul, Arg(x), Arg(x))), Arg(x));
    auto u = p2(b, OpId::prim_add, Arg(x), Arg(p2(b, OpId::prim_mul, Arg(x3), num(0.044715))));
    auto t = p1(b, OpId::prim_tanh, Arg(p2(b, OpId::prim_mul, Arg(u), num(M_2_SQRTPI * M_SQRT1_2))));
    inner = p2(b, OpId::prim_add, num(1.0), Arg(t));
  }
  auto y = p2(b, OpId::prim_mul, Arg(p2(b, OpId::prim_mul, Arg(x), num(0.5))), Arg(inner));
  return finish(b, y, result);
}

Arg impl_softplus(Builder& b, const Arg::List& a) {
  auto [x, result] = upcast(b, a[0].tensor(), P::Default);
  double beta = a[1].as_double(), thr = a[2].as_double();
  // x * beta > threshold ? x : log1p(exp(x * beta)) / beta
  auto xb = beta == 1.0 ? x : p2(b, OpId::prim_mul, Arg(x), num(beta));
  auto sp = p1(b, OpId::prim_log1p, Arg(p1(b, OpId::prim_exp, Arg(xb))));
  if (beta != 1.0) sp = p2(b, OpId::prim_div, Arg(sp), num(beta));
  auto m = p2(b, OpId::prim_gt, Arg(xb), num(thr));
  return finish(b, p3(b, OpId::prim_where, Arg(m), Arg(x), Arg(sp)), result);
}

Arg impl_leaky_relu(Builder& b, const Arg::List& a) {
  auto [x, result] = upcast(b, a[0].tensor(), P::Default);
  auto m = p2(b, OpId::prim_gt, Arg(x), Arg(int64_t{0}));
  auto neg = p2(b, OpId::prim_mul, Arg(x), a[1]);
  return finish(b, p3(b, OpId::prim_where, Arg(m), Arg(x), Arg(neg)), result);
}

Arg impl_elu(Builder& b, const Arg::List& a) {
  auto [x, result] = upcast(b, a[0].tensor(), P::Default);
  auto m = p2(b, OpId::prim_gt, Arg(x), Arg(int64_t{0}));
  auto neg = p2(b, OpId::prim_mul, Arg(p1(b, OpId::prim_expm1, Arg(x))), a[1]);
  return finish(b, p3(b, OpId::prim_where, Arg(m), Arg(x), Arg(neg)), result);
}

Arg impl_hardtanh(Builder& b, const Arg::List& a) {
  KR_NOBOOL(hardtanh);
  return b.call(OpId::clamp, {a[0], a[1], a[2]});
}

Arg impl_dropout(Builder& b, const Arg::List& a) {
  auto x = a[0].tensor();
  double p = a[1].as_double();
  KR_CHECK(p >= 0.0 && p <= 1.0, Value, "dropout probability has to be between 0 and 1, but got ",
           p);
  if (!a[2].as_bool() || p == 0.0) {
    // Eager returns the input itself.
    return a[0];
  }
  KR_CHECK(is_float(x->dtype), Runtime, "dropout: expected a floating point tensor");
  auto [xc, result] = upcast(b, x, P::Default);
  if (p == 1.0) return finish(b, p2(b, OpId::prim_mul, Arg(xc), num(0.0)), result);
  auto u = b.call(OpId::prim_uniform, {Arg::int_list(x->shape), num(0.0), num(1.0),
                                       Arg(xc->dtype), Arg(x->device)})
               .tensor();
  auto keep = p2(b, OpId::prim_lt, Arg(u), num(1.0 - p));
  auto scaled = p2(b, OpId::prim_mul, Arg(xc), num(1.0 / (1.0 - p)));
  return finish(b, p3(b, OpId::prim_where, Arg(keep), Arg(scaled), num(0.0)), result);
}

Arg impl_clone(Builder& b, const Arg::List& a) {
  // prim_clone keeps a dense layout and gives others TensorIterator's, like preserve_format.
  return b.call(OpId::prim_clone, {a[0]});
}

Arg impl_to(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  DType d = a[2].is_none() ? x->dtype : a[2].as_dtype();
  if (!a[1].is_none()) {
    Device dev = a[1].as_device();
    KR_CHECK(dev.type == x->device.type && (dev.index < 0 || dev.index == x->device.index),
             NotImplemented, "Tensor.to: moving a tensor from ", x->device.str(), " to ",
             dev.str(), " inside a jitted function is not supported yet");
  }
  if (d == x->dtype && !a[3].as_bool()) return a[0]; // eager returns self
  if (d == x->dtype) return b.call(OpId::prim_clone, {a[0]});
  return b.call(OpId::prim_convert_element_type, {a[0], Arg(d)});
}

} // namespace keraunos::ops

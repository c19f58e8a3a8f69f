// Backward rules of the prims (ops/backward.h). Each follows the formula of PyTorch's
// derivatives.yaml for the op the prim stands for, so gradients match eager's (ties of
// maximum/minimum split the gradient evenly, amax/amin spread it over every maximal element,
// the gradient of pow's exponent is 0 where the base is 0 and the exponent >= 0).
#include "keraunos/ops/backward.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/meta.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

namespace keraunos {

namespace {

using GR = GradRequest;

TensorRef P(Builder& b, OpId op, Arg::List args) { return b.call(op, std::move(args)).tensor(); }
TensorRef mul(Builder& b, Arg x, Arg y) { return P(b, OpId::prim_mul, {std::move(x), std::move(y)}); }
TensorRef div(Builder& b, Arg x, Arg y) { return P(b, OpId::prim_div, {std::move(x), std::move(y)}); }
TensorRef add(Builder& b, Arg x, Arg y) { return P(b, OpId::prim_add, {std::move(x), std::move(y)}); }
TensorRef sub(Builder& b, Arg x, Arg y) { return P(b, OpId::prim_sub, {std::move(x), std::move(y)}); }
TensorRef neg(Builder& b, Arg x) { return P(b, OpId::prim_neg, {std::move(x)}); }
TensorRef where(Builder& b, Arg c, Arg x, Arg y) {
  return P(b, OpId::prim_where, {std::move(c), std::move(x), std::move(y)});
}
TensorRef zeros(Builder& b, const Shape& shape, DType dtype, Device device) {
  return P(b, OpId::prim_full, {Arg::int_list(shape), Arg(0.0), Arg(dtype), Arg(device)});
}
TensorRef zeros_like(Builder& b, const TensorRef& t) {
  return zeros(b, t->shape, t->dtype, t->device);
}
TensorRef reshape(Builder& b, const TensorRef& t, const Shape& shape) {
  if (t->shape == shape) return t;
  return P(b, OpId::prim_reshape, {Arg(t), Arg::int_list(shape)});
}
// `t` broadcast back to `shape`, its dims being `shape`'s dims `kept`.
TensorRef bcast(Builder& b, const TensorRef& t, const Shape& shape, const Shape& kept) {
  return P(b, OpId::prim_broadcast_in_dim, {Arg(t), Arg::int_list(shape), Arg::int_list(kept)});
}
// One-hot sums. A gradient that is nonzero at one position along a dim d (gather's backward,
// where(index == iota, g, 0), then scaled by values constant along d) sums over d to the value
// at that position: the reduction becomes pointwise work on the reduced shape (the
// cross-entropy backward's row sum of its one-hot gradient). Each function matches with
// `emit` false (returning the tensor itself as "yes") and builds with it true.
//
// `t` constant along d (a broadcast that maps no dim of size > 1 to d), as a tensor of the
// reduced shape `red`; null when it is not.
TensorRef along_free(Builder& b, const TensorRef& t, int64_t d, const Shape& red, bool emit) {
  const BoundSymbol* m = b.producer(t);
  if (!m || m->op != OpId::prim_broadcast_in_dim) return nullptr;
  // (Copies: emitting a symbol may move the scope that `m` points into.)
  const TensorRef src = m->args[0].tensor();
  const Shape bdims = m->args[2].int_list();
  Shape s2, bd2;
  for (size_t i = 0; i < bdims.size(); ++i) {
    if (bdims[i] == d) {
      if (src->shape[i] != 1) return nullptr;
      continue;
    }
    s2.push_back(src->shape[i]);
    bd2.push_back(bdims[i] > d ? bdims[i] - 1 : bdims[i]);
  }
  if (!emit) return t;
  TensorRef r = src->shape == s2 ? src : P(b, OpId::prim_reshape, {Arg(src), Arg::int_list(s2)});
  bool identity = s2 == red;
  for (size_t i = 0; identity && i < bd2.size(); ++i) identity = bd2[i] == static_cast<int64_t>(i);
  return identity ? r : bcast(b, r, red, bd2);
}
// iota(n) broadcast along d (start 0, step 1, n = t's size along d).
bool iota_along(Builder& b, const TensorRef& t, int64_t d) {
  const BoundSymbol* m = b.producer(t);
  if (!m || m->op != OpId::prim_broadcast_in_dim || m->args[2].int_list() != Shape{d}) return false;
  const BoundSymbol* i = b.producer(m->args[0].tensor());
  return i && i->op == OpId::prim_iota && i->args[0].as_int() == t->shape[d] &&
         i->args[1].as_int() == 0 && i->args[2].as_int() == 1;
}
TensorRef onehot_sum(Builder& b, const TensorRef& t, int64_t d, const Shape& red, bool emit) {
  const BoundSymbol* m = b.producer(t);
  if (!m || !m->out.is_tensor() || m->out.tensor() != t) return nullptr;
  // Copies: emitting a symbol may move the scope that `m` points into.
  const Arg::List a = m->args;
  const OpId op = m->op;
  auto inner = [&](size_t i) -> TensorRef {
    return a[i].is_tensor() ? onehot_sum(b, a[i].tensor(), d, red, emit) : nullptr;
  };
  auto free_arg = [&](size_t i) -> std::optional<Arg> {
    if (a[i].is_number()) return a[i];
    if (!a[i].is_tensor()) return std::nullopt;
    TensorRef f = along_free(b, a[i].tensor(), d, red, emit);
    if (!f) return std::nullopt;
    return Arg(f);
  };
  switch (op) {
  case OpId::prim_where: {
    if (!a[2].is_number() || a[2].as_double() != 0.0 || !a[1].is_tensor() || !a[0].is_tensor())
      return nullptr;
    const BoundSymbol* c = b.producer(a[0].tensor());
    if (!c || c->op != OpId::prim_eq || !c->args[0].is_tensor() || !c->args[1].is_tensor())
      return nullptr;
    const TensorRef p = c->args[0].tensor();
    const TensorRef q = c->args[1].tensor();
    const TensorRef idx = iota_along(b, q, d) ? p : iota_along(b, p, d) ? q : nullptr;
    if (!idx || !is_int(idx->dtype)) return nullptr;
    TensorRef idx_r = along_free(b, idx, d, red, emit);
    TensorRef v = along_free(b, a[1].tensor(), d, red, emit);
    if (!idx_r || !v) return nullptr;
    if (!emit) return t;
    // The picked value where the index is in [0, n) (an index outside picks nothing).
    auto in_range = P(b, OpId::prim_logical_and,
                      {Arg(P(b, OpId::prim_ge, {Arg(idx_r), Arg(int64_t{0})})),
                       Arg(P(b, OpId::prim_lt, {Arg(idx_r), Arg(t->shape[d])}))});
    return where(b, Arg(in_range), Arg(v), Arg(0.0));
  }
  case OpId::prim_neg: {
    TensorRef x = inner(0);
    return x && emit ? neg(b, Arg(x)) : x;
  }
  case OpId::prim_convert_element_type: {
    TensorRef x = inner(0);
    return x && emit ? P(b, OpId::prim_convert_element_type, {Arg(x), a[1]}) : x;
  }
  case OpId::prim_mul:
  case OpId::prim_div: {
    // (one-hot) * c, c * (one-hot), (one-hot) / c, for c constant along d.
    for (size_t i : {size_t{0}, size_t{1}}) {
      if (op == OpId::prim_div && i == 1) break;
      if (!a[i].is_tensor() || !onehot_sum(b, a[i].tensor(), d, red, false)) continue;
      if (!free_arg(1 - i)) continue;
      if (!emit) return t;
      TensorRef x = inner(i);
      Arg f = *free_arg(1 - i);
      if (op == OpId::prim_div) return div(b, Arg(x), f);
      return i == 0 ? mul(b, Arg(x), f) : mul(b, f, Arg(x));
    }
    return nullptr;
  }
  default:
    return nullptr;
  }
}
TensorRef sum(Builder& b, const TensorRef& t, const Shape& dims) {
  if (dims.empty()) return t;
  if (dims.size() == 1 && is_float(t->dtype) && t->shape[dims[0]] > 0) {
    Shape red;
    for (int64_t i = 0; i < t->ndim(); ++i)
      if (i != dims[0]) red.push_back(t->shape[i]);
    if (onehot_sum(b, t, dims[0], red, false)) {
      TensorRef r = onehot_sum(b, t, dims[0], red, true);
      if (r->shape == red && r->dtype == t->dtype) return r;
    }
  }
  return P(b, OpId::prim_sum, {Arg(t), Arg::int_list(dims)});
}
// `t` summed down to `shape` (torch's sum_to_size): leading dims and dims broadcast from 1.
TensorRef sum_to(Builder& b, const TensorRef& t, const Shape& shape) {
  if (t->shape == shape) return t;
  const int64_t lead = t->ndim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t d = 0; d < t->ndim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && t->shape[d] != 1)) dims.push_back(d);
  return reshape(b, sum(b, t, dims), shape);
}
Shape kept_dims(int64_t ndim, const Shape& reduced) {
  Shape kept;
  for (int64_t d = 0; d < ndim; ++d)
    if (std::find(reduced.begin(), reduced.end(), d) == reduced.end()) kept.push_back(d);
  return kept;
}
const TensorRef& out(const GR& r) { return r.bsym.out.tensor(); }
const TensorRef& x0(const GR& r) { return r.bsym.args[0].tensor(); }
Arg::List only(const GR& r, size_t i, TensorRef g) {
  Arg::List res(r.bsym.args.size());
  res[i] = Arg(std::move(g));
  return res;
}

// Unary: d out / d a as a function of (a, out), times the gradient.
#define KR_UNARY_GRAD(name, expr)                                                                  \
  Arg::List grad_##name(Builder& b, const GR& r) {                                                 \
    const TensorRef& g = r.grad;                                                                   \
    const TensorRef& x = x0(r);                                                                    \
    const TensorRef& y = out(r);                                                                   \
    (void)x;                                                                                       \
    (void)y;                                                                                       \
    return only(r, 0, expr);                                                                       \
  }
KR_UNARY_GRAD(clone, g)
KR_UNARY_GRAD(restride, g)
KR_UNARY_GRAD(abs, mul(b, Arg(g), Arg(P(b, OpId::prim_sign, {Arg(x)}))))
KR_UNARY_GRAD(neg, neg(b, Arg(g)))
KR_UNARY_GRAD(exp, mul(b, Arg(g), Arg(y)))
KR_UNARY_GRAD(exp2, mul(b, Arg(g), Arg(mul(b, Arg(y), Arg(std::log(2.0))))))
KR_UNARY_GRAD(log, div(b, Arg(g), Arg(x)))
KR_UNARY_GRAD(log2, div(b, Arg(g), Arg(mul(b, Arg(x), Arg(std::log(2.0))))))
KR_UNARY_GRAD(log1p, div(b, Arg(g), Arg(add(b, Arg(x), Arg(1.0)))))
KR_UNARY_GRAD(expm1, mul(b, Arg(g), Arg(add(b, Arg(y), Arg(1.0)))))
KR_UNARY_GRAD(sin, mul(b, Arg(g), Arg(P(b, OpId::prim_cos, {Arg(x)}))))
KR_UNARY_GRAD(cos, neg(b, Arg(mul(b, Arg(g), Arg(P(b, OpId::prim_sin, {Arg(x)}))))))
KR_UNARY_GRAD(tan, mul(b, Arg(g), Arg(add(b, Arg(1.0), Arg(mul(b, Arg(y), Arg(y)))))))
KR_UNARY_GRAD(tanh, mul(b, Arg(g), Arg(sub(b, Arg(1.0), Arg(mul(b, Arg(y), Arg(y)))))))
KR_UNARY_GRAD(sigmoid, mul(b, Arg(g), Arg(mul(b, Arg(y), Arg(sub(b, Arg(1.0), Arg(y)))))))
KR_UNARY_GRAD(sqrt, div(b, Arg(g), Arg(mul(b, Arg(y), Arg(2.0)))))
KR_UNARY_GRAD(rsqrt, mul(b, Arg(g), Arg(mul(b, Arg(mul(b, Arg(y), Arg(mul(b, Arg(y), Arg(y))))), Arg(-0.5)))))
KR_UNARY_GRAD(erf, mul(b, Arg(g), Arg(mul(b, Arg(P(b, OpId::prim_exp, {Arg(neg(b, Arg(mul(b, Arg(x), Arg(x)))))})), Arg(2.0 / std::sqrt(M_PI))))))
KR_UNARY_GRAD(reciprocal, neg(b, Arg(mul(b, Arg(g), Arg(mul(b, Arg(y), Arg(y)))))))
// Piecewise constant: a zero gradient (eager's too).
KR_UNARY_GRAD(zero, zeros_like(b, x))
#undef KR_UNARY_GRAD

// Binary elementwise: either operand may be a Python number (no gradient).
Arg::List grad_add(Builder& b, const GR& r) {
  Arg::List res(2);
  if (r.needs[0]) res[0] = Arg(r.grad);
  if (r.needs[1]) res[1] = Arg(r.grad);
  return res;
}
Arg::List grad_sub(Builder& b, const GR& r) {
  Arg::List res(2);
  if (r.needs[0]) res[0] = Arg(r.grad);
  if (r.needs[1]) res[1] = Arg(neg(b, Arg(r.grad)));
  return res;
}
Arg::List grad_mul(Builder& b, const GR& r) {
  const auto& a = r.bsym.args;
  Arg::List res(2);
  if (r.needs[0]) res[0] = Arg(mul(b, Arg(r.grad), a[1]));
  if (r.needs[1]) res[1] = Arg(mul(b, Arg(r.grad), a[0]));
  return res;
}
Arg::List grad_div(Builder& b, const GR& r) {
  const auto& a = r.bsym.args;
  Arg::List res(2);
  if (r.needs[0]) res[0] = Arg(div(b, Arg(r.grad), a[1]));
  if (r.needs[1]) // -g * a / b^2
    res[1] = Arg(neg(b, Arg(div(b, Arg(mul(b, Arg(r.grad), a[0])), Arg(mul(b, a[1], a[1]))))));
  return res;
}
// remainder: b's gradient is -g * floor(a / b); fmod: -g * trunc(a / b).
template <OpId Round>
Arg::List grad_mod(Builder& b, const GR& r) {
  const auto& a = r.bsym.args;
  Arg::List res(2);
  if (r.needs[0]) res[0] = Arg(r.grad);
  if (r.needs[1])
    res[1] = Arg(neg(b, Arg(mul(b, Arg(r.grad), Arg(P(b, Round, {Arg(div(b, a[0], a[1]))}))))));
  return res;
}
Arg::List grad_pow(Builder& b, const GR& r) {
  const auto& a = r.bsym.args;
  const TensorRef& g = r.grad;
  Arg::List res(2);
  if (r.needs[0]) {
    const TensorRef& x = a[0].tensor();
    if (a[1].is_tensor()) {
      const TensorRef& e = a[1].tensor();
      auto t = mul(b, Arg(g), Arg(mul(b, Arg(e), Arg(P(b, OpId::prim_pow, {Arg(x), Arg(sub(b, Arg(e), Arg(1.0)))})))));
      res[0] = Arg(where(b, Arg(P(b, OpId::prim_eq, {Arg(e), Arg(0.0)})), Arg(0.0), Arg(t)));
    } else if (a[1].as_double() == 0.0) {
      res[0] = Arg(zeros_like(b, x));
    } else {
      double e = a[1].as_double();
      res[0] = Arg(mul(b, Arg(g), Arg(mul(b, Arg(P(b, OpId::prim_pow, {Arg(x), Arg(e - 1.0)})), Arg(e)))));
    }
  }
  if (r.needs[1]) {
    const TensorRef& e = a[1].tensor();
    const TensorRef& y = out(r);
    TensorRef t, mask;
    if (a[0].is_tensor()) {
      t = mul(b, Arg(g), Arg(mul(b, Arg(y), Arg(P(b, OpId::prim_log, {a[0]})))));
      mask = P(b, OpId::prim_logical_and, {Arg(P(b, OpId::prim_eq, {a[0], Arg(0.0)})),
                                           Arg(P(b, OpId::prim_ge, {Arg(e), Arg(0.0)}))});
    } else {
      const double base = a[0].as_double();
      t = mul(b, Arg(g), Arg(mul(b, Arg(y), Arg(std::log(base)))));
      if (base == 0.0) mask = P(b, OpId::prim_ge, {Arg(e), Arg(0.0)});
    }
    res[1] = Arg(mask ? where(b, Arg(mask), Arg(0.0), Arg(t)) : t);
  }
  return res;
}
// maximum: the gradient goes to the larger operand, half to each on a tie (eager's rule).
template <bool Max>
Arg::List grad_extremum(Builder& b, const GR& r) {
  const auto& a = r.bsym.args;
  const TensorRef& g = r.grad;
  auto tie = P(b, OpId::prim_eq, {a[0], a[1]});
  auto shared = where(b, Arg(tie), Arg(mul(b, Arg(g), Arg(0.5))), Arg(g));
  const OpId loses_a = Max ? OpId::prim_lt : OpId::prim_gt;
  const OpId loses_b = Max ? OpId::prim_gt : OpId::prim_lt;
  Arg::List res(2);
  if (r.needs[0]) res[0] = Arg(where(b, Arg(P(b, loses_a, {a[0], a[1]})), Arg(0.0), Arg(shared)));
  if (r.needs[1]) res[1] = Arg(where(b, Arg(P(b, loses_b, {a[0], a[1]})), Arg(0.0), Arg(shared)));
  return res;
}
Arg::List grad_where(Builder& b, const GR& r) {
  const auto& a = r.bsym.args;
  Arg::List res(3);
  if (r.needs[1]) res[1] = Arg(where(b, a[0], Arg(r.grad), Arg(0.0)));
  if (r.needs[2]) res[2] = Arg(where(b, a[0], Arg(0.0), Arg(r.grad)));
  return res;
}
Arg::List grad_convert(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  return only(r, 0, P(b, OpId::prim_convert_element_type, {Arg(r.grad), Arg(x->dtype)}));
}

// Index remaps.
Arg::List grad_broadcast_in_dim(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const Shape shape = r.bsym.args[1].int_list();
  const Shape bdims = r.bsym.args[2].int_list();
  Shape red;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    auto it = std::find(bdims.begin(), bdims.end(), d);
    if (it == bdims.end() || (x->shape[it - bdims.begin()] == 1 && shape[d] != 1)) red.push_back(d);
  }
  return only(r, 0, reshape(b, sum(b, r.grad, red), x->shape));
}
Arg::List grad_reshape(Builder& b, const GR& r) { return only(r, 0, reshape(b, r.grad, x0(r)->shape)); }
Arg::List grad_permute(Builder& b, const GR& r) {
  const Shape dims = r.bsym.args[1].int_list();
  Shape inv(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inv[dims[i]] = static_cast<int64_t>(i);
  // A matrix's transpose whose gradient is a matrix product: (A B)^T = B^T A^T, so the
  // gradient (a weight's, of F.linear) comes out in the matrix's own layout, as eager's mm
  // backward makes it, not as a transposed view to copy.
  const BoundSymbol* made = b.producer(r.grad);
  if (dims == Shape{1, 0} && made && made->op == OpId::prim_matmul) {
    // Copies: emitting a symbol may move the scope that `made` points into.
    const TensorRef a = made->args[0].tensor();
    const TensorRef c = made->args[1].tensor();
    if (a->ndim() == 2 && c->ndim() == 2)
      return only(r, 0, P(b, OpId::prim_matmul, {Arg(P(b, OpId::prim_permute, {Arg(c), Arg::int_list({1, 0})})),
                                                 Arg(P(b, OpId::prim_permute, {Arg(a), Arg::int_list({1, 0})}))}));
  }
  return only(r, 0, P(b, OpId::prim_permute, {Arg(r.grad), Arg::int_list(inv)}));
}
// Zeros of `span` elements with `g` written at the strided positions (g's sizes, `stride`,
// `offset`) of that flat span.
TensorRef flat_scatter(Builder& b, const TensorRef& g, int64_t span, const Shape& stride, int64_t offset) {
  auto flat = zeros(b, {span}, g->dtype, g->device);
  return P(b, OpId::prim_as_strided_scatter,
           {Arg(flat), Arg(g), Arg::int_list(g->shape), Arg::int_list(stride), Arg(offset)});
}
// `g` written into zeros of `shape` at the strided positions (size, stride, offset) of a
// contiguous tensor of that shape.
TensorRef scatter_into_zeros(Builder& b, const TensorRef& g, const Shape& shape, const Shape& stride,
                             int64_t offset) {
  return reshape(b, flat_scatter(b, g, numel(shape), stride, offset), shape);
}
// `g` placed at `start` (per dim) in zeros of `shape`: zeros concatenated before and after it
// along each dim where it is smaller (a kernel computes it; see prim_cat).
TensorRef pad_with_zeros(Builder& b, const TensorRef& g, const Shape& shape, const Shape& start) {
  TensorRef cur = g;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const int64_t before = start[d], after = shape[d] - start[d] - cur->shape[d];
    if (before <= 0 && after <= 0) continue;
    std::vector<TensorRef> parts;
    Shape s = cur->shape;
    if (before > 0) {
      s[d] = before;
      parts.push_back(zeros(b, s, cur->dtype, cur->device));
    }
    parts.push_back(cur);
    if (after > 0) {
      s[d] = after;
      parts.push_back(zeros(b, s, cur->dtype, cur->device));
    }
    cur = P(b, OpId::prim_cat, {Arg::tensor_list(parts), Arg(d)});
  }
  return cur;
}
Arg::List grad_slice(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const Shape start = r.bsym.args[1].int_list(), end = r.bsym.args[2].int_list(),
              step = r.bsym.args[3].int_list();
  bool unit = std::all_of(step.begin(), step.end(), [](int64_t s) { return s == 1; });
  if (!unit) {
    const Shape cs = contiguous_strides(x->shape);
    Shape stride(cs.size());
    int64_t offset = 0;
    for (size_t d = 0; d < cs.size(); ++d) {
      stride[d] = cs[d] * step[d];
      offset += start[d] * cs[d];
    }
    return only(r, 0, scatter_into_zeros(b, r.grad, x->shape, stride, offset));
  }
  return only(r, 0, pad_with_zeros(b, r.grad, x->shape, start));
}
Arg::List grad_squeeze(Builder& b, const GR& r) { return only(r, 0, reshape(b, r.grad, x0(r)->shape)); }
Arg::List grad_diagonal(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const int64_t offset = r.bsym.args[1].as_int(), d1 = r.bsym.args[2].as_int(),
                d2 = r.bsym.args[3].as_int();
  const Shape cs = contiguous_strides(x->shape);
  Shape stride;
  for (int64_t d = 0; d < x->ndim(); ++d)
    if (d != d1 && d != d2) stride.push_back(cs[d]);
  stride.push_back(cs[d1] + cs[d2]);
  const int64_t start = offset >= 0 ? offset * cs[d2] : -offset * cs[d1];
  return only(r, 0, scatter_into_zeros(b, r.grad, x->shape, stride, start));
}
Arg::List grad_cat(Builder& b, const GR& r) {
  const auto parts = r.bsym.args[0].tensor_list();
  const int64_t dim = r.bsym.args[1].as_int();
  const TensorRef& g = r.grad;
  Arg::List grads;
  int64_t off = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t n = parts[i]->shape[dim];
    if (r.list_needs[0][i]) {
      Shape start(g->ndim(), 0), end = g->shape, step(g->ndim(), 1);
      start[dim] = off;
      end[dim] = off + n;
      grads.push_back(Arg(P(b, OpId::prim_slice, {Arg(g), Arg::int_list(start), Arg::int_list(end),
                                                  Arg::int_list(step)})));
    } else {
      grads.push_back(Arg());
    }
    off += n;
  }
  Arg::List res(2);
  res[0] = Arg(std::move(grads));
  return res;
}
TensorRef as_long(Builder& b, const TensorRef& t) {
  if (t->dtype == DType::Int64) return t;
  return P(b, OpId::prim_convert_element_type, {Arg(t), Arg(DType::Int64)});
}
// take: the gradient accumulated into zeros at the taken rows (index_add).
Arg::List grad_take(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const int64_t dim = r.bsym.args[2].as_int();
  Arg::List indices(dim);
  indices.push_back(Arg(as_long(b, r.bsym.args[1].tensor())));
  return only(r, 0, P(b, OpId::prim_index_put, {Arg(zeros_like(b, x)), Arg(std::move(indices)),
                                                Arg(r.grad), Arg(true)}));
}
// gather: scatter_add of the gradient, as an accumulating index_put with every index spelled.
Arg::List grad_gather(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const int64_t dim = r.bsym.args[1].as_int();
  const TensorRef& index = r.bsym.args[2].tensor();
  // One index per row along `dim` (cross-entropy's pick of the target's log-probability): each
  // element of x receives the gradient of the one position that picked it, or 0, so the
  // gradient is pointwise, fusible with what produced it: where(index == iota, grad, 0).
  bool one_pick = index->shape[dim] == 1;
  for (int64_t d = 0; d < index->ndim(); ++d)
    one_pick = one_pick && (d == dim || index->shape[d] == x->shape[d]);
  if (one_pick && x->numel() > 0) {
    Shape all(x->ndim());
    for (int64_t d = 0; d < x->ndim(); ++d) all[d] = d;
    auto iota = P(b, OpId::prim_iota, {Arg(x->shape[dim]), Arg(int64_t{0}), Arg(int64_t{1}),
                                       Arg(DType::Int64), Arg(index->device)});
    auto hit = P(b, OpId::prim_eq, {Arg(bcast(b, as_long(b, index), x->shape, all)),
                                    Arg(bcast(b, iota, x->shape, {dim}))});
    return only(r, 0, where(b, Arg(hit), Arg(bcast(b, r.grad, x->shape, all)), Arg(0.0)));
  }
  Arg::List indices;
  for (int64_t d = 0; d < index->ndim(); ++d) {
    if (d == dim) {
      indices.push_back(Arg(as_long(b, index)));
      continue;
    }
    auto iota = P(b, OpId::prim_iota, {Arg(index->shape[d]), Arg(int64_t{0}), Arg(int64_t{1}),
                                       Arg(DType::Int64), Arg(index->device)});
    indices.push_back(Arg(bcast(b, iota, index->shape, {d})));
  }
  return only(r, 0, P(b, OpId::prim_index_put, {Arg(zeros_like(b, x)), Arg(std::move(indices)),
                                                Arg(r.grad), Arg(true)}));
}

// index_put: x's gradient is g with the written positions zeroed (unless the write
// accumulates); the values' gradient is g read at the indices (eager's: every duplicate index
// gets the gradient of its position, though only one write lands), summed to their shape.
Arg::List grad_index_put(Builder& b, const GR& r) {
  const Arg::List& list = r.bsym.args[1].list();
  const TensorRef& v = r.bsym.args[2].tensor();
  const bool accumulate = r.bsym.args[3].as_bool();
  Arg::List res(r.bsym.args.size());
  if (r.needs[0])
    res[0] = accumulate ? Arg(r.grad)
                        : Arg(P(b, OpId::prim_index_put, {Arg(r.grad), r.bsym.args[1],
                                                          Arg(zeros_like(b, v)), Arg(false)}));
  if (r.needs[2]) {
    std::vector<std::pair<int64_t, TensorRef>> adv;
    for (size_t d = 0; d < list.size(); ++d)
      if (!list[d].is_none()) adv.emplace_back(static_cast<int64_t>(d), list[d].tensor());
    TensorRef gv = adv.empty() ? r.grad : advanced_index(b, r.grad, adv);
    res[2] = Arg(sum_to(b, gv, v->shape));
  }
  return res;
}
// index_copy: x's gradient is g with the copied rows zeroed; the source's is g's rows at the
// index (index_select).
Arg::List grad_index_copy(Builder& b, const GR& r) {
  const int64_t dim = r.bsym.args[1].as_int();
  const TensorRef& index = r.bsym.args[2].tensor();
  const TensorRef& src = r.bsym.args[3].tensor();
  Arg::List res(r.bsym.args.size());
  if (r.needs[0])
    res[0] = Arg(P(b, OpId::prim_index_copy,
                   {Arg(r.grad), Arg(dim), Arg(index), Arg(zeros_like(b, src))}));
  if (r.needs[3])
    res[3] = Arg(reshape(b, P(b, OpId::prim_take, {Arg(r.grad), Arg(index), Arg(dim), Arg(int64_t{0})}),
                         src->shape));
  return res;
}

// Strided reads and writes of a flat storage value (what functionalization makes of views
// written in place): a read's gradient is scattered back to the positions it read; a write's
// gradient reaches the written source at those positions and the storage everywhere else.
// Positions that overlap (a write through an expanded view) have no such rule.
bool distinct_positions(const Shape& size, const Shape& stride) {
  std::vector<std::pair<int64_t, int64_t>> dims; // (stride, size) of dims with size > 1
  for (size_t d = 0; d < size.size(); ++d)
    if (size[d] > 1) dims.emplace_back(std::abs(stride[d]), size[d]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;
  for (const auto& [st, n] : dims) {
    if (st < span) return false;
    span = st * n;
  }
  return true;
}
Arg::List grad_as_strided(Builder& b, const GR& r) {
  const TensorRef& s = x0(r);
  const Shape size = r.bsym.args[1].int_list(), stride = r.bsym.args[2].int_list();
  KR_CHECK(distinct_positions(size, stride), NotImplemented,
           "keraunos: the backward of a strided read that reads an element twice is not "
           "supported yet");
  return only(r, 0, P(b, OpId::prim_as_strided_scatter,
                      {Arg(zeros_like(b, s)), Arg(r.grad), r.bsym.args[1], r.bsym.args[2], r.bsym.args[3]}));
}
Arg::List grad_as_strided_scatter(Builder& b, const GR& r) {
  const TensorRef& src = r.bsym.args[1].tensor();
  const Shape size = r.bsym.args[2].int_list(), stride = r.bsym.args[3].int_list();
  KR_CHECK(distinct_positions(size, stride), NotImplemented,
           "keraunos: the backward of a strided write that writes an element twice is not "
           "supported yet");
  Arg::List res(r.bsym.args.size());
  if (r.needs[0])
    res[0] = Arg(P(b, OpId::prim_as_strided_scatter, {Arg(r.grad), Arg(zeros_like(b, src)), r.bsym.args[2],
                                                      r.bsym.args[3], r.bsym.args[4]}));
  if (r.needs[1])
    res[1] = Arg(P(b, OpId::prim_as_strided, {Arg(r.grad), r.bsym.args[2], r.bsym.args[3], r.bsym.args[4]}));
  return res;
}

// Reductions.
Arg::List grad_sum(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const Shape dims = r.bsym.args[1].int_list();
  return only(r, 0, bcast(b, r.grad, x->shape, kept_dims(x->ndim(), dims)));
}
// prod: the product of the other elements of the slice, result / x where the slice has no
// zero (eager's formula there), else the product of the nonzero elements at a slice's only zero
// and 0 elsewhere (what eager's cumulative products give).
Arg::List grad_prod(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const Shape dims = r.bsym.args[1].int_list();
  if (dims.empty()) return only(r, 0, r.grad);
  const Shape kept = kept_dims(x->ndim(), dims);
  auto zero = P(b, OpId::prim_eq, {Arg(x), Arg(0.0)});
  auto zeros_in = bcast(b, sum(b, P(b, OpId::prim_convert_element_type, {Arg(zero), Arg(x->dtype)}), dims),
                        x->shape, kept);
  auto nonzero_prod = P(b, OpId::prim_prod, {Arg(where(b, Arg(zero), Arg(1.0), Arg(x))), Arg::int_list(dims)});
  auto at_only_zero = P(b, OpId::prim_logical_and,
                        {Arg(zero), Arg(P(b, OpId::prim_eq, {Arg(zeros_in), Arg(1.0)}))});
  auto with_zero = where(b, Arg(at_only_zero), Arg(bcast(b, nonzero_prod, x->shape, kept)), Arg(0.0));
  auto others = where(b, Arg(P(b, OpId::prim_eq, {Arg(zeros_in), Arg(0.0)})),
                      Arg(div(b, Arg(bcast(b, out(r), x->shape, kept)), Arg(x))), Arg(with_zero));
  return only(r, 0, mul(b, Arg(bcast(b, r.grad, x->shape, kept)), Arg(others)));
}
// amax/amin: the gradient shared by every element equal to the result.
Arg::List grad_amax(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const Shape dims = r.bsym.args[1].int_list();
  const Shape kept = kept_dims(x->ndim(), dims);
  auto hit = P(b, OpId::prim_eq, {Arg(x), Arg(bcast(b, out(r), x->shape, kept))});
  auto hitf = P(b, OpId::prim_convert_element_type, {Arg(hit), Arg(x->dtype)});
  auto count = sum(b, hitf, dims);
  auto share = div(b, Arg(r.grad), Arg(count));
  return only(r, 0, mul(b, Arg(bcast(b, share, x->shape, kept)), Arg(hitf)));
}
Arg::List grad_var(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const Shape dims = r.bsym.args[1].int_list();
  const double correction = r.bsym.args[2].as_double();
  const Shape kept = kept_dims(x->ndim(), dims);
  double n = 1;
  for (auto d : dims) n *= static_cast<double>(x->shape[d]);
  auto mean = div(b, Arg(sum(b, x, dims)), Arg(n));
  auto centered = sub(b, Arg(x), Arg(bcast(b, mean, x->shape, kept)));
  auto scale = mul(b, Arg(bcast(b, r.grad, x->shape, kept)), Arg(2.0 / (n - correction)));
  return only(r, 0, mul(b, Arg(scale), Arg(centered)));
}
// cumsum: the reversed cumulative sum of the gradient, flip(cumsum(flip(g))) as eager's
// (total - cumsum + g would cancel: inf - inf where the forward overflowed).
Arg::List grad_cumsum(Builder& b, const GR& r) {
  const TensorRef& x = x0(r);
  const int64_t dim = r.bsym.args[1].as_int();
  const TensorRef& g = r.grad;
  if (x->ndim() == 0 || x->shape[dim] <= 1) return only(r, 0, g);
  const int64_t n = x->shape[dim];
  auto reversed = P(b, OpId::prim_iota, {Arg(n), Arg(n - 1), Arg(int64_t{-1}), Arg(DType::Int64), Arg(g->device)});
  auto flip = [&](const TensorRef& t) {
    return P(b, OpId::prim_take, {Arg(t), Arg(reversed), Arg(dim), Arg(int64_t{0})});
  };
  return only(r, 0, flip(P(b, OpId::prim_cumsum, {Arg(flip(g)), Arg(dim)})));
}

// matmul (torch.matmul's batching): a @ b's gradients are g @ b^T and a^T @ g, summed over
// broadcast batch dims. A one-dimensional operand is a row (left) or a column (right) matrix,
// and the gradient gets the matching unit dimension.
TensorRef transpose_last(Builder& b, const TensorRef& t) {
  Shape perm;
  for (int64_t d = 0; d < t->ndim(); ++d) perm.push_back(d);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return P(b, OpId::prim_permute, {Arg(t), Arg::int_list(perm)});
}
Arg::List grad_matmul(Builder& b, const GR& r) {
  const TensorRef& x0 = r.bsym.args[0].tensor();
  const TensorRef& w0 = r.bsym.args[1].tensor();
  const bool xv = x0->ndim() == 1, wv = w0->ndim() == 1;
  const TensorRef x = xv ? reshape(b, x0, {1, x0->shape[0]}) : x0;
  const TensorRef w = wv ? reshape(b, w0, {w0->shape[0], 1}) : w0;
  TensorRef g = r.grad;
  if (xv || wv) {
    Shape gs = g->shape;
    if (wv) gs.push_back(1);
    if (xv) gs.insert(gs.end() - 1, 1);
    g = reshape(b, g, gs);
  }
  Arg::List res(2);
  if (r.needs[0]) {
    auto gx = sum_to(b, P(b, OpId::prim_matmul, {Arg(g), Arg(transpose_last(b, w))}), x->shape);
    res[0] = Arg(xv ? reshape(b, gx, x0->shape) : gx);
  }
  if (r.needs[1]) {
    TensorRef gw;
    if (w->ndim() == 2 && x->ndim() > 2) {
      // A batch of rows times one matrix (linear): one product over all rows.
      const int64_t k = x->shape.back(), n = g->shape.back();
      auto x2 = reshape(b, x, {numel(x->shape) / k, k});
      auto g2 = reshape(b, g, {numel(g->shape) / n, n});
      gw = P(b, OpId::prim_matmul, {Arg(transpose_last(b, x2)), Arg(g2)});
    } else {
      gw = sum_to(b, P(b, OpId::prim_matmul, {Arg(transpose_last(b, x)), Arg(g)}), w->shape);
    }
    res[1] = Arg(wv ? reshape(b, gw, w0->shape) : gw);
  }
  return res;
}

struct GradTable {
  std::array<GradEntry, kNumOps> entries{};

  GradTable() {
    auto rule = [&](OpId op, GradFn fn) { entries[static_cast<size_t>(op)] = {GradKind::Rule, fn, nullptr}; };
    auto none = [&](OpId op) { entries[static_cast<size_t>(op)] = {GradKind::NoGrad, nullptr, nullptr}; };
    auto refuse = [&](OpId op, const char* why) {
      entries[static_cast<size_t>(op)] = {GradKind::Refused, nullptr, why};
    };
    rule(OpId::prim_clone, &grad_clone);
    rule(OpId::prim_restride, &grad_restride);
    rule(OpId::prim_abs, &grad_abs);
    rule(OpId::prim_neg, &grad_neg);
    rule(OpId::prim_exp, &grad_exp);
    rule(OpId::prim_exp2, &grad_exp2);
    rule(OpId::prim_log, &grad_log);
    rule(OpId::prim_log2, &grad_log2);
    rule(OpId::prim_log1p, &grad_log1p);
    rule(OpId::prim_expm1, &grad_expm1);
    rule(OpId::prim_sin, &grad_sin);
    rule(OpId::prim_cos, &grad_cos);
    rule(OpId::prim_tan, &grad_tan);
    rule(OpId::prim_tanh, &grad_tanh);
    rule(OpId::prim_sigmoid, &grad_sigmoid);
    rule(OpId::prim_sqrt, &grad_sqrt);
    rule(OpId::prim_rsqrt, &grad_rsqrt);
    rule(OpId::prim_erf, &grad_erf);
    rule(OpId::prim_reciprocal, &grad_reciprocal);
    for (OpId op : {OpId::prim_floor, OpId::prim_ceil, OpId::prim_round, OpId::prim_trunc,
                    OpId::prim_sign})
      rule(op, &grad_zero);
    for (OpId op : {OpId::prim_isnan, OpId::prim_isinf, OpId::prim_bitwise_not,
                    OpId::prim_logical_not, OpId::prim_eq, OpId::prim_ne, OpId::prim_lt,
                    OpId::prim_le, OpId::prim_gt, OpId::prim_ge, OpId::prim_bitwise_and,
                    OpId::prim_bitwise_or, OpId::prim_bitwise_xor, OpId::prim_logical_and,
                    OpId::prim_logical_or, OpId::prim_logical_xor, OpId::prim_argmax,
                    OpId::prim_argmin, OpId::prim_check_index, OpId::prim_full, OpId::prim_iota,
                    OpId::prim_uniform, OpId::prim_normal, OpId::prim_seed, OpId::manual_seed,
                    OpId::set_rng_state})
      none(op);
    rule(OpId::prim_add, &grad_add);
    rule(OpId::prim_sub, &grad_sub);
    rule(OpId::prim_mul, &grad_mul);
    rule(OpId::prim_div, &grad_div);
    rule(OpId::prim_remainder, &grad_mod<OpId::prim_floor>);
    rule(OpId::prim_fmod, &grad_mod<OpId::prim_trunc>);
    rule(OpId::prim_pow, &grad_pow);
    rule(OpId::prim_maximum, &grad_extremum<true>);
    rule(OpId::prim_minimum, &grad_extremum<false>);
    rule(OpId::prim_where, &grad_where);
    rule(OpId::prim_convert_element_type, &grad_convert);
    rule(OpId::prim_broadcast_in_dim, &grad_broadcast_in_dim);
    rule(OpId::prim_reshape, &grad_reshape);
    rule(OpId::prim_permute, &grad_permute);
    rule(OpId::prim_slice, &grad_slice);
    rule(OpId::prim_squeeze, &grad_squeeze);
    rule(OpId::prim_diagonal, &grad_diagonal);
    rule(OpId::prim_cat, &grad_cat);
    rule(OpId::prim_take, &grad_take);
    rule(OpId::prim_gather, &grad_gather);
    rule(OpId::prim_sum, &grad_sum);
    rule(OpId::prim_amax, &grad_amax);
    rule(OpId::prim_amin, &grad_amax);
    rule(OpId::prim_prod, &grad_prod);
    rule(OpId::prim_index_put, &grad_index_put);
    rule(OpId::prim_index_copy, &grad_index_copy);
    rule(OpId::prim_as_strided, &grad_as_strided);
    rule(OpId::prim_as_strided_scatter, &grad_as_strided_scatter);
    rule(OpId::prim_var, &grad_var);
    rule(OpId::prim_cumsum, &grad_cumsum);
    rule(OpId::prim_matmul, &grad_matmul);
    refuse(OpId::prim_floor_divide, "floor_divide");
    refuse(OpId::prim_copy_, "a write into an existing tensor");
    entries[static_cast<size_t>(OpId::torch_fallback)] = {GradKind::Torch, nullptr, nullptr};
    refuse(OpId::torch_fallback_random, "a torch call that draws random numbers");
    refuse(OpId::torch_vjp, "a backward (double backward)");
    refuse(OpId::torch_vjp_record, "a forward that autograd records (double backward)");
  }
};

} // namespace

namespace {
int64_t wrap(int64_t d, int64_t n) { return d < 0 ? d + n : d; }

// Whether no two elements of a tensor with these sizes and strides share memory.
bool non_overlapping(const TensorProxy& t) {
  std::vector<std::pair<int64_t, int64_t>> dims; // (stride, size) of dims with size > 1
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (t.shape[d] > 1) dims.emplace_back(t.strides[d], t.shape[d]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;
  for (const auto& [stride, size] : dims) {
    if (stride < span) return false;
    span = stride * size;
  }
  return true;
}
} // namespace

TensorRef view_grad(Builder& b, const BoundSymbol& v, const TensorRef& y, const TensorRef& g) {
  const TensorRef& x = v.args.at(0).tensor();
  KR_CHECK(x->dtype == y->dtype, NotImplemented, "keraunos: the backward of ",
           v.def().qualified_name(), " as a dtype view is not supported yet");
  const int64_t n = x->ndim();
  if (v.op == OpId::permute) {
    Shape dims = v.args[1].int_list(), inv(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inv[wrap(dims[i], n)] = static_cast<int64_t>(i);
    return P(b, OpId::prim_permute, {Arg(g), Arg::int_list(inv)});
  }
  if ((v.op == OpId::transpose || v.op == OpId::t) && n >= 2) {
    Shape perm;
    for (int64_t d = 0; d < n; ++d) perm.push_back(d);
    const int64_t d0 = v.op == OpId::t ? 0 : wrap(v.args[1].as_int(), n);
    const int64_t d1 = v.op == OpId::t ? 1 : wrap(v.args[2].as_int(), n);
    std::swap(perm[d0], perm[d1]);
    return P(b, OpId::prim_permute, {Arg(g), Arg::int_list(perm)});
  }
  if (v.op == OpId::expand) return sum_to(b, g, x->shape);
  // The same elements in the same order (dims of size 1 added or removed, contiguous dims
  // merged): a reshape.
  auto significant = [](const TensorProxy& t) {
    std::vector<std::pair<int64_t, int64_t>> dims;
    for (size_t d = 0; d < t.shape.size(); ++d)
      if (t.shape[d] != 1) dims.emplace_back(t.shape[d], t.strides[d]);
    return dims;
  };
  if (x->numel() == y->numel() &&
      ((x->is_contiguous() && y->is_contiguous()) || significant(*x) == significant(*y)))
    return reshape(b, g, x->shape);
  // A box of x (a slice with unit steps in each dim: y has x's strides): g padded with zeros.
  if (y->ndim() == n && non_overlapping(*x)) {
    bool box = true;
    for (int64_t d = 0; d < n && box; ++d)
      box = y->shape[d] <= x->shape[d] && (y->shape[d] <= 1 || y->strides[d] == x->strides[d]);
    std::vector<int64_t> order;
    for (int64_t d = 0; d < n; ++d)
      if (x->shape[d] > 1) order.push_back(d);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t c) { return x->strides[a] > x->strides[c]; });
    Shape start(n, 0);
    int64_t delta = y->storage_offset - x->storage_offset;
    for (int64_t d : order) {
      if (!box || x->strides[d] <= 0) break;
      start[d] = delta / x->strides[d];
      delta -= start[d] * x->strides[d];
      box = start[d] >= 0 && start[d] + y->shape[d] <= x->shape[d];
    }
    if (box && delta == 0) return pad_with_zeros(b, g, x->shape, start);
  }
  KR_CHECK(non_overlapping(*x) && non_overlapping(*y), NotImplemented,
           "keraunos: the backward of ", v.def().qualified_name(),
           " over a self-overlapping tensor is not supported yet");
  // x's elements lie in storage positions [x.offset, x.offset + span): the gradient over that
  // span is zeros with g at y's positions (a subset of x's), read back at x's positions.
  int64_t span = 1;
  for (size_t d = 0; d < x->shape.size(); ++d)
    if (x->shape[d] > 1) span += (x->shape[d] - 1) * x->strides[d];
  if (x->numel() == 0) span = 0;
  KR_INTERNAL(g->shape == y->shape, "view_grad: the gradient's shape is not the view's");
  auto s = flat_scatter(b, g, span, y->strides, y->storage_offset - x->storage_offset);
  return P(b, OpId::prim_as_strided,
           {Arg(s), Arg::int_list(x->shape), Arg::int_list(x->strides), Arg(int64_t{0})});
}

const GradEntry& grad_entry(OpId op) {
  static const GradTable table;
  return table.entries.at(static_cast<size_t>(op));
}

} // namespace keraunos

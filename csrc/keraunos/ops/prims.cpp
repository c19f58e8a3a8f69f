// Meta functions of the prims: argument checks and output proxies. Prims are functional and
// strict: elementwise prims take operands of one shape and one dtype (language ops broadcast
// and promote before calling them).
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/meta.h"

#include <algorithm>

namespace keraunos::ops {

namespace {

enum class OutKind { Same, Bool };

Arg elementwise_meta(Builder& b, const Arg::List& a, OutKind kind, std::string_view name,
                     size_t first_value = 0) {
  const TensorRef* t0 = nullptr;
  std::vector<TensorRef> ts;
  for (size_t i = first_value; i < a.size(); ++i) {
    if (!a[i].is_tensor()) continue;
    const auto& t = a[i].tensor();
    if (!t0) t0 = &a[i].tensor();
    KR_INTERNAL(t->shape == (*t0)->shape, name, ": operand shapes differ: ",
                shape_str(t->shape), " vs ", shape_str((*t0)->shape));
    KR_INTERNAL(t->dtype == (*t0)->dtype, name, ": operand dtypes differ");
    ts.push_back(t);
  }
  DType dtype;
  Shape shape;
  Device dev;
  if (t0) {
    dtype = (*t0)->dtype;
    shape = (*t0)->shape;
    dev = (*t0)->device;
  } else {
    KR_INTERNAL(first_value > 0 && a[0].is_tensor(), name, ": no tensor operand");
    dtype = a[first_value].number_dtype();
    shape = a[0].tensor()->shape;
    dev = a[0].tensor()->device;
  }
  for (size_t i = 0; i < first_value; ++i) {
    KR_INTERNAL(a[i].tensor()->shape == shape, name, ": condition shape differs");
    ts.push_back(a[i].tensor());
  }
  if (kind == OutKind::Bool) dtype = DType::Bool;
  return Arg(b.new_tensor(dtype, dev, shape, elementwise_strides(ts, shape)));
}

Arg reduction_meta(Builder& b, const TensorRef& a, const Shape& dims, DType dtype) {
  Shape out;
  for (int64_t i = 0; i < a->ndim(); ++i)
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) out.push_back(a->shape[i]);
  return Arg(b.new_tensor(dtype, a->device, out));
}

} // namespace

#define KR_UNARY(n, kind)                                                                          \
  Arg impl_prim_##n(Builder& b, const Arg::List& a) {                                             \
    return elementwise_meta(b, a, OutKind::kind, "prims." #n);                                     \
  }
KR_UNARY(clone, Same)
KR_UNARY(abs, Same)
KR_UNARY(neg, Same)
KR_UNARY(exp, Same)
KR_UNARY(exp2, Same)
KR_UNARY(log, Same)
KR_UNARY(log2, Same)
KR_UNARY(log1p, Same)
KR_UNARY(expm1, Same)
KR_UNARY(sin, Same)
KR_UNARY(cos, Same)
KR_UNARY(tan, Same)
KR_UNARY(tanh, Same)
KR_UNARY(sigmoid, Same)
KR_UNARY(sqrt, Same)
KR_UNARY(rsqrt, Same)
KR_UNARY(erf, Same)
KR_UNARY(reciprocal, Same)
KR_UNARY(floor, Same)
KR_UNARY(ceil, Same)
KR_UNARY(round, Same)
KR_UNARY(trunc, Same)
KR_UNARY(sign, Same)
KR_UNARY(isnan, Bool)
KR_UNARY(isinf, Bool)
KR_UNARY(bitwise_not, Same)
KR_UNARY(logical_not, Bool)
KR_UNARY(add, Same)
KR_UNARY(sub, Same)
KR_UNARY(mul, Same)
KR_UNARY(div, Same)
KR_UNARY(floor_divide, Same)
KR_UNARY(remainder, Same)
KR_UNARY(fmod, Same)
KR_UNARY(pow, Same)
KR_UNARY(maximum, Same)
KR_UNARY(minimum, Same)
KR_UNARY(eq, Bool)
KR_UNARY(ne, Bool)
KR_UNARY(lt, Bool)
KR_UNARY(le, Bool)
KR_UNARY(gt, Bool)
KR_UNARY(ge, Bool)
KR_UNARY(bitwise_and, Same)
KR_UNARY(bitwise_or, Same)
KR_UNARY(bitwise_xor, Same)
KR_UNARY(logical_and, Bool)
KR_UNARY(logical_or, Bool)
KR_UNARY(logical_xor, Bool)
#undef KR_UNARY

Arg impl_prim_where(Builder& b, const Arg::List& a) {
  KR_INTERNAL(a[0].tensor()->dtype == DType::Bool, "prims.where: condition must be bool");
  return elementwise_meta(b, a, OutKind::Same, "prims.where", 1);
}

Arg impl_prim_convert_element_type(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  // Like .to(dtype): keeps the layout of dense tensors.
  return Arg(b.new_tensor(a[1].as_dtype(), t->device, t->shape,
                          elementwise_strides({t}, t->shape)));
}

Arg impl_prim_broadcast_in_dim(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  Shape shape = a[1].int_list(), dims = a[2].int_list();
  KR_INTERNAL(static_cast<int64_t>(dims.size()) == t->ndim(), "broadcast_in_dim: rank mismatch");
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    KR_INTERNAL(t->shape[i] == 1 || t->shape[i] == shape[dims[i]],
                "broadcast_in_dim: incompatible dim");
    if (t->shape[i] == shape[dims[i]]) strides[dims[i]] = t->strides[i];
  }
  // Functional: a fresh value whose layout mirrors expand (stride 0 on broadcast dims).
  auto out = b.new_tensor(t->dtype, t->device, shape, strides.empty() ? Shape{} : strides);
  return Arg(out);
}

Arg impl_prim_reshape(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  Shape shape = a[1].int_list();
  KR_INTERNAL(numel(shape) == t->numel(), "reshape: numel mismatch");
  return Arg(b.new_tensor(t->dtype, t->device, shape));
}

Arg impl_prim_permute(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  Shape dims = a[1].int_list();
  KR_INTERNAL(static_cast<int64_t>(dims.size()) == t->ndim(), "permute: rank mismatch");
  Shape shape, strides;
  for (auto d : dims) {
    shape.push_back(t->shape[d]);
    strides.push_back(t->strides[d]);
  }
  return Arg(b.new_tensor(t->dtype, t->device, shape, strides));
}

Arg impl_prim_slice(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  Shape start = a[1].int_list(), end = a[2].int_list(), step = a[3].int_list();
  Shape shape;
  for (int64_t i = 0; i < t->ndim(); ++i) {
    KR_INTERNAL(0 <= start[i] && start[i] <= end[i] && end[i] <= t->shape[i] && step[i] > 0,
                "slice: bad bounds");
    shape.push_back((end[i] - start[i] + step[i] - 1) / step[i]);
  }
  return Arg(b.new_tensor(t->dtype, t->device, shape));
}

Arg impl_prim_squeeze(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  Shape dims = a[1].int_list(), shape;
  for (int64_t i = 0; i < t->ndim(); ++i) {
    if (std::find(dims.begin(), dims.end(), i) != dims.end()) {
      KR_INTERNAL(t->shape[i] == 1, "squeeze of a non-1 dim");
      continue;
    }
    shape.push_back(t->shape[i]);
  }
  return Arg(b.new_tensor(t->dtype, t->device, shape));
}

Arg impl_prim_diagonal(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  int64_t off = a[1].as_int(), d1 = a[2].as_int(), d2 = a[3].as_int();
  int64_t len = off >= 0 ? std::max<int64_t>(std::min(t->shape[d1], t->shape[d2] - off), 0)
                         : std::max<int64_t>(std::min(t->shape[d1] + off, t->shape[d2]), 0);
  Shape shape;
  for (int64_t i = 0; i < t->ndim(); ++i)
    if (i != d1 && i != d2) shape.push_back(t->shape[i]);
  shape.push_back(len);
  return Arg(b.new_tensor(t->dtype, t->device, shape));
}

Arg impl_prim_cat(Builder& b, const Arg::List& a) {
  auto ts = a[0].tensor_list();
  KR_INTERNAL(!ts.empty(), "cat of nothing");
  int64_t dim = a[1].as_int();
  Shape shape = ts[0]->shape;
  shape[dim] = 0;
  for (const auto& t : ts) shape[dim] += t->shape[dim];
  return Arg(b.new_tensor(ts[0]->dtype, ts[0]->device, shape));
}

Arg impl_prim_take(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  const auto& idx = a[1].tensor();
  int64_t dim = a[2].as_int();
  Shape shape;
  for (int64_t i = 0; i < dim; ++i) shape.push_back(t->shape[i]);
  for (auto s : idx->shape) shape.push_back(s);
  for (int64_t i = dim + 1; i < t->ndim(); ++i) shape.push_back(t->shape[i]);
  return Arg(b.new_tensor(t->dtype, t->device, shape));
}

Arg impl_prim_check_index(Builder&, const Arg::List&) { return Arg(); }

Arg impl_prim_gather(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  return Arg(b.new_tensor(t->dtype, t->device, a[2].tensor()->shape));
}

Arg impl_prim_index_put(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  return Arg(b.new_tensor(t->dtype, t->device, t->shape));
}

Arg impl_prim_index_copy(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  return Arg(b.new_tensor(t->dtype, t->device, t->shape));
}

Arg impl_prim_sum(Builder& b, const Arg::List& a) {
  return reduction_meta(b, a[0].tensor(), a[1].int_list(), a[0].tensor()->dtype);
}
Arg impl_prim_prod(Builder& b, const Arg::List& a) {
  return reduction_meta(b, a[0].tensor(), a[1].int_list(), a[0].tensor()->dtype);
}
Arg impl_prim_amax(Builder& b, const Arg::List& a) {
  return reduction_meta(b, a[0].tensor(), a[1].int_list(), a[0].tensor()->dtype);
}
Arg impl_prim_amin(Builder& b, const Arg::List& a) {
  return reduction_meta(b, a[0].tensor(), a[1].int_list(), a[0].tensor()->dtype);
}
Arg impl_prim_var(Builder& b, const Arg::List& a) {
  return reduction_meta(b, a[0].tensor(), a[1].int_list(), a[0].tensor()->dtype);
}
Arg impl_prim_argmax(Builder& b, const Arg::List& a) {
  return reduction_meta(b, a[0].tensor(), {a[1].as_int()}, DType::Int64);
}
Arg impl_prim_argmin(Builder& b, const Arg::List& a) {
  return reduction_meta(b, a[0].tensor(), {a[1].as_int()}, DType::Int64);
}
Arg impl_prim_cumsum(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  return Arg(b.new_tensor(t->dtype, t->device, t->shape));
}

Arg impl_prim_full(Builder& b, const Arg::List& a) {
  return Arg(b.new_tensor(a[2].as_dtype(), a[3].as_device(), a[0].int_list()));
}
Arg impl_prim_iota(Builder& b, const Arg::List& a) {
  return Arg(b.new_tensor(a[3].as_dtype(), a[4].as_device(), {a[0].as_int()}));
}
Arg impl_prim_uniform(Builder& b, const Arg::List& a) {
  return Arg(b.new_tensor(a[3].as_dtype(), a[4].as_device(), a[0].int_list()));
}
Arg impl_prim_seed(Builder& b, const Arg::List& a) {
  return Arg(b.new_tensor(DType::Int64, a[0].as_device(), {}));
}
Arg impl_prim_normal(Builder& b, const Arg::List& a) {
  return Arg(b.new_tensor(a[3].as_dtype(), a[4].as_device(), a[0].int_list()));
}

Arg impl_prim_matmul(Builder& b, const Arg::List& a) {
  // Shapes follow torch.matmul; the language op checks them and passes the result shape.
  const auto& x = a[0].tensor();
  const auto& y = a[1].tensor();
  Shape xs = x->shape, ys = y->shape;
  KR_INTERNAL(!xs.empty() && !ys.empty(), "matmul of a 0-d tensor");
  bool xv = xs.size() == 1, yv = ys.size() == 1;
  if (xv) xs.insert(xs.begin(), 1);
  if (yv) ys.push_back(1);
  Shape xb(xs.begin(), xs.end() - 2), yb(ys.begin(), ys.end() - 2);
  Shape out = broadcast_shapes({xb, yb}, "matmul");
  if (!xv) out.push_back(xs[xs.size() - 2]);
  if (!yv) out.push_back(ys.back());
  return Arg(b.new_tensor(x->dtype, x->device, out));
}

Arg impl_prim_copy_(Builder& b, const Arg::List& a) {
  KR_INTERNAL(a[0].tensor()->shape == a[1].tensor()->shape, "copy_: shape mismatch");
  return a[0];
}

Arg impl_return_(Builder&, const Arg::List&) { return Arg(); }

} // namespace keraunos::ops

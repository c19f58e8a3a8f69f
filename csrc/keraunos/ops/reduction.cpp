// Reductions, scans, softmax-like normalizations and arg-reductions. Meta follows eager:
// dim=None or an empty dim list reduces every dim, negative dims wrap, keepdim keeps reduced
// dims as size 1, sum/prod/cumsum of bool and integer tensors give int64 unless `dtype=` says
// otherwise. Decompositions compute float16/bfloat16 in float32 and convert back.
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/meta.h"

#include <algorithm>
#include <limits>

namespace keraunos::ops {

// Shared with nn.cpp (declared there).
namespace red {

std::string_view torch_type_name(DType d) { return dtype_scalar_name(d); }

DType compute_dtype(DType d) {
  return (d == DType::Float16 || d == DType::BFloat16) ? DType::Float32 : d;
}

TensorRef cvt(Builder& b, const TensorRef& t, DType d) { return to_dtype(b, Arg(t), d).tensor(); }

TensorRef prim(Builder& b, OpId op, Arg::List args) { return b.call(op, std::move(args)).tensor(); }
TensorRef detached(Builder& b, const TensorRef& t) { return prim(b, OpId::detach, {Arg(t)}); }

// A reduction prim over `dims` (sorted, unique).
TensorRef reduce(Builder& b, OpId op, const TensorRef& x, const std::vector<int64_t>& dims) {
  return prim(b, op, {Arg(x), Arg::int_list(Shape(dims.begin(), dims.end()))});
}

// `in_shape` with the reduced dims set to 1.
Shape kept_shape(const Shape& in_shape, const std::vector<int64_t>& dims) {
  Shape s = in_shape;
  for (auto d : dims) s[d] = 1;
  return s;
}

// A reduction output (reduced dims dropped) reshaped for keepdim.
TensorRef keep(Builder& b, const TensorRef& out, const Shape& in_shape,
               const std::vector<int64_t>& dims, bool keepdim) {
  if (!keepdim) return out;
  Shape s = kept_shape(in_shape, dims);
  if (s == out->shape) return out;
  return prim(b, OpId::prim_reshape, {Arg(out), Arg::int_list(s)});
}

// A reduction output (reduced dims dropped) broadcast back to `full`.
TensorRef expand_back(Builder& b, const TensorRef& reduced, const Shape& full,
                      const std::vector<int64_t>& dims) {
  if (reduced->shape == full) return reduced;
  Shape bdims;
  for (int64_t i = 0; i < static_cast<int64_t>(full.size()); ++i)
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) bdims.push_back(i);
  return prim(b, OpId::prim_broadcast_in_dim,
              {Arg(reduced), Arg::int_list(full), Arg::int_list(bdims)});
}

int64_t reduced_numel(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= shape[d];
  return n;
}

// mean over dims in x's dtype (x already in its computation dtype). The CPU divides the sum by
// the count; eager CUDA's MeanOps multiplies it by outputs / inputs computed in the accumulation
// type.
TensorRef mean_of(Builder& b, const TensorRef& x, const std::vector<int64_t>& dims) {
  auto s = reduce(b, OpId::prim_sum, x, dims);
  const int64_t n = reduced_numel(x->shape, dims);
  if (x->device.type == DeviceType::CUDA && is_float(x->dtype)) {
    const int64_t total = x->numel(), outs = n == 0 ? 0 : total / n;
    double f = x->dtype == DType::Float64
                   ? static_cast<double>(outs) / static_cast<double>(total)
                   : static_cast<double>(static_cast<float>(outs) / static_cast<float>(total));
    return prim(b, OpId::prim_mul, {Arg(s), Arg(f)});
  }
  return prim(b, OpId::prim_div, {Arg(s), Arg(static_cast<double>(n))});
}

} // namespace red

using namespace red;

namespace {

// dtype of sum/prod/cumsum: `dtype=` or the input's, with bool and integers widened to int64.
DType accumulate_dtype(const TensorRef& x, const Arg& dtype) {
  if (!dtype.is_none()) return dtype.as_dtype();
  return is_float(x->dtype) ? x->dtype : DType::Int64;
}

Arg sum_like(Builder& b, const Arg::List& a, OpId op, std::string_view name) {
  const auto& x = a[0].tensor();
  std::vector<int64_t> dims;
  if (op == OpId::prim_prod) {
    if (!a[1].is_none() && x->ndim() > 0) dims.push_back(wrap_dim(a[1].as_int(), x->ndim(), name));
    if (a[1].is_none()) dims = reduction_dims(Arg(), x->ndim(), name);
    else if (x->ndim() == 0) wrap_dim(a[1].as_int(), 0, name);
  } else {
    dims = reduction_dims(a[1], x->ndim(), name);
  }
  DType out = accumulate_dtype(x, a[3]);
  auto xc = cvt(b, x, compute_dtype(out));
  auto r = cvt(b, reduce(b, op, xc, dims), out);
  return Arg(keep(b, r, x->shape, dims, a[2].as_bool()));
}

void check_nonempty_dims(const TensorRef& x, const std::vector<int64_t>& dims, std::string_view name) {
  for (auto d : dims)
    KR_CHECK(x->shape[d] != 0, Index, name, "(): Expected reduction dim ", d,
             " to have non-zero size.");
}

Arg extremum(Builder& b, const Arg::List& a, OpId op, std::string_view name) {
  const auto& x = a[0].tensor();
  auto dims = reduction_dims(a[1], x->ndim(), name);
  check_nonempty_dims(x, dims, name);
  return Arg(keep(b, reduce(b, op, x, dims), x->shape, dims, a[2].as_bool()));
}

Arg full_extremum(Builder& b, const Arg::List& a, OpId op, std::string_view name) {
  const auto& x = a[0].tensor();
  KR_CHECK(x->numel() != 0, Runtime, name,
           "(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
           "reduction dim with the 'dim' argument.");
  return Arg(reduce(b, op, x, reduction_dims(Arg(), x->ndim(), name)));
}

// argmax/argmin do not take bool tensors; the decomposition compares bools as uint8.
TensorRef arg_input(Builder& b, const TensorRef& x) {
  return x->dtype == DType::Bool ? cvt(b, x, DType::UInt8) : x;
}

Arg extremum_dim(Builder& b, const Arg::List& a, OpId op, OpId arg_op, std::string_view name) {
  const auto& x = a[0].tensor();
  int64_t d = wrap_dim(a[1].as_int(), x->ndim(), name);
  std::vector<int64_t> dims;
  if (x->ndim() > 0) dims.push_back(d);
  check_nonempty_dims(x, dims, name);
  bool kd = a[2].as_bool();
  auto v = keep(b, reduce(b, op, x, dims), x->shape, dims, kd);
  auto i = prim(b, arg_op, {Arg(arg_input(b, x)), Arg(d)});
  i = keep(b, i, x->shape, dims, kd);
  return Arg(Arg::List{Arg(v), Arg(i)});
}

Arg arg_reduce(Builder& b, const Arg::List& a, OpId op, std::string_view name) {
  const auto& x = a[0].tensor();
  KR_CHECK(x->dtype != DType::Bool, Runtime, "\"", name, "_cpu\" not implemented for 'Bool'");
  bool kd = a[2].as_bool();
  if (a[1].is_none()) {
    KR_CHECK(x->numel() != 0, Index, name,
             "(): Expected reduction dim to be specified for input.numel() == 0.");
    auto flat = x->ndim() == 1 ? x : prim(b, OpId::prim_reshape, {Arg(x), Arg::int_list({x->numel()})});
    auto r = prim(b, op, {Arg(flat), Arg(int64_t{0})});
    if (kd && x->ndim() > 0)
      r = prim(b, OpId::prim_reshape, {Arg(r), Arg::int_list(Shape(x->ndim(), 1))});
    return Arg(r);
  }
  int64_t d = wrap_dim(a[1].as_int(), x->ndim(), name);
  std::vector<int64_t> dims;
  if (x->ndim() > 0) dims.push_back(d);
  check_nonempty_dims(x, dims, name);
  return Arg(keep(b, prim(b, op, {Arg(x), Arg(d)}), x->shape, dims, kd));
}

Arg var_std(Builder& b, const Arg::List& a, bool is_std, std::string_view name) {
  const auto& x = a[0].tensor();
  KR_CHECK(is_float(x->dtype), Runtime, "std and var only support floating point and complex dtypes");
  auto dims = reduction_dims(a[1], x->ndim(), name);
  double corr = a[2].is_none() ? 1.0 : a[2].as_double();
  auto xc = cvt(b, x, compute_dtype(x->dtype));
  auto r = prim(b, OpId::prim_var, {Arg(xc), Arg::int_list(Shape(dims.begin(), dims.end())), Arg(corr)});
  if (is_std) r = prim(b, OpId::prim_sqrt, {Arg(r)});
  r = cvt(b, r, x->dtype);
  return Arg(keep(b, r, x->shape, dims, a[3].as_bool()));
}

Arg softmax_like(Builder& b, const Arg::List& a, bool log, std::string_view name) {
  TensorRef x = a[0].tensor();
  int64_t d = wrap_dim(a[1].as_int(), x->ndim(), name);
  DType out = a[2].is_none() ? x->dtype : a[2].as_dtype();
  // Eager dispatches on the dtype only when there are elements: an empty integer tensor's
  // softmax is an empty tensor of that dtype. An empty float result is made from the input,
  // so that it requires grad where the input does (as eager's).
  if (x->numel() == 0) {
    if (is_float(x->dtype) && is_float(out))
      return prim(b, OpId::prim_mul, {Arg(cvt(b, x, out)), Arg(0.0)});
    return b.call(OpId::prim_full, {Arg::int_list(x->shape), Arg(0.0), Arg(out), Arg(x->device)});
  }
  KR_CHECK(is_float(out), NotImplemented, "\"", log ? "log_softmax" : "softmax",
           (d == x->ndim() - 1 || x->ndim() == 0) ? "_lastdim" : "", "_kernel_impl\" not implemented for '",
           torch_type_name(out), "'");
  std::vector<int64_t> dims;
  if (x->ndim() > 0) dims.push_back(d);
  // Eager converts to `dtype` first, then computes (float16/bfloat16 in float32).
  auto xc = make_contiguous(b, cvt(b, cvt(b, x, out), compute_dtype(out)));
  TensorRef shifted = xc;
  if (x->numel() > 0) {
    // The shift by the maximum cancels in the result: eager's backward has no term through
    // it, nor does ours (detached).
    auto m = expand_back(b, detached(b, reduce(b, OpId::prim_amax, xc, dims)), xc->shape, dims);
    shifted = prim(b, OpId::prim_sub, {Arg(xc), Arg(m)});
  }
  auto e = prim(b, OpId::prim_exp, {Arg(shifted)});
  auto s = expand_back(b, reduce(b, OpId::prim_sum, e, dims), xc->shape, dims);
  TensorRef r;
  if (log) {
    r = prim(b, OpId::prim_sub, {Arg(shifted), Arg(prim(b, OpId::prim_log, {Arg(s)}))});
  } else {
    r = prim(b, OpId::prim_div, {Arg(e), Arg(s)});
  }
  return Arg(cvt(b, r, out));
}

} // namespace

Arg impl_sum(Builder& b, const Arg::List& a) { return sum_like(b, a, OpId::prim_sum, "sum"); }
Arg impl_prod(Builder& b, const Arg::List& a) { return sum_like(b, a, OpId::prim_prod, "prod"); }

Arg impl_mean(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  auto dims = reduction_dims(a[1], x->ndim(), "mean");
  DType out;
  if (a[3].is_none()) {
    KR_CHECK(is_float(x->dtype), Runtime,
             "mean(): could not infer output dtype. Input dtype must be either a floating point "
             "or complex dtype. Got: ", torch_type_name(x->dtype));
    out = x->dtype;
  } else {
    out = a[3].as_dtype();
    KR_CHECK(is_float(out), Runtime,
             "mean(): could not infer output dtype. Optional dtype must be either a floating "
             "point or complex dtype. Got: ", torch_type_name(out));
  }
  auto xc = cvt(b, x, compute_dtype(out));
  auto r = cvt(b, mean_of(b, xc, dims), out);
  return Arg(keep(b, r, x->shape, dims, a[2].as_bool()));
}

Arg impl_amax(Builder& b, const Arg::List& a) { return extremum(b, a, OpId::prim_amax, "amax"); }
Arg impl_amin(Builder& b, const Arg::List& a) { return extremum(b, a, OpId::prim_amin, "amin"); }
Arg impl_max(Builder& b, const Arg::List& a) { return full_extremum(b, a, OpId::prim_amax, "max"); }
Arg impl_min(Builder& b, const Arg::List& a) { return full_extremum(b, a, OpId::prim_amin, "min"); }
Arg impl_max_dim(Builder& b, const Arg::List& a) {
  return extremum_dim(b, a, OpId::prim_amax, OpId::prim_argmax, "max");
}
Arg impl_min_dim(Builder& b, const Arg::List& a) {
  return extremum_dim(b, a, OpId::prim_amin, OpId::prim_argmin, "min");
}
Arg impl_argmax(Builder& b, const Arg::List& a) { return arg_reduce(b, a, OpId::prim_argmax, "argmax"); }
Arg impl_argmin(Builder& b, const Arg::List& a) { return arg_reduce(b, a, OpId::prim_argmin, "argmin"); }
Arg impl_var(Builder& b, const Arg::List& a) { return var_std(b, a, false, "var"); }
Arg impl_std(Builder& b, const Arg::List& a) { return var_std(b, a, true, "std"); }
Arg impl_softmax(Builder& b, const Arg::List& a) { return softmax_like(b, a, false, "softmax"); }
Arg impl_log_softmax(Builder& b, const Arg::List& a) { return softmax_like(b, a, true, "log_softmax"); }

Arg impl_logsumexp(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  KR_CHECK(!(a[1].list().empty() && x->ndim() > 0), Runtime,
           "logsumexp(): an empty dim list is not supported (eager fails on it too: output with "
           "shape [] doesn't match the broadcast shape)");
  auto dims = reduction_dims(a[1], x->ndim(), "logsumexp");
  DType out = is_float(x->dtype) ? x->dtype : b.options().default_float;
  auto xc = cvt(b, x, compute_dtype(out));
  TensorRef r;
  if (x->numel() == 0) {
    r = prim(b, OpId::prim_log, {Arg(reduce(b, OpId::prim_sum, prim(b, OpId::prim_exp, {Arg(xc)}), dims))});
  } else {
    // Eager: m = amax (infinities replaced by 0); log(sum(exp(x - m))) + m.
    auto m = detached(b, reduce(b, OpId::prim_amax, xc, dims));
    auto inf = prim(b, OpId::prim_isinf, {Arg(m)});
    m = prim(b, OpId::prim_where, {Arg(inf), Arg(0.0), Arg(m)});
    auto sh = prim(b, OpId::prim_sub, {Arg(xc), Arg(expand_back(b, m, xc->shape, dims))});
    auto s = reduce(b, OpId::prim_sum, prim(b, OpId::prim_exp, {Arg(sh)}), dims);
    r = prim(b, OpId::prim_add, {Arg(prim(b, OpId::prim_log, {Arg(s)})), Arg(m)});
  }
  r = cvt(b, r, out);
  return Arg(keep(b, r, x->shape, dims, a[2].as_bool()));
}

Arg impl_cumsum(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  int64_t d = wrap_dim(a[1].as_int(), x->ndim(), "cumsum");
  DType out = accumulate_dtype(x, a[2]);
  auto xc = cvt(b, x, compute_dtype(out));
  auto r = prim(b, OpId::prim_cumsum, {Arg(xc), Arg(d)});
  return Arg(cvt(b, r, out));
}

} // namespace keraunos::ops

// nn ops. Normalizations decompose into reduction and elementwise prims (float16/bfloat16
// computed in float32); matmul-class ops (tags::T) decompose into prims.matmul; the losses and
// attention that are too long to decompose usefully run through torch as opaque ops.
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/meta.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace keraunos::ops {

// Defined in reduction.cpp.
namespace red {
std::string_view torch_type_name(DType d);
DType compute_dtype(DType d);
TensorRef cvt(Builder& b, const TensorRef& t, DType d);
TensorRef prim(Builder& b, OpId op, Arg::List args);
TensorRef reduce(Builder& b, OpId op, const TensorRef& x, const std::vector<int64_t>& dims);
TensorRef expand_back(Builder& b, const TensorRef& reduced, const Shape& full,
                      const std::vector<int64_t>& dims);
int64_t reduced_numel(const Shape& shape, const std::vector<int64_t>& dims);
TensorRef mean_of(Builder& b, const TensorRef& x, const std::vector<int64_t>& dims);
} // namespace red

using namespace red;

namespace {

std::string list_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// The torch.Size repr F.batch_norm prints: torch.Size([1, 3]).
std::string size_repr(const Shape& s) { return "torch.Size(" + list_str(s) + ")"; }

// Checks of layer_norm/rms_norm; returns the normalized (trailing) dims.
std::vector<int64_t> check_normalized(const TensorRef& x, const Shape& ns, const Arg& weight,
                                      const Arg& bias) {
  int64_t k = static_cast<int64_t>(ns.size());
  KR_CHECK(k >= 1, Runtime, "Expected normalized_shape to be at least 1-dimensional, i.e., "
           "containing at least one element, but got normalized_shape = ", list_str(ns));
  bool ok = x->ndim() >= k && std::equal(ns.begin(), ns.end(), x->shape.end() - k);
  KR_CHECK(ok, Runtime, "Given normalized_shape=", list_str(ns), ", expected input with shape [*",
           [&] {
             std::string s;
             for (auto d : ns) s += ", " + std::to_string(d);
             return s;
           }(),
           "], but got input of size", list_str(x->shape));
  if (!weight.is_none())
    KR_CHECK(weight.tensor()->shape == ns, Runtime,
             "Expected weight to be of same shape as normalized_shape, but got weight of shape ",
             list_str(weight.tensor()->shape), " and normalized_shape = ", list_str(ns));
  if (!bias.is_none())
    KR_CHECK(bias.tensor()->shape == ns, Runtime,
             "Expected bias to be of same shape as normalized_shape, but got bias of shape ",
             list_str(bias.tensor()->shape), " and normalized_shape = ", list_str(ns));
  std::vector<int64_t> dims;
  for (int64_t i = x->ndim() - k; i < x->ndim(); ++i) dims.push_back(i);
  return dims;
}

// An affine parameter (weight/bias over the trailing dims) broadcast to `shape` in `dt`.
TensorRef param(Builder& b, const Arg& p, const Shape& shape, DType dt) {
  return expand_to(b, cvt(b, p.tensor(), dt), shape);
}

void check_same_dtype(const TensorRef& a, const TensorRef& c, std::string_view what) {
  KR_CHECK(a->dtype == c->dtype, Runtime, what, ": expected both operands to have the same dtype, "
           "but got: ", dtype_name(a->dtype), " != ", dtype_name(c->dtype));
}

// "AxB" of a matrix operand as eager's matmul messages fold it.
std::string mat_str(const Shape& s, bool lhs) {
  if (s.size() == 1) return lhs ? "1x" + std::to_string(s[0]) : std::to_string(s[0]) + "x1";
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) rows *= s[i];
  if (lhs) return std::to_string(rows) + "x" + std::to_string(s.back());
  return std::to_string(s[s.size() - 2]) + "x" + std::to_string(s.back());
}

// update: also compute the new running statistics; returns [out, new_mean, new_var].
Arg batch_norm_impl(Builder& b, const Arg::List& a, bool update) {
  const auto& x = a[0].tensor();
  const Arg &rm = a[1], &rv = a[2], &w = a[3], &bias = a[4];
  bool training = a[5].as_bool();
  double momentum = a[6].as_double(), eps = a[7].as_double();
  KR_CHECK(x->ndim() >= 2, Value, "batch_norm: expected 2D or higher input (got ", x->ndim(), "D input)");
  KR_CHECK(is_float(x->dtype), Runtime, "\"batch_norm\" not implemented for '",
           torch_type_name(x->dtype), "'");
  int64_t C = x->shape[1];
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x->ndim(); ++i)
    if (i != 1) dims.push_back(i);
  int64_t M = reduced_numel(x->shape, dims);
  if (training)
    KR_CHECK(M > 1, Value, "Expected more than 1 value per channel when training, got input size ",
             size_repr(x->shape));
  KR_CHECK(training || (!rm.is_none() && !rv.is_none()), Runtime,
           "batch_norm: running_mean and running_var must be defined in evaluation mode");
  for (const auto& [p, name] : {std::pair{&rm, "running_mean"}, {&rv, "running_var"},
                                {&w, "weight"}, {&bias, "bias"}})
    if (!p->is_none())
      KR_CHECK(p->tensor()->numel() == C && p->tensor()->ndim() == 1, Runtime, name,
               " should contain ", C, " elements not ", p->tensor()->numel());
  KR_INTERNAL(update == (training && !rm.is_none() && !rv.is_none()),
              "batch_norm: the wrong op variant was recorded");
  DType cd = compute_dtype(x->dtype);
  auto xc = cvt(b, x, cd);
  TensorRef mean, var;
  if (training) {
    mean = mean_of(b, xc, dims);
    var = prim(b, OpId::prim_var, {Arg(xc), Arg::int_list(Shape(dims.begin(), dims.end())), Arg(0.0)});
  } else {
    mean = cvt(b, rm.tensor(), cd);
    var = cvt(b, rv.tensor(), cd);
  }
  auto invstd = prim(b, OpId::prim_rsqrt, {Arg(prim(b, OpId::prim_add, {Arg(var), Arg(eps)}))});
  auto y = prim(b, OpId::prim_sub, {Arg(xc), Arg(expand_back(b, mean, x->shape, dims))});
  y = prim(b, OpId::prim_mul, {Arg(y), Arg(expand_back(b, invstd, x->shape, dims))});
  if (!w.is_none())
    y = prim(b, OpId::prim_mul, {Arg(y), Arg(expand_back(b, cvt(b, w.tensor(), cd), x->shape, dims))});
  if (!bias.is_none())
    y = prim(b, OpId::prim_add, {Arg(y), Arg(expand_back(b, cvt(b, bias.tensor(), cd), x->shape, dims))});
  auto out = cvt(b, y, x->dtype);
  if (update) {
    // running = (1 - momentum) * running + momentum * batch stat (unbiased variance).
    Arg::List outs{Arg(out)};
    for (int k = 0; k < 2; ++k) {
      const auto& run = (k == 0 ? rm : rv).tensor();
      DType rd = compute_dtype(run->dtype);
      auto stat = cvt(b, k == 0 ? mean : var, rd);
      if (k == 1)
        stat = prim(b, OpId::prim_mul, {Arg(stat), Arg(static_cast<double>(M) / static_cast<double>(M - 1))});
      auto old = prim(b, OpId::prim_mul, {Arg(cvt(b, run, rd)), Arg(1.0 - momentum)});
      auto upd = prim(b, OpId::prim_add, {Arg(old), Arg(prim(b, OpId::prim_mul, {Arg(stat), Arg(momentum)}))});
      outs.emplace_back(cvt(b, upd, run->dtype));
    }
    return Arg(std::move(outs));
  }
  return Arg(out);
}

} // namespace

Arg impl_layer_norm(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  auto dims = check_normalized(x, a[1].int_list(), a[2], a[3]);
  KR_CHECK(is_float(x->dtype), NotImplemented, "\"LayerNormKernelImpl\" not implemented for '",
           torch_type_name(x->dtype), "'");
  double eps = a[4].as_double();
  DType cd = compute_dtype(x->dtype);
  auto xc = make_contiguous(b, cvt(b, x, cd));
  auto mean = expand_back(b, mean_of(b, xc, dims), x->shape, dims);
  auto var = prim(b, OpId::prim_var, {Arg(xc), Arg::int_list(Shape(dims.begin(), dims.end())), Arg(0.0)});
  auto rstd = prim(b, OpId::prim_rsqrt, {Arg(prim(b, OpId::prim_add, {Arg(var), Arg(eps)}))});
  auto y = prim(b, OpId::prim_mul, {Arg(prim(b, OpId::prim_sub, {Arg(xc), Arg(mean)})),
                                    Arg(expand_back(b, rstd, x->shape, dims))});
  if (!a[2].is_none()) y = prim(b, OpId::prim_mul, {Arg(y), Arg(param(b, a[2], x->shape, cd))});
  if (!a[3].is_none()) y = prim(b, OpId::prim_add, {Arg(y), Arg(param(b, a[3], x->shape, cd))});
  return Arg(cvt(b, y, x->dtype));
}

Arg impl_rms_norm(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  auto dims = check_normalized(x, a[1].int_list(), a[2], Arg());
  KR_CHECK(is_float(x->dtype), NotImplemented, "\"rms_norm\" not implemented for '",
           torch_type_name(x->dtype), "'");
  DType cd = compute_dtype(x->dtype);
  // eps=None: the machine epsilon of the computation type (eager's opmath type).
  double eps = !a[3].is_none() ? a[3].as_double()
               : cd == DType::Float64 ? std::numeric_limits<double>::epsilon()
                                      : static_cast<double>(std::numeric_limits<float>::epsilon());
  auto xc = make_contiguous(b, cvt(b, x, cd));
  auto ms = mean_of(b, prim(b, OpId::prim_mul, {Arg(xc), Arg(xc)}), dims);
  auto r = prim(b, OpId::prim_rsqrt, {Arg(prim(b, OpId::prim_add, {Arg(ms), Arg(eps)}))});
  auto y = prim(b, OpId::prim_mul, {Arg(xc), Arg(expand_back(b, r, x->shape, dims))});
  if (!a[2].is_none()) y = prim(b, OpId::prim_mul, {Arg(y), Arg(param(b, a[2], x->shape, cd))});
  return Arg(cvt(b, y, x->dtype));
}

Arg impl_batch_norm(Builder& b, const Arg::List& a) { return batch_norm_impl(b, a, false); }
Arg impl_batch_norm_functional(Builder& b, const Arg::List& a) {
  return batch_norm_impl(b, {a[0], a[1], a[2], a[3], a[4], Arg(true), a[5], a[6]}, true);
}

// The output and the running-statistics update come from one functional op (run by torch's
// own batch_norm on copies of the statistics, so values match eager exactly); the new
// statistics are then written back in place.
Arg impl_batch_norm_update(Builder& b, const Arg::List& a) {
  Arg r = b.call(OpId::batch_norm_functional, {a[0], a[1], a[2], a[3], a[4], a[6], a[7]});
  const auto& outs = r.list();
  b.write_into(a[1].tensor(), outs[1].tensor());
  b.write_into(a[2].tensor(), outs[2].tensor());
  return outs[0];
}

Arg impl_matmul(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const auto& y = a[1].tensor();
  KR_CHECK(x->ndim() >= 1 && y->ndim() >= 1, Runtime,
           "both arguments to matmul need to be at least 1D, but they are ", x->ndim(), "D and ",
           y->ndim(), "D");
  check_same_dtype(x, y, "matmul");
  if (x->ndim() == 1 && y->ndim() == 1) {
    KR_CHECK(x->shape[0] == y->shape[0], Runtime,
             "inconsistent tensor size, expected tensor [", x->shape[0], "] and src [", y->shape[0],
             "] to have the same number of elements, but got ", x->shape[0], " and ", y->shape[0],
             " elements respectively");
  } else {
    int64_t k2 = y->ndim() == 1 ? y->shape[0] : y->shape[y->ndim() - 2];
    KR_CHECK(x->shape.back() == k2, Runtime, "mat1 and mat2 shapes cannot be multiplied (",
             mat_str(x->shape, true), " and ", mat_str(y->shape, false), ")");
    Shape xb(x->shape.begin(), x->shape.end() - std::min<int64_t>(2, x->ndim()));
    Shape yb(y->shape.begin(), y->shape.end() - std::min<int64_t>(2, y->ndim()));
    broadcast_shapes({xb, yb}, "matmul");
  }
  return b.call(OpId::prim_matmul, {a[0], a[1]});
}

Arg impl_bmm(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const auto& y = a[1].tensor();
  KR_CHECK(x->ndim() == 3, Runtime, "batch1 must be a 3D tensor");
  KR_CHECK(y->ndim() == 3, Runtime, "batch2 must be a 3D tensor");
  KR_CHECK(y->shape[0] == x->shape[0] && y->shape[1] == x->shape[2], Runtime,
           "Expected size for first two dimensions of batch2 tensor to be: [", x->shape[0], ", ",
           x->shape[2], "] but got: [", y->shape[0], ", ", y->shape[1], "].");
  check_same_dtype(x, y, "bmm");
  return b.call(OpId::prim_matmul, {a[0], a[1]});
}

Arg impl_linear(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const auto& w = a[1].tensor();
  KR_CHECK(x->ndim() >= 1, Runtime, "both arguments to linear need to be at least 1D, but they are ",
           x->ndim(), "D and ", w->ndim(), "D");
  KR_CHECK(w->ndim() == 1 || w->ndim() == 2, Runtime, "linear: weight must be 1D or 2D, got ",
           w->ndim(), "D");
  KR_CHECK(x->dtype == w->dtype, Runtime, "mat1 and mat2 must have the same dtype, but got ",
           torch_type_name(x->dtype), " and ", torch_type_name(w->dtype));
  KR_CHECK(x->shape.back() == w->shape.back(), Runtime, "mat1 and mat2 shapes cannot be multiplied (",
           mat_str(x->shape, true), " and ",
           w->ndim() == 2 ? std::to_string(w->shape[1]) + "x" + std::to_string(w->shape[0])
                          : std::to_string(w->shape[0]) + "x1",
           ")");
  TensorRef wt = w->ndim() == 2 ? prim(b, OpId::prim_permute, {Arg(w), Arg::int_list({1, 0})}) : w;
  TensorRef y = prim(b, OpId::prim_matmul, {Arg(x), Arg(wt)});
  if (!a[2].is_none()) {
    const auto& bias = a[2].tensor();
    KR_CHECK(bias->dtype == x->dtype, Runtime, "linear: expected bias of dtype ",
             dtype_name(x->dtype), " but got ", dtype_name(bias->dtype));
    KR_CHECK(broadcast_shapes({y->shape, bias->shape}, "linear") == y->shape, Runtime,
             "linear: the bias of shape ", list_str(bias->shape),
             " does not broadcast to the output shape ", list_str(y->shape));
    y = elementwise(b, OpId::prim_add, {Arg(y), a[2]}, Promotion::Default, "linear");
  }
  return Arg(y);
}

Arg impl_embedding(Builder& b, const Arg::List& a) {
  const auto& idx = a[0].tensor();
  const auto& w = a[1].tensor();
  KR_CHECK(w->ndim() == 2, Runtime, "'weight' must be 2-D");
  KR_CHECK(idx->dtype == DType::Int64 || idx->dtype == DType::Int32, Runtime,
           "Expected tensor for argument #1 'indices' to have one of the following scalar types: "
           "Long, Int; but got torch.", torch_type_name(idx->dtype),
           "Tensor instead (while checking arguments for embedding)");
  if (!a[2].is_none()) {
    int64_t p = a[2].as_int();
    KR_CHECK(p >= -w->shape[0] && p < w->shape[0], Value,
             "Padding_idx must be within num_embeddings");
  }
  return b.call(OpId::prim_take, {a[1], a[0], Arg(int64_t{0}), Arg(int64_t{1})});
}

Arg impl_cross_entropy(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const auto& t = a[1].tensor();
  const std::string& reduction = a[4].as_str();
  KR_CHECK(reduction == "none" || reduction == "mean" || reduction == "sum", Value, reduction,
           " is not a valid value for reduction");
  KR_CHECK(x->ndim() >= 1, Runtime, "cross_entropy: input must be at least 1D");
  KR_CHECK(is_float(x->dtype), NotImplemented, "\"log_softmax_lastdim_kernel_impl\" not implemented for '",
           torch_type_name(x->dtype), "'");
  double ls = a[5].as_double();
  KR_CHECK(ls >= 0.0 && ls <= 1.0, Runtime,
           "label_smoothing must be between 0.0 and 1.0. Got: ", ls);
  int64_t cd = x->ndim() >= 2 ? 1 : 0;
  int64_t C = x->shape[cd];
  Shape no_class = x->shape;
  no_class.erase(no_class.begin() + cd);
  if (!a[2].is_none()) {
    const auto& w = a[2].tensor();
    KR_CHECK(w->ndim() == 1 && w->shape[0] == C, Runtime, "weight tensor should be defined either "
             "for all ", C, " classes or no classes but got weight tensor of shape: ",
             list_str(w->shape));
    KR_CHECK(w->dtype == x->dtype, Runtime, "expected scalar type ", torch_type_name(x->dtype),
             " but found ", torch_type_name(w->dtype));
  }
  Shape out_shape;
  if (is_float(t->dtype)) {
    // Class probabilities.
    KR_CHECK(t->shape == x->shape, Runtime, "Expected target size ", list_str(x->shape), ", got ",
             list_str(t->shape));
    KR_CHECK(t->dtype == x->dtype, Runtime, "expected scalar type ", torch_type_name(x->dtype),
             " but found ", torch_type_name(t->dtype));
    if (reduction == "none") out_shape = no_class;
  } else {
    if (x->device.type == DeviceType::CUDA && x->ndim() <= 2) {
      // Eager's CUDA kernels check the index type in their dispatch (the CPU one up front).
      const char* kernel = x->ndim() == 1    ? "nll_loss_forward_reduce_cuda_kernel_1d_index"
                           : reduction == "none" ? "nll_loss_forward_no_reduce_cuda_kernel_index"
                                                 : "nll_loss_forward_reduce_cuda_kernel_2d_index";
      KR_CHECK(t->dtype == DType::Int64 || t->dtype == DType::UInt8, NotImplemented, "\"", kernel,
               "\" not implemented for '", torch_type_name(t->dtype), "'");
    }
    KR_CHECK(t->dtype == DType::Int64 || t->dtype == DType::UInt8, Runtime,
             "expected target dtype to be Long or Byte, but got ", torch_type_name(t->dtype));
    if (x->ndim() >= 2 && t->ndim() >= 1)
      KR_CHECK(t->shape[0] == x->shape[0], Value, "Expected input batch_size (", x->shape[0],
               ") to match target batch_size (", t->shape[0], ").");
    KR_CHECK(t->shape == no_class, Runtime, "Expected target size ", list_str(no_class), ", got ",
             list_str(t->shape));
    if (reduction == "none") out_shape = t->shape;
  }
  // Decomposition: log_softmax over the class dim, then the weighted pick (class indices) or the
  // weighted sum against the target distribution (probabilities), computed in float32 for
  // float16/bfloat16 inputs.
  DType cdt = compute_dtype(x->dtype);
  std::vector<int64_t> cdims{cd};
  std::vector<int64_t> all;
  for (int64_t i = 0; i < static_cast<int64_t>(no_class.size()); ++i) all.push_back(i);
  auto logp = cvt(b, b.call(OpId::log_softmax, {a[0], Arg(cd), Arg()}).tensor(), cdt);
  auto num = [](double v) { return Arg(v); };
  auto mul = [&](const TensorRef& p, const Arg& q) { return prim(b, OpId::prim_mul, {Arg(p), q}); };
  auto sum_all = [&](const TensorRef& t) { return reduce(b, OpId::prim_sum, t, all); };
  auto div = [&](const TensorRef& p, const TensorRef& q) { return prim(b, OpId::prim_div, {Arg(p), Arg(q)}); };
  TensorRef wb; // the class weights broadcast to the input's shape
  if (!a[2].is_none()) {
    auto w = cvt(b, a[2].tensor(), cdt);
    wb = prim(b, OpId::prim_broadcast_in_dim, {Arg(w), Arg::int_list(x->shape), Arg::int_list({cd})});
  }
  TensorRef result;
  if (is_float(t->dtype)) {
    auto tgt = cvt(b, t, cdt);
    if (ls > 0.0)
      tgt = prim(b, OpId::prim_add, {Arg(mul(tgt, num(1.0 - ls))), num(ls / static_cast<double>(C))});
    auto prod = mul(logp, Arg(tgt));
    if (wb) prod = mul(prod, Arg(wb));
    auto loss = prim(b, OpId::prim_neg, {Arg(reduce(b, OpId::prim_sum, prod, cdims))});
    if (reduction == "none") result = loss;
    else if (reduction == "sum") result = sum_all(loss);
    else result = prim(b, OpId::prim_div, {Arg(sum_all(loss)), num(static_cast<double>(numel(no_class)))});
    return Arg(cvt(b, result, x->dtype));
  }
  auto mask = prim(b, OpId::prim_ne, {a[1], a[3]});
  auto safe = cvt(b, prim(b, OpId::prim_where, {Arg(mask), a[1], Arg(int64_t{0})}), DType::Int64);
  Shape kept = x->shape;
  kept[cd] = 1;
  auto idx = prim(b, OpId::prim_reshape, {Arg(safe), Arg::int_list(kept)});
  auto picked = prim(b, OpId::prim_gather, {Arg(logp), Arg(cd), Arg(idx), Arg(int64_t{4})});
  auto nll = prim(b, OpId::prim_neg, {Arg(prim(b, OpId::prim_reshape, {Arg(picked), Arg::int_list(no_class)}))});
  auto wm = cvt(b, mask, cdt); // per-element weight: class weight where not ignored, else 0
  if (!a[2].is_none()) {
    auto wt = prim(b, OpId::prim_take,
                   {Arg(cvt(b, a[2].tensor(), cdt)), Arg(safe), Arg(int64_t{0}), Arg(int64_t{4})});
    wm = mul(wt, Arg(wm));
  }
  auto loss = mul(nll, Arg(wm));
  if (reduction == "sum") loss = sum_all(loss);
  if (reduction == "mean") loss = div(sum_all(loss), sum_all(wm));
  result = loss;
  if (ls > 0.0) {
    auto lw = wb ? mul(logp, Arg(wb)) : logp;
    auto smooth = prim(b, OpId::prim_neg, {Arg(reduce(b, OpId::prim_sum, lw, cdims))});
    smooth = prim(b, OpId::prim_where, {Arg(mask), Arg(smooth), num(0.0)});
    if (reduction == "sum") smooth = sum_all(smooth);
    if (reduction == "mean") smooth = div(sum_all(smooth), sum_all(wb ? wm : cvt(b, mask, cdt)));
    result = prim(b, OpId::prim_add, {Arg(mul(result, num(1.0 - ls))),
                                      Arg(mul(smooth, num(ls / static_cast<double>(C))))});
  }
  return Arg(cvt(b, result, x->dtype));
}

Arg impl_scaled_dot_product_attention(Builder& b, const Arg::List& a) {
  const auto& q = a[0].tensor();
  const auto& k = a[1].tensor();
  const auto& v = a[2].tensor();
  KR_CHECK(q->dtype == k->dtype && q->dtype == v->dtype, Runtime,
           "Expected query, key, and value to have the same dtype, but got query.dtype: ",
           dtype_name(q->dtype), " key.dtype: ", dtype_name(k->dtype), " and value.dtype: ",
           dtype_name(v->dtype), " instead.");
  KR_CHECK(q->ndim() >= 2 && k->ndim() >= 2 && v->ndim() >= 2, Runtime,
           "scaled_dot_product_attention: query, key and value must be at least 2D");
  KR_CHECK(is_float(q->dtype), Runtime, "scaled_dot_product_attention: expected floating point "
           "inputs, got ", dtype_name(q->dtype));
  KR_CHECK(q->shape.back() == k->shape.back(), Runtime,
           "scaled_dot_product_attention: query and key must have the same embedding dim, got ",
           q->shape.back(), " and ", k->shape.back());
  KR_CHECK(k->shape[k->ndim() - 2] == v->shape[v->ndim() - 2], Runtime,
           "scaled_dot_product_attention: key and value must have the same sequence length, got ",
           k->shape[k->ndim() - 2], " and ", v->shape[v->ndim() - 2]);
  double p = a[4].as_double();
  KR_CHECK(p >= 0.0 && p <= 1.0, Runtime, "dropout probability has to be between 0 and 1, but got ", p);
  if (!a[3].is_none()) {
    const auto& m = a[3].tensor();
    KR_CHECK(!a[5].as_bool(), Runtime,
             "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True");
    KR_CHECK(m->dtype == DType::Bool || m->dtype == q->dtype, Runtime,
             "Expected attn_mask dtype to be bool or float or to match query dtype, but got "
             "attn_mask.dtype: ", dtype_name(m->dtype), " and  query.dtype: ", dtype_name(q->dtype),
             " instead.");
  }
  Shape out = q->shape;
  out.back() = v->shape.back();
  // Opaque: runs torch's implementation.
  return Arg(b.new_tensor(q->dtype, q->device, out));
}

} // namespace keraunos::ops

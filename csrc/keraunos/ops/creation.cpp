// Creation ops: factories and *_like ops. Each decomposes into one creation prim (prim_full,
// prim_iota, prim_uniform, prim_normal), laid out like eager's result: *_like ops preserve the
// input's memory format (the prim creates the values in the permuted order, then permutes).
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/meta.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace keraunos::ops {

namespace {


void check_sizes(const Shape& size, std::string_view op) {
  for (auto s : size) {
    if (s >= 0) continue;
    if (op == "zeros") KR_USER_ERROR(Runtime, "zeros: Dimension size must be non-negative.");
    KR_USER_ERROR(Runtime, "Trying to create tensor with negative dimension ", s, ": ",
                  shape_str(size));
  }
}

void check_requires_grad(const Arg& rg, DType dtype, std::string_view op) {
  if (!rg.as_bool()) return;
  KR_CHECK(is_float(dtype), Runtime,
           "Only Tensors of floating point and complex dtype can require gradients");
  KR_USER_ERROR(NotImplemented, "keraunos: torch.", op,
                "(requires_grad=True) inside a jitted function is not supported yet; create the "
                "tensor outside the function and pass it in");
}

void check_random_dtype(DType d, bool normal) {
  KR_CHECK(is_float(d), NotImplemented, normal ? "\"normal_kernel_cpu\"" : "\"check_uniform_bounds\"",
           " not implemented for '", dtype_scalar_name(d), "'");
}

DType dtype_or(const Arg& a, DType d) { return a.is_none() ? d : a.as_dtype(); }
Device device_or(const Arg& a, Device d) { return a.is_none() ? d : a.as_device(); }

// torch's is_non_overlapping_and_dense.
bool non_overlapping_and_dense(const TensorProxy& t) {
  const int64_t nd = t.ndim();
  if (nd == 1) return t.shape[0] < 2 || t.strides[0] == 1;
  std::vector<int64_t> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  std::sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
    if (t.shape[a] < 2) return false;
    if (t.shape[b] < 2) return true;
    return t.strides[a] < t.strides[b];
  });
  int64_t require = 1;
  for (int64_t i = 0; i < nd; ++i) {
    int64_t s = t.shape[perm[i]];
    if (s < 2) return true;
    if (t.strides[perm[i]] != require) return false;
    require *= s;
  }
  return true;
}

// The strides empty_like(a) (memory format preserved) gives.
Shape like_strides(const TensorRef& a) {
  if (non_overlapping_and_dense(*a)) return a->strides;
  return elementwise_strides({a}, a->shape);
}

// Creates a tensor of `shape` laid out in the order of `strides` (outermost = largest stride):
// `make(permuted_shape)` creates it in that order, then a permute puts the dims back.
template <typename Make>
TensorRef create_laid_out(Builder& b, const Shape& shape, const Shape& strides, Make make) {
  const size_t nd = shape.size();
  std::vector<int64_t> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  if (strides.size() == nd)
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int64_t x, int64_t y) { return strides[x] > strides[y]; });
  bool identity = true;
  for (size_t i = 0; i < nd; ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return make(shape);
  Shape pshape, inv(nd);
  for (size_t i = 0; i < nd; ++i) {
    pshape.push_back(shape[perm[i]]);
    inv[perm[i]] = static_cast<int64_t>(i);
  }
  TensorRef t = make(pshape);
  return b.call(OpId::prim_permute, {Arg(t), Arg::int_list(inv)}).tensor();
}

TensorRef full_prim(Builder& b, const Shape& shape, const Arg& value, DType d, Device dev) {
  return b.call(OpId::prim_full, {Arg::int_list(shape), value, Arg(d), Arg(dev)}).tensor();
}

TensorRef random_prim(Builder& b, bool normal, const Shape& shape, DType d, Device dev) {
  return b.call(normal ? OpId::prim_normal : OpId::prim_uniform,
                {Arg::int_list(shape), Arg(0.0), Arg(1.0), Arg(d), Arg(dev)})
      .tensor();
}

// Schema of factories: (size, [fill_value,] *, dtype, device, requires_grad).
Arg factory(Builder& b, const Arg::List& a, std::string_view op, const Arg& value) {
  Shape size = a[0].int_list();
  size_t k = a.size() - 3;
  DType d = dtype_or(a[k], b.options().default_float);
  Device dev = device_or(a[k + 1], Device{});
  check_sizes(size, op);
  check_requires_grad(a[k + 2], d, op);
  return Arg(full_prim(b, size, value, d, dev));
}

Arg random_factory(Builder& b, const Arg::List& a, std::string_view op, bool normal) {
  Shape size = a[0].int_list();
  DType d = dtype_or(a[1], b.options().default_float);
  Device dev = device_or(a[2], Device{});
  check_sizes(size, op);
  check_random_dtype(d, normal);
  check_requires_grad(a[3], d, op);
  return Arg(random_prim(b, normal, size, d, dev));
}

// Schema of *_like ops: (a, [fill_value,] *, dtype, device, requires_grad).
Arg like(Builder& b, const Arg::List& a, std::string_view op, const Arg& value, int random) {
  const auto& x = a[0].tensor();
  size_t k = a.size() - 3;
  DType d = dtype_or(a[k], x->dtype);
  Device dev = device_or(a[k + 1], x->device);
  if (random >= 0) check_random_dtype(d, random == 1);
  check_requires_grad(a[k + 2], d, op);
  return Arg(create_laid_out(b, x->shape, like_strides(x), [&](const Shape& s) {
    return random >= 0 ? random_prim(b, random == 1, s, d, dev) : full_prim(b, s, value, d, dev);
  }));
}

} // namespace

Arg impl_zeros(Builder& b, const Arg::List& a) { return factory(b, a, "zeros", Arg(int64_t{0})); }
Arg impl_ones(Builder& b, const Arg::List& a) { return factory(b, a, "ones", Arg(int64_t{1})); }
Arg impl_empty(Builder& b, const Arg::List& a) { return factory(b, a, "empty", Arg(int64_t{0})); }
Arg impl_rand(Builder& b, const Arg::List& a) { return random_factory(b, a, "rand", false); }
Arg impl_randn(Builder& b, const Arg::List& a) { return random_factory(b, a, "randn", true); }

Arg impl_full(Builder& b, const Arg::List& a) {
  const Arg& v = a[1];
  // The default dtype follows the fill value: bool, int64 or the default float.
  Arg::List args = a;
  if (args[2].is_none())
    args[2] = Arg(v.is_float() ? b.options().default_float : v.number_dtype());
  return factory(b, args, "full", v);
}

Arg impl_arange(Builder& b, const Arg::List& a) {
  const Arg &start = a[0], &end = a[1], &step = a[2];
  DType d = a[3].is_none()
                ? ((start.is_float() || end.is_float() || step.is_float()) ? b.options().default_float
                                                                           : DType::Int64)
                : a[3].as_dtype();
  Device dev = device_or(a[4], Device{});
  KR_CHECK(d != DType::Bool, NotImplemented, "\"arange_cpu\" not implemented for 'Bool'");
  double s0 = start.as_double(), e0 = end.as_double(), st0 = step.as_double();
  int64_t length = 0;
  Arg pstart(int64_t{0}), pstep(int64_t{1});
  if (d == DType::Int64) {
    // Integer arithmetic on the truncated bounds, as eager does for int64.
    KR_CHECK(!(st0 != 0 && std::trunc(st0) == 0), Value, "step must be nonzero");
    KR_CHECK(st0 != 0, Runtime, "step must be nonzero");
    KR_CHECK(std::isfinite(s0) && std::isfinite(e0), Runtime, "unsupported range: ",
             s0, " -> ", e0);
    int64_t xs = static_cast<int64_t>(s0), xe = static_cast<int64_t>(e0),
            xst = static_cast<int64_t>(st0);
    if (start.is_int()) xs = start.as_int();
    if (end.is_int()) xe = end.as_int();
    if (step.is_int()) xst = step.as_int();
    KR_CHECK((xst > 0 && xe >= xs) || (xst < 0 && xe <= xs), Runtime,
             "upper bound and lower bound inconsistent with step sign");
    int64_t sgn = xst > 0 ? 1 : -1;
    length = (xe - xs + xst - sgn) / xst;
    pstart = Arg(xs);
    pstep = Arg(xst);
  } else {
    KR_CHECK(st0 != 0, Runtime, "step must be nonzero");
    KR_CHECK(std::isfinite(s0) && std::isfinite(e0), Runtime, "unsupported range: ",
             s0, " -> ", e0);
    KR_CHECK((st0 > 0 && e0 >= s0) || (st0 < 0 && e0 <= s0), Runtime,
             "upper bound and lower bound inconsistent with step sign");
    double size_d = std::ceil((e0 - s0) / st0);
    KR_CHECK(size_d >= 0 && size_d <= 9.2e18, Runtime, "invalid size, possible overflow?");
    length = static_cast<int64_t>(size_d);
    if (is_float(d)) {
      pstart = Arg(s0);
      pstep = Arg(st0);
    } else {
      // Smaller integer types: the values are computed from the truncated start and step.
      pstart = Arg(static_cast<int64_t>(s0));
      pstep = Arg(static_cast<int64_t>(st0));
    }
  }
  check_requires_grad(a[5], d, "arange");
  return b.call(OpId::prim_iota, {Arg(length), pstart, pstep, Arg(d), Arg(dev)});
}

Arg impl_zeros_like(Builder& b, const Arg::List& a) { return like(b, a, "zeros_like", Arg(int64_t{0}), -1); }
Arg impl_ones_like(Builder& b, const Arg::List& a) { return like(b, a, "ones_like", Arg(int64_t{1}), -1); }
Arg impl_empty_like(Builder& b, const Arg::List& a) { return like(b, a, "empty_like", Arg(int64_t{0}), -1); }
Arg impl_full_like(Builder& b, const Arg::List& a) { return like(b, a, "full_like", a[1], -1); }
Arg impl_rand_like(Builder& b, const Arg::List& a) { return like(b, a, "rand_like", Arg(), 0); }
Arg impl_randn_like(Builder& b, const Arg::List& a) { return like(b, a, "randn_like", Arg(), 1); }

} // namespace keraunos::ops

// Ops of the functional storage model (see functional.def and passes/functionalize.cpp).
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"

namespace keraunos::ops {

namespace {
void check_in_bounds(const Shape& size, const Shape& stride, int64_t offset, int64_t extent,
                     std::string_view op) {
  KR_CHECK(size.size() == stride.size(), Runtime, op, ": mismatch in length of strides and shape");
  int64_t hi = offset;
  bool empty = false;
  for (size_t i = 0; i < size.size(); ++i) {
    KR_CHECK(size[i] >= 0 && stride[i] >= 0, Runtime, op, ": negative sizes and strides are not supported");
    empty |= size[i] == 0;
    hi += (size[i] - 1) * stride[i];
  }
  KR_CHECK(empty || (offset >= 0 && hi < extent), Runtime, op, ": the strided view [",
           shape_str(size), " strides ", shape_str(stride), " offset ", offset,
           "] reaches beyond a storage of ", extent, " elements");
}
} // namespace

Arg impl_as_strided(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  Shape size = a[1].int_list(), stride = a[2].int_list();
  KR_CHECK(size.size() == stride.size(), Runtime, "as_strided: mismatch in length of strides and shape");
  return Arg(b.new_view(t, size, stride, a[3].as_int()));
}

Arg impl_flat_storage(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  auto p = b.call(OpId::prim_permute, {a[0], a[1]});
  return b.call(OpId::prim_reshape, {p, Arg::int_list({t->numel()})});
}

Arg impl_gather_strided(Builder& b, const Arg::List& a) {
  return b.call(OpId::prim_as_strided, a);
}

Arg impl_scatter_strided(Builder& b, const Arg::List& a) {
  return b.call(OpId::prim_as_strided_scatter, a);
}

// A copy of `a` laid out with the given (dense) strides: the value written into a storage
// takes the layout of the tensor it is written into.
Arg impl_restride(Builder& b, const Arg::List& a) { return b.call(OpId::prim_restride, a); }

Arg impl_prim_restride(Builder& b, const Arg::List& a) {
  const auto& t = a[0].tensor();
  return Arg(b.new_tensor(t->dtype, t->device, t->shape, a[1].int_list()));
}

Arg impl_prim_as_strided(Builder& b, const Arg::List& a) {
  const auto& s = a[0].tensor();
  KR_INTERNAL(s->ndim() == 1, "as_strided prim reads a 1-D storage value");
  Shape size = a[1].int_list();
  check_in_bounds(size, a[2].int_list(), a[3].as_int(), s->shape[0], "as_strided");
  // The torch executor gathers with a view of the storage value: its layout is `stride`.
  return Arg(b.new_tensor(s->dtype, s->device, size, size.empty() ? Shape{} : a[2].int_list()));
}

Arg impl_prim_as_strided_scatter(Builder& b, const Arg::List& a) {
  const auto& s = a[0].tensor();
  const auto& src = a[1].tensor();
  KR_INTERNAL(s->ndim() == 1, "as_strided_scatter prim writes a 1-D storage value");
  KR_INTERNAL(src->shape == a[2].int_list() && src->dtype == s->dtype,
              "as_strided_scatter: source shape or dtype mismatch");
  check_in_bounds(a[2].int_list(), a[3].int_list(), a[4].as_int(), s->shape[0],
                  "as_strided_scatter");
  return Arg(b.new_tensor(s->dtype, s->device, s->shape));
}

Arg impl_fusion(Builder&, const Arg::List&) {
  // Regions are made by the partitioner from existing symbols, never by tracing.
  KR_INTERNAL(false, "a fusion region cannot be re-inferred from its arguments");
  return Arg();
}

} // namespace keraunos::ops

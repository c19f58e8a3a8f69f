// Mutation ops. Before functionalization they are in-place symbols whose decomposition ends
// in prims.copy_ into their first argument.
#include "keraunos/ops/mutation.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/meta.h"

#include <algorithm>

#include <algorithm>

namespace keraunos {

void check_no_internal_overlap(const TensorRef& dst, std::string_view op) {
  for (int64_t i = 0; i < dst->ndim(); ++i)
    KR_CHECK(!(dst->strides[i] == 0 && dst->shape[i] > 1), Runtime, op,
             ": unsupported operation: more than one element of the written-to tensor refers to "
             "a single memory location. Please clone() the tensor before performing the "
             "operation.");
}


namespace {
// The storage offsets a tensor covers (for overlap tests at trace time).
void offsets(const TensorProxy& t, std::vector<int64_t>& out) {
  out.clear();
  std::vector<int64_t> idx(t.ndim(), 0);
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t off = t.storage_offset;
    for (int64_t d = 0; d < t.ndim(); ++d) off += idx[d] * t.strides[d];
    out.push_back(off);
    for (int64_t d = t.ndim() - 1; d >= 0; --d) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  std::sort(out.begin(), out.end());
}

bool share_elements(const TensorProxy& a, const TensorProxy& b) {
  constexpr int64_t kMaxEnumerated = int64_t{1} << 22;
  if (a.numel() > kMaxEnumerated || b.numel() > kMaxEnumerated) return true; // assume so
  std::vector<int64_t> oa, ob;
  offsets(a, oa);
  offsets(b, ob);
  size_t i = 0, j = 0;
  while (i < oa.size() && j < ob.size()) {
    if (oa[i] == ob[j]) return true;
    oa[i] < ob[j] ? ++i : ++j;
  }
  return false;
}
} // namespace

void check_no_partial_overlap(const TensorRef& dst, const TensorRef& src, std::string_view op) {
  if (dst == src || dst->storage_id != src->storage_id || dst->numel() == 0 || src->numel() == 0)
    return;
  // Geometry without size-1 dims (setitem and copy_ drop leading ones of the source).
  auto squeezed = [](const TensorProxy& t) {
    std::vector<std::pair<int64_t, int64_t>> g;
    for (int64_t i = 0; i < t.ndim(); ++i)
      if (t.shape[i] != 1) g.emplace_back(t.shape[i], t.strides[i]);
    return g;
  };
  bool same_view = squeezed(*dst) == squeezed(*src) && dst->storage_offset == src->storage_offset;
  if (!non_overlapping_dense(dst->shape, dst->strides) || !non_overlapping_dense(src->shape, src->strides)) {
    // Eager does not check these ("too hard") and its result then depends on the order in
    // which its kernel visits elements; keraunos refuses rather than guess.
    KR_CHECK(same_view || !share_elements(*dst, *src), NotImplemented, op,
             ": the tensor written in place shares memory with an operand that is a different "
             "view of it (shape ", shape_str(src->shape), ", strides ", shape_str(src->strides),
             ", offset ", src->storage_offset, "); eager's result then depends on its kernel's "
             "iteration order. Clone the operand first.");
    return;
  }
  int64_t a0 = dst->storage_offset * itemsize(dst->dtype), a1 = a0 + dst->numel() * itemsize(dst->dtype);
  int64_t b0 = src->storage_offset * itemsize(src->dtype), b1 = b0 + src->numel() * itemsize(src->dtype);
  bool full = a0 == b0 && a1 == b1 && same_view;
  KR_CHECK(full || !(a0 < b1 && b0 < a1), Runtime, op,
           ": unsupported operation: some elements of the input tensor and the written-to tensor "
           "refer to a single memory location. Please clone() the tensor before performing the "
           "operation.");
}

namespace ops {

Arg impl_copy_(Builder& b, const Arg::List& a) {
  const auto& dst = a[0].tensor();
  const auto& src = a[1].tensor();
  check_no_internal_overlap(dst, "copy_");
  check_no_partial_overlap(dst, src, "copy_");
  broadcast_shapes({dst->shape, src->shape}, "copy_");
  KR_CHECK(broadcast_shapes({dst->shape, src->shape}, "copy_") == dst->shape, Runtime,
           "copy_: the source of shape ", shape_str(src->shape),
           " cannot be broadcast to the destination of shape ", shape_str(dst->shape));
  TensorRef s = expand_to(b, to_dtype(b, Arg(src), dst->dtype).tensor(), dst->shape);
  b.write_into(dst, s);
  return a[0];
}

namespace {
// The value of a fill as a tensor of dst's shape and dtype: prims.full for a number, the 0-d
// tensor converted and broadcast otherwise.
TensorRef fill_value(Builder& b, const TensorRef& dst, const Arg& value, std::string_view op) {
  if (!value.is_tensor())
    return b.call(OpId::prim_full, {Arg::int_list(dst->shape), value, Arg(dst->dtype),
                                    Arg(dst->device)})
        .tensor();
  const auto& v = value.tensor();
  KR_CHECK(v->ndim() == 0, Runtime, op,
           " only supports 0-dimension value tensor but got tensor with ", v->ndim(),
           " dimensions.");
  return expand_to(b, to_dtype(b, value, dst->dtype).tensor(), dst->shape);
}
} // namespace

// Eager's fill_ does not check for internal overlap: writing one value to an expanded tensor
// is well defined.
Arg impl_fill_(Builder& b, const Arg::List& a) {
  const auto& dst = a[0].tensor();
  b.write_into(dst, fill_value(b, dst, a[1], "fill_"));
  return a[0];
}

Arg impl_zero_(Builder& b, const Arg::List& a) {
  const auto& dst = a[0].tensor();
  b.write_into(dst, fill_value(b, dst, Arg(int64_t{0}), "zero_"));
  return a[0];
}

// torch.fill(a, value): empty_like(a).fill_(value). The result keeps a's layout when a is
// dense (a permute of a tensor created in memory order).
Arg impl_fill(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const Arg& value = a[1];
  if (value.is_tensor())
    KR_CHECK(value.tensor()->ndim() == 0, Runtime,
             "fill_ only supports 0-dimension value tensor but got tensor with ",
             value.tensor()->ndim(), " dimensions.");
  Shape strides = elementwise_strides({x}, x->shape);
  const size_t nd = x->shape.size();
  std::vector<int64_t> perm(nd);
  for (size_t i = 0; i < nd; ++i) perm[i] = static_cast<int64_t>(i);
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int64_t p, int64_t q) { return strides[p] > strides[q]; });
  Shape pshape, inv(nd);
  for (size_t i = 0; i < nd; ++i) {
    pshape.push_back(x->shape[perm[i]]);
    inv[perm[i]] = static_cast<int64_t>(i);
  }
  TensorRef t;
  if (value.is_tensor()) {
    TensorRef v = expand_to(b, to_dtype(b, value, x->dtype).tensor(), pshape);
    t = b.call(OpId::prim_clone, {Arg(v)}).tensor();
  } else {
    t = b.call(OpId::prim_full, {Arg::int_list(pshape), value, Arg(x->dtype), Arg(x->device)})
            .tensor();
  }
  bool identity = true;
  for (size_t i = 0; i < nd; ++i) identity = identity && inv[i] == static_cast<int64_t>(i);
  if (identity) return Arg(t);
  return b.call(OpId::prim_permute, {Arg(t), Arg::int_list(inv)});
}

} // namespace ops
} // namespace keraunos

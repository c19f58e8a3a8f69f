// Mutation ops. Before functionalization they are in-place symbols whose decomposition ends
// in prims.copy_ into their first argument.
#include "keraunos/ops/mutation.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/meta.h"

namespace keraunos {

void check_no_internal_overlap(const TensorRef& dst, std::string_view op) {
  for (int64_t i = 0; i < dst->ndim(); ++i)
    KR_CHECK(!(dst->strides[i] == 0 && dst->shape[i] > 1), Runtime, op,
             ": unsupported operation: more than one element of the written-to tensor refers to "
             "a single memory location. Please clone() the tensor before performing the "
             "operation.");
}

namespace ops {

Arg impl_copy_(Builder& b, const Arg::List& a) {
  const auto& dst = a[0].tensor();
  const auto& src = a[1].tensor();
  check_no_internal_overlap(dst, "copy_");
  broadcast_shapes({dst->shape, src->shape}, "copy_");
  KR_CHECK(broadcast_shapes({dst->shape, src->shape}, "copy_") == dst->shape, Runtime,
           "copy_: the source of shape ", shape_str(src->shape),
           " cannot be broadcast to the destination of shape ", shape_str(dst->shape));
  TensorRef s = expand_to(b, to_dtype(b, Arg(src), dst->dtype).tensor(), dst->shape);
  b.write_into(dst, s);
  return a[0];
}

} // namespace ops
} // namespace keraunos

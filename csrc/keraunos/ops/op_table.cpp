#include "keraunos/ops/op_table.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/mutation.h"

#include <array>

namespace keraunos {

namespace {

// In-place variants run the base op's implementation followed by a write into the first
// argument.
Arg inplace_impl(Builder& b, OpId self, const Arg::List& args);

template <OpId Self> Arg inplace_thunk(Builder& b, const Arg::List& args) {
  return inplace_impl(b, Self, args);
}

struct Impls {
  std::array<ImplFn, kNumOps> fns{};

  Impls() {
#define KR_OP(id_, schema_, tg, torch_fn_) fns[static_cast<int>(OpId::id_)] = &ops::impl_##id_;
#define KR_INPLACE(id_, base, torch_fn_)                                                           \
  fns[static_cast<int>(OpId::id_)] = &inplace_thunk<OpId::id_>;
#include "keraunos/ir/ops.def"
#undef KR_OP
#undef KR_INPLACE
  }
};

Arg inplace_impl(Builder& b, OpId self, const Arg::List& args) {
  const OpDef& d = op_def(self);
  const TensorRef& dst = args.at(0).tensor();
  Arg result = b.call(d.inplace_of, args); // argument errors first, as in eager
  check_no_internal_overlap(dst, d.name);
  std::vector<TensorRef> reads;
  for (size_t i = 1; i < args.size(); ++i) args[i].collect_tensors(reads);
  for (const auto& t : reads) check_no_partial_overlap(dst, t, d.name);
  const TensorRef& r = result.tensor();
  KR_CHECK(can_cast(r->dtype, dst->dtype), Runtime, "result type ", dtype_name(r->dtype),
           " can't be cast to the desired output type ", dtype_name(dst->dtype));
  KR_CHECK(r->shape == dst->shape, Runtime, "output with shape ", shape_str(dst->shape),
           " doesn't match the broadcast shape ", shape_str(r->shape));
  b.write_into(dst, r);
  return Arg(dst);
}

} // namespace

ImplFn op_impl(OpId id) {
  static const Impls impls;
  KR_INTERNAL(static_cast<int>(id) < kNumOps, "bad op id");
  return impls.fns[static_cast<int>(id)];
}

} // namespace keraunos

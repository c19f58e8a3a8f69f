// Torch fallback symbols (see fallback.def): their meta function makes the outputs the
// frontend measured on fake tensors.
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/meta.h"
#include "keraunos/ops/op_table.h"

namespace keraunos::ops {

namespace {
Arg fallback_outputs(Builder& b, const Arg::List& a) {
  Arg::List outs;
  for (const auto& m : a[3].list()) {
    const auto& f = m.list();
    KR_INTERNAL(f.size() == 4 && f[0].is_dtype() && f[1].is_device(),
                "torch_fallback: malformed output metadata");
    Shape shape = f[2].int_list(), strides = f[3].int_list();
    KR_INTERNAL(shape.size() == strides.size(), "torch_fallback: shape and strides differ in rank");
    outs.emplace_back(b.new_tensor(f[0].as_dtype(), f[1].as_device(), std::move(shape),
                                   std::move(strides)));
  }
  return Arg(std::move(outs));
}
} // namespace

Arg impl_torch_fallback(Builder& b, const Arg::List& a) { return fallback_outputs(b, a); }
Arg impl_torch_fallback_random(Builder& b, const Arg::List& a) { return fallback_outputs(b, a); }
Arg impl_torch_vjp(Builder& b, const Arg::List& a) {
  std::vector<TensorRef> ts;
  a[1].collect_tensors(ts);
  Arg::List outs;
  for (int64_t i : a[4].int_list()) {
    KR_INTERNAL(i >= 0 && i < static_cast<int64_t>(ts.size()), "torch_vjp: wrt index ", i,
                " out of range");
    // The gradient torch's backward makes has its input's layout where that is dense (SDPA's
    // backends allocate dq, dk, dv like q, k, v): a kernel reading it then needs no relayout,
    // and a transpose and reshape of it stay views. Contiguous otherwise.
    const auto& t = ts[i];
    if (non_overlapping_dense(t->shape, t->strides))
      outs.push_back(Arg(b.new_tensor(t->dtype, t->device, t->shape, t->strides)));
    else
      outs.push_back(Arg(b.new_tensor(t->dtype, t->device, t->shape)));
  }
  return Arg(std::move(outs));
}
Arg impl_torch_vjp_record(Builder& b, const Arg::List& a) {
  const OpDef* op = find_op(a[0].as_str());
  KR_INTERNAL(op && (op->id == OpId::torch_fallback || (!op->is_prim() && op->has(tags::T))),
              "torch_vjp_record: ", a[0].as_str(), " does not run through torch");
  std::vector<TensorRef> outs, ins;
  op_impl(op->id)(b, a[1].list()).collect_tensors(outs);
  a[1].collect_tensors(ins);
  Arg::List r;
  for (const auto& o : outs) r.push_back(Arg(o));
  for (const auto& o : outs)
    if (is_float(o->dtype)) r.push_back(Arg(b.new_view(o, o->shape, o->strides, o->storage_offset)));
  for (int64_t i : a[2].int_list()) {
    KR_INTERNAL(i >= 0 && i < static_cast<int64_t>(ins.size()), "torch_vjp_record: wrt index ", i,
                " out of range");
    const auto& t = ins[i];
    r.push_back(Arg(b.new_view(t, t->shape, t->strides, t->storage_offset)));
  }
  return Arg(std::move(r));
}
Arg impl_manual_seed(Builder&, const Arg::List&) { return Arg(); }
Arg impl_set_rng_state(Builder&, const Arg::List& a) {
  const auto& t = a[0].tensor();
  KR_CHECK(t->dtype == DType::UInt8 && t->ndim() == 1, Type,
           "RNG state must be a torch.ByteTensor");
  return Arg();
}

} // namespace keraunos::ops

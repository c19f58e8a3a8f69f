#include "keraunos/ops/builder.h"

#include "keraunos/ir/error.h"
#include "keraunos/ops/op_table.h"

#include <algorithm>
#include <cstdlib>

namespace keraunos {

Builder::Builder(BuilderOptions opts) : opts_(opts) { scopes_.push_back(&top_); }

std::string Builder::fresh_name() { return "t" + std::to_string(next_name_++); }

TensorRef Builder::add_input(DType dtype, Device device, Shape shape, Shape strides,
                             int64_t storage_offset, int64_t storage_id, bool requires_grad) {
  auto t = std::make_shared<TensorProxy>();
  t->name = fresh_name();
  t->dtype = dtype;
  t->device = device;
  t->strides = strides.empty() && !shape.empty() ? contiguous_strides(shape) : std::move(strides);
  t->shape = std::move(shape);
  t->storage_offset = storage_offset;
  if (storage_id < 0) {
    t->storage_id = next_storage_++;
  } else {
    // Inputs that share memory name one storage; keep ids of fresh storages above them.
    t->storage_id = storage_id + (1 << 20);
  }
  t->requires_grad = requires_grad;
  inputs_.push_back(t);
  return t;
}

TensorRef Builder::new_tensor(DType dtype, Device device, Shape shape, Shape strides) {
  auto t = std::make_shared<TensorProxy>();
  t->name = fresh_name();
  t->dtype = dtype;
  t->device = device;
  t->strides = strides.empty() ? contiguous_strides(shape) : std::move(strides);
  t->shape = std::move(shape);
  t->storage_id = next_storage_++;
  return t;
}

TensorRef Builder::new_view(const TensorRef& base, Shape shape, Shape strides,
                            int64_t storage_offset, std::optional<DType> dtype) {
  auto t = std::make_shared<TensorProxy>();
  t->name = fresh_name();
  t->dtype = dtype.value_or(base->dtype);
  t->device = base->device;
  t->shape = std::move(shape);
  t->strides = std::move(strides);
  t->storage_offset = storage_offset;
  t->storage_id = base->storage_id;
  t->requires_grad = base->requires_grad;
  return t;
}

namespace {
bool arg_mentions(const Arg::List& args, const TensorRef& t) {
  std::vector<TensorRef> ts;
  for (const auto& a : args) a.collect_tensors(ts);
  return std::find(ts.begin(), ts.end(), t) != ts.end();
}
} // namespace

Arg Builder::call(OpId op, Arg::List args, std::shared_ptr<const SourceLoc> loc) {
  KR_INTERNAL(!returned_, "call after return");
  const OpDef& d = op_def(op);
  BoundSymbol b;
  b.op = op;
  b.loc = std::move(loc);
  b.args = std::move(args);
  scopes_.push_back(&b.subsymbols);
  Arg result;
  try {
    result = op_impl(op)(*this, b.args);
  } catch (...) {
    scopes_.pop_back();
    throw;
  }
  scopes_.pop_back();
  // An op whose result is one of its inputs, unchanged (`contiguous` of a contiguous tensor,
  // a no-op `to`), records nothing: eager returns the very same tensor.
  if (result.is_tensor() && b.subsymbols.empty() && !d.is_prim() &&
      arg_mentions(b.args, result.tensor()))
    return result;
  if (d.is_inplace()) {
    b.out = Arg();
  } else {
    b.out = result;
  }
  scopes_.back()->push_back(std::move(b));
  return result;
}

const BoundSymbol* Builder::producer(const TensorRef& t) const {
  const auto& scope = *scopes_.back();
  for (auto it = scope.rbegin(); it != scope.rend(); ++it)
    for (const auto& o : it->outputs())
      if (o.get() == t.get()) return &*it;
  if (known_)
    for (auto it = known_->rbegin(); it != known_->rend(); ++it)
      for (const auto& o : it->outputs())
        if (o.get() == t.get()) return &*it;
  return nullptr;
}

Arg Builder::call_user(OpId op, const Arg::List& args, const Kwargs& kwargs,
                       const std::string& display, std::shared_ptr<const SourceLoc> loc) {
  const OpDef& d = op_def(op);
  size_t before = top_.size();
  try {
    Arg::List bound = bind_args(d.schema, args, kwargs, display);
    Arg r = call(op, std::move(bound));
    if (top_.size() > before) top_.back().loc = loc;
    return r;
  } catch (const UserError& e) {
    std::string where = loc && loc->line > 0 ? " (at " + loc->str() + ")" : "";
    throw UserError(e.kind(), std::string(e.what()) + where);
  }
}

namespace {
void scan_names(const BoundSymbol& b, int64_t& name, int64_t& storage) {
  auto see = [&](const TensorRef& t) {
    if (t->name.size() > 1 && t->name[0] == 't')
      name = std::max<int64_t>(name, std::strtoll(t->name.c_str() + 1, nullptr, 10) + 1);
    storage = std::max<int64_t>(storage, t->storage_id + 1);
  };
  for (const auto& t : b.inputs()) see(t);
  for (const auto& t : b.outputs()) see(t);
  for (const auto& s : b.subsymbols) scan_names(s, name, storage);
}
} // namespace

void Builder::reserve_names(const Trace& t) {
  for (const auto& i : t.inputs) {
    if (i->name.size() > 1 && i->name[0] == 't')
      next_name_ = std::max<int64_t>(next_name_, std::strtoll(i->name.c_str() + 1, nullptr, 10) + 1);
    next_storage_ = std::max<int64_t>(next_storage_, i->storage_id + 1);
  }
  for (const auto& b : t.bsyms) scan_names(b, next_name_, next_storage_);
}

void Builder::write_into(const TensorRef& dst, const TensorRef& src) {
  call(OpId::prim_copy_, {Arg(dst), Arg(src)});
}

void Builder::set_return(Arg output) {
  KR_INTERNAL(!returned_, "return recorded twice");
  BoundSymbol b;
  b.op = OpId::return_;
  b.args = {std::move(output)};
  top_.push_back(std::move(b));
  returned_ = true;
}

Trace Builder::finish() {
  KR_INTERNAL(returned_, "trace finished without a return");
  Trace t;
  t.inputs = inputs_;
  t.bsyms = std::move(top_);
  top_.clear();
  return t;
}

Arg reinfer(const BoundSymbol& bsym, const BuilderOptions& opts) {
  Builder scratch(opts);
  return op_impl(bsym.op)(scratch, bsym.args);
}

} // namespace keraunos

#include "keraunos/ops/meta.h"

#include "keraunos/ir/error.h"

#include <algorithm>
#include <numeric>

namespace keraunos {

Shape broadcast_shapes(const std::vector<Shape>& shapes, std::string_view op) {
  size_t nd = 0;
  for (const auto& s : shapes) nd = std::max(nd, s.size());
  Shape out(nd, 1);
  for (const auto& s : shapes) {
    size_t off = nd - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[off + i];
      if (s[i] == o || s[i] == 1) continue;
      KR_CHECK(o == 1, Runtime, op, ": The size of tensor a (", o,
               ") must match the size of tensor b (", s[i], ") at non-singleton dimension ",
               off + i,
               " (shapes ", shape_str(shapes.front()), " and ", shape_str(s), ")");
      o = s[i];
    }
  }
  return out;
}

namespace {
// torch's combine_categories.
DType combine_categories(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return *lower;
  if (!lower) return *higher;
  if (is_float(*higher)) return *higher;
  if (*higher == DType::Bool || is_float(*lower)) return promote_types(*higher, *lower);
  return *higher;
}
void update(std::optional<DType>& slot, DType d) { slot = slot ? promote_types(*slot, d) : d; }
} // namespace

DType result_type(const Arg::List& operands, DType default_float) {
  std::optional<DType> dim, zero, wrapped;
  for (const auto& a : operands) {
    if (a.is_tensor()) {
      update(a.tensor()->ndim() > 0 ? dim : zero, a.tensor()->dtype);
    } else if (a.is_number()) {
      DType d = a.number_dtype();
      update(wrapped, d == DType::Float32 ? default_float : d);
    }
  }
  KR_INTERNAL(dim || zero || wrapped, "result_type of no operands");
  std::optional<DType> low = (zero || wrapped)
                                 ? std::optional<DType>(combine_categories(zero, wrapped))
                                 : std::nullopt;
  return combine_categories(dim, low);
}

bool non_overlapping_dense(const Shape& sizes, const Shape& strides) {
  const size_t n = sizes.size();
  if (n == 1) return sizes[0] < 2 || strides[0] == 1;
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::sort(perm.begin(), perm.end(), [&](size_t a, size_t b) {
    if (sizes[a] < 2) return false;
    if (sizes[b] < 2) return true;
    return strides[a] < strides[b];
  });
  int64_t require = 1;
  for (size_t i : perm) {
    if (sizes[i] < 2) return true;
    if (strides[i] != require) return false;
    require *= sizes[i];
  }
  return true;
}

Shape elementwise_strides(const std::vector<TensorRef>& operands, const Shape& shape) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (nd == 0) return {};
  std::vector<const TensorProxy*> ops;
  for (const auto& t : operands)
    if (t->shape == shape) ops.push_back(t.get());
  // Fast paths of TensorIterator: all contiguous, or all sharing one dense layout.
  bool all_contig = true;
  for (auto* t : ops) all_contig = all_contig && t->is_contiguous();
  if (ops.empty() || all_contig) return contiguous_strides(shape);
  // All operands share one non-overlapping dense layout: the output takes it as it is.
  bool same = non_overlapping_dense(shape, ops[0]->strides);
  for (auto* t : ops) same = same && t->strides == ops[0]->strides;
  if (same && ops.size() == operands.size()) return ops[0]->strides;
  // TensorIterator::reorder_dimensions: perm[0] is the innermost dim.
  std::vector<int64_t> perm(nd);
  std::iota(perm.rbegin(), perm.rend(), 0);
  auto should_swap = [&](int64_t d0, int64_t d1) {
    for (auto* t : ops) {
      int64_t s0 = t->strides[d0], s1 = t->strides[d1];
      if (s0 == 0 || s1 == 0) continue;
      if (s0 < s1) return -1;
      if (s0 > s1) return 1;
      if (shape[d0] > shape[d1]) return 1;
    }
    return 0;
  };
  for (int64_t i = 1; i < nd; ++i) {
    int64_t dim1 = i;
    for (int64_t dim0 = i - 1; dim0 >= 0; --dim0) {
      int c = should_swap(perm[dim0], perm[dim1]);
      if (c > 0) {
        std::swap(perm[dim0], perm[dim1]);
        dim1 = dim0;
      } else if (c < 0) {
        break;
      }
    }
  }
  Shape strides(nd);
  int64_t acc = 1;
  for (int64_t i = 0; i < nd; ++i) {
    strides[perm[i]] = acc;
    acc *= std::max<int64_t>(shape[perm[i]], 1);
  }
  return strides;
}

PromotedTypes promote(const Arg::List& operands, Promotion kind, DType default_float) {
  DType r = result_type(operands, default_float);
  if (kind == Promotion::NoPromote) {
    for (const auto& a : operands)
      if (a.is_tensor()) {
        r = a.tensor()->dtype;
        break;
      }
  }
  if (kind == Promotion::IntToFloat && !is_float(r)) r = default_float;
  if (kind == Promotion::BoolToLong && r == DType::Bool) r = DType::Int64;
  DType compute = (r == DType::Float16 || r == DType::BFloat16) ? DType::Float32 : r;
  if (kind == Promotion::AlwaysBool) return {compute, DType::Bool};
  return {compute, r};
}

Arg to_dtype(Builder& b, const Arg& a, DType d) {
  if (!a.is_tensor() || a.tensor()->dtype == d) return a;
  return b.call(OpId::prim_convert_element_type, {a, Arg(d)});
}

TensorRef expand_to(Builder& b, const TensorRef& t, const Shape& shape) {
  if (t->shape == shape) return t;
  Shape dims;
  int64_t off = static_cast<int64_t>(shape.size()) - t->ndim();
  for (int64_t i = 0; i < t->ndim(); ++i) dims.push_back(off + i);
  return b.call(OpId::prim_broadcast_in_dim, {Arg(t), Arg::int_list(shape), Arg::int_list(dims)})
      .tensor();
}

TensorRef make_contiguous(Builder& b, const TensorRef& t) {
  if (t->is_contiguous()) return t;
  return b.call(OpId::prim_reshape, {Arg(t), Arg::int_list(t->shape)}).tensor();
}

const TensorRef& first_tensor(const Arg::List& operands, std::string_view op) {
  for (const auto& a : operands)
    if (a.is_tensor()) return a.tensor();
  KR_USER_ERROR(Type, op, ": expected at least one Tensor argument");
}

TensorRef elementwise(Builder& b, OpId prim, const Arg::List& operands, Promotion kind,
                      std::string_view op) {
  const TensorRef& t0 = first_tensor(operands, op);
  std::vector<Shape> shapes;
  for (const auto& a : operands) {
    if (a.is_tensor()) {
      shapes.push_back(a.tensor()->shape);
      KR_CHECK(a.tensor()->device == t0->device || a.tensor()->ndim() == 0, Runtime, op,
               ": Expected all tensors to be on the same device, but found at least two devices, ",
               t0->device.str(), " and ", a.tensor()->device.str(), "!");
    }
  }
  Shape shape = broadcast_shapes(shapes, op);
  auto [compute, result] = promote(operands, kind, b.options().default_float);
  Arg::List args;
  for (const auto& a : operands) {
    if (a.is_tensor()) {
      TensorRef t = a.tensor();
      // A 0-d tensor on another device (a CPU scalar next to CUDA tensors) moves along.
      t = expand_to(b, to_dtype(b, Arg(t), compute).tensor(), shape);
      args.emplace_back(t);
    } else {
      args.push_back(a);
    }
  }
  TensorRef out = b.call(prim, std::move(args)).tensor();
  if (kind == Promotion::AlwaysBool) return out;
  return to_dtype(b, Arg(out), result).tensor();
}

std::vector<int64_t> reduction_dims(const Arg& dims, int64_t ndim, std::string_view op) {
  std::vector<int64_t> out;
  if (dims.is_none() || (dims.is_list() && dims.list().empty())) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (auto d : dims.int_list()) {
    int64_t w = wrap_dim(d, ndim, op);
    KR_CHECK(std::find(out.begin(), out.end(), w) == out.end(), Runtime, op, ": dim ", w,
             " appears multiple times in the list of dims");
    out.push_back(w);
  }
  if (ndim == 0) out.clear();
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace keraunos

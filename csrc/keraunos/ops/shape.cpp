// Shape, view and indexing ops (see shape.def). Views compute eager's exact geometry (ATen's
// computeStride, inferExpandGeometry, slicing and select rules); copies decompose into prims.
//
// Errors that eager raises as IndexError are raised here as ValueError (the C++ error channel
// has no IndexError kind); keraunos/torch_map/shape.py re-raises them as IndexError by message.
#include "keraunos/ir/error.h"
#include "keraunos/ops/builder.h"
#include "keraunos/ops/meta.h"
#include "keraunos/ops/mutation.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>

namespace keraunos::ops {

namespace {

// ---------------------------------------------------------------------------------------------
// Geometry helpers (ATen's rules).

// at::infer_size: resolves one -1.
Shape infer_size(const Shape& shape, int64_t numel) {
  int64_t newsize = 1;
  std::optional<size_t> infer;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      KR_CHECK(!infer, Runtime, "only one dimension can be inferred");
      infer = d;
    } else {
      KR_CHECK(shape[d] >= 0, Runtime, "invalid shape dimension ", shape[d], " at index ", d,
               " of shape ", shape_str(shape));
      newsize *= shape[d];
    }
  }
  Shape res = shape;
  if (numel == newsize || (infer && newsize > 0 && numel % newsize == 0)) {
    if (infer) {
      KR_CHECK(newsize != 0, Runtime, "cannot reshape tensor of 0 elements into shape ",
               shape_str(shape),
               " because the unspecified dimension size -1 can be any value and is ambiguous");
      res[*infer] = numel / newsize;
    }
    return res;
  }
  KR_USER_ERROR(Runtime, "shape '", shape_str(shape), "' is invalid for input of size ", numel);
}

// at::detail::computeStride: the strides of a view of (oldshape, oldstride) with newshape, or
// nullopt when no view exists.
std::optional<Shape> compute_stride(const Shape& oldshape, const Shape& oldstride,
                                    const Shape& newshape) {
  if (oldshape.empty()) return Shape(newshape.size(), 1);
  const int64_t n = numel(oldshape);
  if (n == 0 && oldshape == newshape) return oldstride;
  Shape newstride(newshape.size());
  if (n == 0) {
    for (int64_t d = static_cast<int64_t>(newshape.size()) - 1; d >= 0; --d) {
      if (d == static_cast<int64_t>(newshape.size()) - 1)
        newstride[d] = 1;
      else
        newstride[d] = std::max<int64_t>(newshape[d + 1], 1) * newstride[d + 1];
    }
    return newstride;
  }
  int64_t view_d = static_cast<int64_t>(newshape.size()) - 1;
  int64_t chunk_base_stride = oldstride.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(oldshape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= oldshape[tensor_d];
    if (tensor_d == 0 || (oldshape[tensor_d - 1] != 1 &&
                          oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || newshape[view_d] == 1)) {
        newstride[view_d] = view_numel * chunk_base_stride;
        view_numel *= newshape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = oldstride[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return newstride;
}

std::string legacy_type(const TensorRef& t) {
  const char* n = "Float";
  switch (t->dtype) {
  case DType::Bool: n = "Bool"; break;
  case DType::UInt8: n = "Byte"; break;
  case DType::Int8: n = "Char"; break;
  case DType::Int16: n = "Short"; break;
  case DType::Int32: n = "Int"; break;
  case DType::Int64: n = "Long"; break;
  case DType::Float16: n = "Half"; break;
  case DType::BFloat16: n = "BFloat16"; break;
  case DType::Float32: n = "Float"; break;
  case DType::Float64: n = "Double"; break;
  }
  return std::string(t->device.type == DeviceType::CUDA ? "torch.cuda." : "torch.") + n + "Tensor";
}


// C++ type names eager prints in some messages ("float", "long").
std::string ctype_name(DType d) {
  switch (d) {
  case DType::Bool: return "bool";
  case DType::UInt8: return "unsigned char";
  case DType::Int8: return "signed char";
  case DType::Int16: return "short";
  case DType::Int32: return "int";
  case DType::Int64: return "long";
  case DType::Float16: return "c10::Half";
  case DType::BFloat16: return "c10::BFloat16";
  case DType::Float32: return "float";
  case DType::Float64: return "double";
  }
  return "?";
}

// at::inferExpandGeometry.
std::pair<Shape, Shape> expand_geometry(const TensorRef& t, const Shape& sizes) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  const int64_t tdim = t->ndim();
  KR_CHECK(ndim >= tdim, Runtime, "expand(", legacy_type(t), "{", shape_str(t->shape),
           "}, size=", shape_str(sizes), "): the number of sizes provided (", ndim,
           ") must be greater or equal to the number of dimensions in the tensor (", tdim, ")");
  Shape es(ndim), est(ndim);
  for (int64_t i = ndim - 1; i >= 0; --i) {
    int64_t offset = ndim - 1 - i;
    int64_t dim = tdim - 1 - offset;
    int64_t size = dim >= 0 ? t->shape[dim] : 1;
    int64_t stride = dim >= 0 ? t->strides[dim] : i + 1 < ndim ? es[i + 1] * est[i + 1] : 1;
    int64_t target = sizes[i];
    if (target == -1) {
      KR_CHECK(dim >= 0, Runtime, "The expanded size of the tensor (", target,
               ") isn't allowed in a leading, non-existing dimension ", i);
      target = size;
    }
    if (size != target) {
      KR_CHECK(size == 1, Runtime, "The expanded size of the tensor (", target,
               ") must match the existing size (", size, ") at non-singleton dimension ", i,
               ".  Target sizes: ", shape_str(sizes), ".  Tensor sizes: ", shape_str(t->shape));
      size = target;
      stride = 0;
    }
    es[i] = size;
    est[i] = stride;
  }
  return {es, est};
}

TensorRef view(Builder& b, const TensorRef& t, Shape shape, Shape strides, int64_t offset) {
  return b.new_view(t, std::move(shape), std::move(strides), offset);
}

// Eager's reshape: a view when computeStride succeeds, else a contiguous copy.
TensorRef reshape_to(Builder& b, const TensorRef& t, const Shape& shape) {
  if (auto st = compute_stride(t->shape, t->strides, shape))
    return view(b, t, shape, *st, t->storage_offset);
  return b.call(OpId::prim_reshape, {Arg(t), Arg::int_list(shape)}).tensor();
}

// Functional reshape (prims) used inside copy decompositions.
TensorRef p_reshape(Builder& b, const TensorRef& t, const Shape& shape) {
  if (t->shape == shape) return t;
  return b.call(OpId::prim_reshape, {Arg(t), Arg::int_list(shape)}).tensor();
}

TensorRef p_permute(Builder& b, const TensorRef& t, const Shape& perm) {
  bool ident = true;
  for (size_t i = 0; i < perm.size(); ++i) ident = ident && perm[i] == static_cast<int64_t>(i);
  if (ident) return t;
  return b.call(OpId::prim_permute, {Arg(t), Arg::int_list(perm)}).tensor();
}

TensorRef p2(Builder& b, OpId prim, const Arg& x, const Arg& y) {
  return b.call(prim, {x, y}).tensor();
}

Shape permute_shape(const Shape& s, const Shape& perm) {
  Shape out;
  for (auto d : perm) out.push_back(s[d]);
  return out;
}

std::vector<TensorRef> split_views(Builder& b, const TensorRef& t, int64_t dim,
                                   const Shape& sizes) {
  std::vector<TensorRef> out;
  int64_t start = 0;
  for (auto s : sizes) {
    Shape shape = t->shape;
    shape[dim] = s;
    out.push_back(view(b, t, shape, t->strides, t->storage_offset + start * t->strides[dim]));
    start += s;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Indexing.

struct Item {
  enum Kind { Int, Sl, NoneK, Ell, Ten } k = Int;
  int64_t i = 0;
  Slice s;
  TensorRef t;
};

bool is_mask(const TensorRef& t) { return t->dtype == DType::Bool || t->dtype == DType::UInt8; }

std::vector<Item> parse_index(const Arg& idx) {
  Arg::List items = idx.is_list() ? idx.list() : Arg::List{idx};
  std::vector<Item> out;
  for (const auto& a : items) {
    Item it;
    if (a.is_bool()) {
      KR_USER_ERROR(NotImplemented,
                    "indexing with a Python bool (x[True] / x[False]) is not supported yet");
    } else if (a.is_int()) {
      it.k = Item::Int;
      it.i = a.as_int();
    } else if (a.is_slice()) {
      it.k = Item::Sl;
      it.s = a.as_slice();
    } else if (a.is_none()) {
      it.k = Item::NoneK;
    } else if (a.is_ellipsis()) {
      it.k = Item::Ell;
    } else if (a.is_tensor()) {
      it.k = Item::Ten;
      it.t = a.tensor();
      DType d = it.t->dtype;
      KR_CHECK(d == DType::Int64 || d == DType::Int32 || d == DType::Bool || d == DType::UInt8,
               Value, "tensors used as indices must be long, int, byte or bool tensors");
    } else {
      const char* what = a.is_float() ? "float" : a.is_str() ? "str" : a.is_list() ? "list" : "object";
      KR_USER_ERROR(Value, "only integers, slices (`:`), ellipsis (`...`), None and long or byte "
                           "Variables are valid indices (got ",
                    what, ")");
    }
    out.push_back(it);
  }
  return out;
}

// The result of the basic part of an index (ATen's applySlicing): the view geometry, the
// functional recipe (a slice of the input, then a reshape) and the tensor indices left over,
// at their dims in the view.
struct Basic {
  Shape shape, strides;
  int64_t offset = 0;
  Shape start, end, step;
  bool sliced = false;
  std::vector<std::pair<int64_t, TensorRef>> adv;   // integer index tensors
  std::vector<std::pair<int64_t, TensorRef>> masks; // bool / uint8 masks
  Arg::List basic_index;                           // the index with tensors as full slices
};

Basic apply_basic(const TensorRef& x, const std::vector<Item>& items) {
  const int64_t nd = x->ndim();
  int64_t specified = 0;
  for (const auto& it : items) {
    if (it.k == Item::Int || it.k == Item::Sl) ++specified;
    if (it.k == Item::Ten) specified += is_mask(it.t) ? it.t->ndim() : 1;
    if (it.k == Item::Int)
      KR_CHECK(nd > 0, Value,
               "invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
               "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number");
  }
  KR_CHECK(specified <= nd, Value, "too many indices for tensor of dimension ", nd);
  Basic r;
  r.offset = x->storage_offset;
  r.start.assign(nd, 0);
  r.end = x->shape;
  r.step.assign(nd, 1);
  int64_t in = 0;
  auto keep = [&](int64_t d) {
    r.shape.push_back(x->shape[d]);
    r.strides.push_back(x->strides[d]);
  };
  for (const auto& it : items) {
    switch (it.k) {
    case Item::Int: {
      int64_t size = x->shape[in];
      KR_CHECK(it.i >= -size && it.i < size, Value, "index ", it.i,
               " is out of bounds for dimension ", in, " with size ", size);
      int64_t w = it.i < 0 ? it.i + size : it.i;
      r.offset += w * x->strides[in];
      r.start[in] = w;
      r.end[in] = w + 1;
      r.sliced = true;
      r.basic_index.emplace_back(it.i);
      ++in;
      break;
    }
    case Item::Sl: {
      int64_t step = it.s.step.value_or(1);
      KR_CHECK(step != 0, Value, "slice step cannot be zero");
      KR_CHECK(step > 0, Value, "step must be greater than zero");
      int64_t size = x->shape[in];
      int64_t start = it.s.start.value_or(0);
      int64_t stop = it.s.stop.value_or(std::numeric_limits<int64_t>::max());
      if (start < 0) start += size;
      if (stop < 0) stop += size;
      start = std::clamp<int64_t>(start, 0, size);
      stop = std::clamp<int64_t>(stop, start, size);
      r.offset += start * x->strides[in];
      r.shape.push_back((stop - start + step - 1) / step);
      r.strides.push_back(x->strides[in] * step);
      if (start != 0 || stop != size || step != 1) r.sliced = true;
      r.start[in] = start;
      r.end[in] = stop;
      r.step[in] = step;
      r.basic_index.emplace_back(it.s);
      ++in;
      break;
    }
    case Item::NoneK:
      r.shape.push_back(1);
      r.strides.push_back(in < nd ? x->shape[in] * x->strides[in] : 1);
      r.basic_index.emplace_back();
      break;
    case Item::Ell: {
      int64_t n = nd - specified;
      for (int64_t k = 0; k < n && in < nd; ++k) keep(in++);
      r.basic_index.emplace_back(EllipsisArg{});
      break;
    }
    case Item::Ten: {
      const auto& t = it.t;
      int64_t pos = static_cast<int64_t>(r.shape.size());
      if (is_mask(t)) {
        for (int64_t j = 0; j < t->ndim(); ++j)
          KR_CHECK(in + j < nd && t->shape[j] == x->shape[in + j], Value, "The shape of the mask ",
                   shape_str(t->shape), " at index ", j,
                   " does not match the shape of the indexed tensor ", shape_str(x->shape),
                   " at index ", in + j);
        r.masks.emplace_back(pos, t);
        for (int64_t j = 0; j < t->ndim(); ++j) {
          keep(in++);
          r.basic_index.emplace_back(Slice{});
        }
      } else {
        r.adv.emplace_back(pos, t);
        keep(in++);
        r.basic_index.emplace_back(Slice{});
      }
      break;
    }
    }
  }
  while (in < nd) keep(in++);
  return r;
}

bool is_identity(const Basic& r, const TensorRef& x) {
  return r.shape == x->shape && r.strides == x->strides && r.offset == x->storage_offset;
}

// The basic part applied functionally (prims): a slice, then a reshape dropping selected dims
// and inserting None dims.
TensorRef basic_functional(Builder& b, const TensorRef& x, const Basic& r) {
  TensorRef t = x;
  if (r.sliced)
    t = b.call(OpId::prim_slice, {Arg(t), Arg::int_list(r.start), Arg::int_list(r.end),
                                  Arg::int_list(r.step)})
            .tensor();
  return p_reshape(b, t, r.shape);
}

Shape broadcast_indices(const std::vector<std::pair<int64_t, TensorRef>>& adv) {
  std::vector<Shape> shapes;
  for (const auto& [d, t] : adv) shapes.push_back(t->shape);
  size_t nd = 0;
  for (const auto& s : shapes) nd = std::max(nd, s.size());
  Shape out(nd, 1);
  for (const auto& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[nd - s.size() + i];
      if (s[i] == o || s[i] == 1) continue;
      if (o != 1) {
        std::string all;
        for (size_t k = 0; k < shapes.size(); ++k) all += (k ? ", " : "") + shape_str(shapes[k]);
        KR_USER_ERROR(Value, "shape mismatch: indexing tensors could not be broadcast together "
                             "with shapes ",
                      all);
      }
      o = s[i];
    }
  }
  return out;
}

bool adjacent(const std::vector<std::pair<int64_t, TensorRef>>& adv) {
  for (size_t k = 1; k < adv.size(); ++k)
    if (adv[k].first != adv[k - 1].first + 1) return false;
  return true;
}

// Shape of base[indices] (advanced indexing): the broadcast index shape replaces the indexed
// dims where they are adjacent, else goes first.
Shape advanced_shape(const Shape& base, const std::vector<std::pair<int64_t, TensorRef>>& adv,
                     const Shape& bshape) {
  Shape out;
  bool adj = adjacent(adv);
  int64_t first = adv.front().first;
  if (!adj) out = bshape;
  for (int64_t d = 0; d < static_cast<int64_t>(base.size()); ++d) {
    bool indexed = std::any_of(adv.begin(), adv.end(), [&](const auto& p) { return p.first == d; });
    if (adj && d == first) out.insert(out.end(), bshape.begin(), bshape.end());
    if (!indexed) out.push_back(base[d]);
  }
  return out;
}

// base[adv indices] as prims: one index is a take; several are linearized over the indexed
// dims (moved first), taken, and moved back where eager puts them.
TensorRef advanced_gather(Builder& b, const TensorRef& base,
                          const std::vector<std::pair<int64_t, TensorRef>>& adv) {
  Shape bshape = broadcast_indices(adv);
  std::vector<TensorRef> idx;
  for (const auto& [d, t] : adv) {
    TensorRef i = to_dtype(b, Arg(t), DType::Int64).tensor();
    // Negative indices count from the end.
    TensorRef neg = p2(b, OpId::prim_lt, Arg(i), Arg(int64_t{0}));
    TensorRef plus = p2(b, OpId::prim_add, Arg(i), Arg(base->shape[d]));
    i = b.call(OpId::prim_where, {Arg(neg), Arg(plus), Arg(i)}).tensor();
    idx.push_back(i);
  }
  if (adv.size() == 1)
    return b.call(OpId::prim_take, {Arg(base), Arg(idx[0]), Arg(adv[0].first), Arg(int64_t{2})})
        .tensor();
  Shape perm, rest;
  int64_t flat = 1;
  for (const auto& [d, t] : adv) {
    perm.push_back(d);
    flat *= base->shape[d];
  }
  for (int64_t d = 0; d < base->ndim(); ++d)
    if (std::find(perm.begin(), perm.end(), d) == perm.end()) {
      perm.push_back(d);
      rest.push_back(base->shape[d]);
    }
  TensorRef p = p_permute(b, base, perm);
  Shape fshape{flat};
  fshape.insert(fshape.end(), rest.begin(), rest.end());
  p = p_reshape(b, p, fshape);
  TensorRef lin;
  int64_t mult = 1;
  for (int64_t k = static_cast<int64_t>(adv.size()) - 1; k >= 0; --k) {
    TensorRef e = expand_to(b, idx[k], bshape);
    if (mult != 1) e = p2(b, OpId::prim_mul, Arg(e), Arg(mult));
    lin = lin ? p2(b, OpId::prim_add, Arg(lin), Arg(e)) : e;
    mult *= base->shape[adv[k].first];
  }
  TensorRef out =
      b.call(OpId::prim_take, {Arg(p), Arg(lin), Arg(int64_t{0}), Arg(int64_t{2})}).tensor();
  int64_t first = adv.front().first;
  if (adjacent(adv) && first > 0) {
    int64_t nb = static_cast<int64_t>(bshape.size());
    Shape perm2;
    for (int64_t i = 0; i < first; ++i) perm2.push_back(nb + i);
    for (int64_t i = 0; i < nb; ++i) perm2.push_back(i);
    for (int64_t i = nb + first; i < out->ndim(); ++i) perm2.push_back(i);
    out = p_permute(b, out, perm2);
    // Eager's result is dense in the natural order: materialize the permuted take.
    out = b.call(OpId::prim_reshape, {Arg(out), Arg::int_list(out->shape)}).tensor();
  }
  return out;
}

// Drops leading size-1 dims of a value until it has at most `ndim` dims (eager's
// slicePrefix1sDims in setitem).
TensorRef strip_leading_ones(Builder& b, const TensorRef& v, int64_t ndim) {
  Shape s = v->shape;
  size_t k = 0;
  while (static_cast<int64_t>(s.size() - k) > ndim && s[k] == 1) ++k;
  if (k == 0) return v;
  return p_reshape(b, v, Shape(s.begin() + k, s.end()));
}

// A value (tensor or number) as a tensor of `dtype` and `shape` for a write.
TensorRef value_for(Builder& b, const Arg& value, DType dtype, Device device, const Shape& shape,
                    bool setitem_msg) {
  if (!value.is_tensor())
    return b.call(OpId::prim_full, {Arg::int_list(shape), value, Arg(dtype), Arg(device)}).tensor();
  TensorRef v = strip_leading_ones(b, value.tensor(), static_cast<int64_t>(shape.size()));
  if (setitem_msg) {
    bool ok = v->ndim() <= static_cast<int64_t>(shape.size());
    for (int64_t i = 0; ok && i < v->ndim(); ++i) {
      int64_t s = v->shape[v->ndim() - 1 - i], t = shape[shape.size() - 1 - i];
      ok = s == t || s == 1;
    }
    KR_CHECK(ok, Runtime, "shape mismatch: value tensor of shape ", shape_str(v->shape),
             " cannot be broadcast to indexing result of shape ", shape_str(shape));
  } else {
    expand_geometry(v, shape); // eager's error when the value does not broadcast
  }
  v = to_dtype(b, Arg(v), dtype).tensor();
  return expand_to(b, v, shape);
}

std::vector<int64_t> wrap_dims(const Shape& dims, int64_t ndim, std::string_view op) {
  std::vector<int64_t> out;
  for (auto d : dims) out.push_back(wrap_dim(d, ndim, op));
  return out;
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Views.

Arg impl_view(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  Shape shape = infer_size(a[1].int_list(), x->numel());
  auto st = compute_stride(x->shape, x->strides, shape);
  KR_CHECK(st, Runtime,
           "view size is not compatible with input tensor's size and stride (at least one "
           "dimension spans across two contiguous subspaces). Use .reshape(...) instead.");
  return Arg(view(b, x, shape, *st, x->storage_offset));
}

Arg impl_reshape(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  return Arg(reshape_to(b, x, infer_size(a[1].int_list(), x->numel())));
}

Arg impl_flatten(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  if (x->ndim() == 0) return Arg(reshape_to(b, x, {1}));
  int64_t s = wrap_dim(a[1].as_int(), x->ndim(), "flatten");
  int64_t e = wrap_dim(a[2].as_int(), x->ndim(), "flatten");
  KR_CHECK(s <= e, Runtime, "flatten() has invalid args: start_dim cannot come after end_dim");
  if (s == e) return a[0];
  Shape shape(x->shape.begin(), x->shape.begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i) n *= x->shape[i];
  shape.push_back(n);
  shape.insert(shape.end(), x->shape.begin() + e + 1, x->shape.end());
  return Arg(reshape_to(b, x, shape));
}

Arg impl_unflatten(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  int64_t dim = wrap_dim(a[1].as_int(), x->ndim(), "unflatten");
  Shape sizes = a[2].int_list();
  KR_CHECK(!sizes.empty(), Runtime, "unflatten: sizes must be non-empty");
  int64_t size = x->ndim() ? x->shape[dim] : 1;
  if (std::find(sizes.begin(), sizes.end(), -1) == sizes.end())
    KR_CHECK(numel(sizes) == size, Runtime, "unflatten: Provided sizes ", shape_str(sizes),
             " don't multiply up to the size of dim ", dim, " (", size, ") in the input tensor");
  Shape inferred = infer_size(sizes, size);
  Shape shape(x->shape.begin(), x->shape.begin() + dim);
  shape.insert(shape.end(), inferred.begin(), inferred.end());
  if (x->ndim()) shape.insert(shape.end(), x->shape.begin() + dim + 1, x->shape.end());
  return Arg(reshape_to(b, x, shape));
}

Arg impl_permute(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  Shape dims = a[1].int_list();
  KR_CHECK(static_cast<int64_t>(dims.size()) == x->ndim(), Runtime,
           "permute(sparse_coo): number of dimensions in the tensor input does not match the "
           "length of the desired ordering of dimensions i.e. input.dim() = ",
           x->ndim(), " is not equal to len(dims) = ", dims.size());
  auto w = wrap_dims(dims, x->ndim(), "permute");
  std::vector<bool> seen(x->ndim(), false);
  for (auto d : w) {
    KR_CHECK(!seen[d], Runtime, "permute(): duplicate dims are not allowed.");
    seen[d] = true;
  }
  return Arg(view(b, x, permute_shape(x->shape, w), permute_shape(x->strides, w),
                  x->storage_offset));
}

static TensorRef transpose_view(Builder& b, const TensorRef& x, int64_t d0, int64_t d1) {
  Shape shape = x->shape, strides = x->strides;
  if (x->ndim() > 0) {
    std::swap(shape[d0], shape[d1]);
    std::swap(strides[d0], strides[d1]);
  }
  return view(b, x, shape, strides, x->storage_offset);
}

Arg impl_transpose(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  int64_t d0 = wrap_dim(a[1].as_int(), x->ndim(), "transpose");
  int64_t d1 = wrap_dim(a[2].as_int(), x->ndim(), "transpose");
  return Arg(transpose_view(b, x, d0, d1));
}

Arg impl_detach(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  auto v = std::const_pointer_cast<TensorProxy>(
      b.new_view(x, x->shape, x->strides, x->storage_offset));
  v->requires_grad = false;
  return Arg(TensorRef(std::move(v)));
}

Arg impl_t(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  KR_CHECK(x->ndim() <= 2, Runtime, "t() expects a tensor with <= 2 dimensions, but self is ",
           x->ndim(), "D");
  return Arg(transpose_view(b, x, 0, x->ndim() < 2 ? 0 : 1));
}

Arg impl_squeeze(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  std::vector<bool> drop(x->ndim(), false);
  if (a[1].is_none()) {
    for (int64_t i = 0; i < x->ndim(); ++i) drop[i] = x->shape[i] == 1;
  } else {
    std::vector<bool> seen(std::max<int64_t>(x->ndim(), 1), false);
    for (auto d : a[1].int_list()) {
      int64_t w = wrap_dim(d, x->ndim(), "squeeze");
      KR_CHECK(!seen[w], Runtime, "dim ", w, " appears multiple times in the list of dims");
      seen[w] = true;
      if (x->ndim() > 0 && x->shape[w] == 1) drop[w] = true;
    }
  }
  Shape shape, strides;
  for (int64_t i = 0; i < x->ndim(); ++i)
    if (!drop[i]) {
      shape.push_back(x->shape[i]);
      strides.push_back(x->strides[i]);
    }
  return Arg(view(b, x, shape, strides, x->storage_offset));
}

static TensorRef unsqueeze_view(Builder& b, const TensorRef& x, int64_t d) {
  Shape shape = x->shape, strides = x->strides;
  int64_t st = d >= x->ndim() ? 1 : x->shape[d] * x->strides[d];
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return view(b, x, shape, strides, x->storage_offset);
}

Arg impl_unsqueeze(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  return Arg(unsqueeze_view(b, x, wrap_dim(a[1].as_int(), x->ndim() + 1, "unsqueeze")));
}

Arg impl_expand(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  auto [shape, strides] = expand_geometry(x, a[1].int_list());
  return Arg(view(b, x, shape, strides, x->storage_offset));
}

Arg impl_narrow(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  KR_CHECK(x->ndim() > 0, Runtime, "narrow() cannot be applied to a 0-dim tensor.");
  int64_t length = a[3].as_int();
  KR_CHECK(length >= 0, Runtime, "narrow(): length must be non-negative.");
  int64_t d = wrap_dim(a[1].as_int(), x->ndim(), "narrow");
  int64_t size = x->shape[d], start = a[2].as_int();
  KR_CHECK(start >= -size && start <= size, Value, "start out of range (expected to be in range of [",
           -size, ", ", size, "], but got ", start, ")");
  if (start < 0) start += size;
  KR_CHECK(start <= size - length, Runtime, "start (", start, ") + length (", length,
           ") exceeds dimension size (", size, ").");
  Shape shape = x->shape;
  shape[d] = length;
  return Arg(view(b, x, shape, x->strides, x->storage_offset + start * x->strides[d]));
}

static TensorRef select_view(Builder& b, const TensorRef& x, int64_t d, int64_t index) {
  int64_t size = x->shape[d];
  KR_CHECK(index >= -size && index < size, Value, "select(): index ", index,
           " out of range for tensor of size ", shape_str(x->shape), " at dimension ", d);
  if (index < 0) index += size;
  Shape shape = x->shape, strides = x->strides;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return view(b, x, shape, strides, x->storage_offset + index * x->strides[d]);
}

Arg impl_select(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  KR_CHECK(x->ndim() > 0, Value, "select() cannot be applied to a 0-dim tensor.");
  return Arg(select_view(b, x, wrap_dim(a[1].as_int(), x->ndim(), "select"), a[2].as_int()));
}

Arg impl_diagonal(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  int64_t off = a[1].as_int();
  int64_t d1 = wrap_dim(a[2].as_int(), x->ndim(), "diagonal");
  int64_t d2 = wrap_dim(a[3].as_int(), x->ndim(), "diagonal");
  KR_CHECK(d1 != d2, Runtime, "diagonal dimensions cannot be identical ", a[2].as_int(), ", ",
           a[3].as_int());
  int64_t len = off >= 0 ? std::max<int64_t>(std::min(x->shape[d1], x->shape[d2] - off), 0)
                         : std::max<int64_t>(std::min(x->shape[d1] + off, x->shape[d2]), 0);
  int64_t offset = x->storage_offset;
  if (len == 0) {
  } else if (off >= 0) {
    offset += off * x->strides[d2];
  } else {
    offset -= off * x->strides[d1];
  }
  Shape shape, strides;
  for (int64_t i = 0; i < x->ndim(); ++i)
    if (i != d1 && i != d2) {
      shape.push_back(x->shape[i]);
      strides.push_back(x->strides[i]);
    }
  shape.push_back(len);
  strides.push_back(x->strides[d1] + x->strides[d2]);
  return Arg(view(b, x, shape, strides, offset));
}

Arg impl_split(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  KR_CHECK(x->ndim() > 0, Runtime, "split expects at least a 1-dimensional tensor");
  int64_t d = wrap_dim(a[2].as_int(), x->ndim(), "split");
  int64_t size = x->shape[d];
  Shape sizes;
  if (a[1].is_int()) {
    int64_t ss = a[1].as_int();
    KR_CHECK(ss >= 0, Runtime, "split expects split_size be non-negative, but got split_size=", ss);
    KR_CHECK(ss != 0 || size == 0, Runtime,
             "split_size can only be 0 if dimension size is 0, but got dimension size of ", size);
    int64_t n = ss == 0 ? 1 : std::max<int64_t>((size + ss - 1) / ss, 1);
    int64_t last = ss - (ss * n - size);
    for (int64_t i = 0; i < n; ++i) sizes.push_back(i + 1 == n ? last : ss);
  } else {
    KR_CHECK(a[1].is_list(), Type, "split(): argument 'split_size' must be int or a list of ints");
    sizes = a[1].int_list();
    int64_t sum = 0;
    for (auto s : sizes) {
      KR_CHECK(s >= 0, Runtime, "split_with_sizes expects split_sizes have only non-negative ",
               "entries, but got split_sizes=", shape_str(sizes));
      sum += s;
    }
    KR_CHECK(sum == size, Runtime, "split_with_sizes expects split_sizes to sum exactly to ", size,
             " (input tensor's size at dimension ", d, "), but got split_sizes=",
             shape_str(sizes));
  }
  return Arg::tensor_list(split_views(b, x, d, sizes));
}

Arg impl_chunk(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  KR_CHECK(x->ndim() > 0, Runtime, "chunk expects at least a 1-dimensional tensor");
  int64_t chunks = a[1].as_int();
  KR_CHECK(chunks > 0, Runtime, "chunk expects `chunks` to be greater than 0, got: ", chunks);
  int64_t d = wrap_dim(a[2].as_int(), x->ndim(), "chunk");
  int64_t size = x->shape[d];
  int64_t ss = (size + chunks - 1) / chunks;
  if (ss == 0 && size == 0) {
    Shape sizes(chunks, 0);
    return Arg::tensor_list(split_views(b, x, d, sizes));
  }
  return impl_split(b, {a[0], Arg(ss), Arg(d)});
}

Arg impl_unbind(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  KR_CHECK(x->ndim() > 0, Value, "Dimension specified as 0 but tensor has no dimensions");
  int64_t d = wrap_dim(a[1].as_int(), x->ndim(), "unbind");
  std::vector<TensorRef> out;
  for (int64_t i = 0; i < x->shape[d]; ++i) out.push_back(select_view(b, x, d, i));
  return Arg::tensor_list(out);
}

Arg impl_movedim(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  Shape src = a[1].int_list(), dst = a[2].int_list();
  KR_CHECK(src.size() == dst.size(), Runtime,
           "movedim: Invalid source or destination dims: source (", shape_str(src),
           " dims) should contain the same number of dims as destination (", shape_str(dst),
           " dims)");
  int64_t n = x->ndim();
  auto ws = wrap_dims(src, n, "movedim"), wd = wrap_dims(dst, n, "movedim");
  auto check_unique = [&](const std::vector<int64_t>& v, const Shape& orig, const char* what) {
    for (size_t i = 0; i < v.size(); ++i)
      for (size_t j = i + 1; j < v.size(); ++j)
        KR_CHECK(v[i] != v[j], Runtime, "movedim: repeated dim in `", what, "` (",
                 shape_str(orig), ")");
  };
  check_unique(ws, src, "source");
  check_unique(wd, dst, "destination");
  if (n == 0) return Arg(view(b, x, x->shape, x->strides, x->storage_offset));
  Shape order(n, -1);
  std::vector<bool> used_src(n, false);
  for (size_t i = 0; i < ws.size(); ++i) {
    order[wd[i]] = ws[i];
    used_src[ws[i]] = true;
  }
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (order[i] != -1) continue;
    while (used_src[next]) ++next;
    order[i] = next++;
  }
  return Arg(view(b, x, permute_shape(x->shape, order), permute_shape(x->strides, order),
                  x->storage_offset));
}

Arg impl_contiguous(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  if (x->is_contiguous()) return a[0];
  return b.call(OpId::prim_reshape, {Arg(x), Arg::int_list(x->shape)});
}

// ---------------------------------------------------------------------------------------------
// Indexing.

Arg impl_getitem(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  Basic r = apply_basic(x, parse_index(a[1]));
  KR_CHECK(r.masks.empty(), NotImplemented,
           "boolean mask indexing x[mask] has a data-dependent output shape (the number of True "
           "elements of the mask), which keraunos cannot trace; use torch.where(mask, x, y), "
           "x.masked_fill(mask, v) or x[mask] = v instead");
  if (r.adv.empty()) return Arg(view(b, x, r.shape, r.strides, r.offset));
  TensorRef base = basic_functional(b, x, r);
  return Arg(advanced_gather(b, base, r.adv));
}

Arg impl_setitem_(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  Basic r = apply_basic(x, parse_index(a[1]));
  const Arg& value = a[2];
  TensorRef v_target = is_identity(r, x) ? x
                                         : b.call(OpId::getitem, {Arg(x), Arg(r.basic_index)}).tensor();
  if (!r.masks.empty()) {
    KR_CHECK(r.masks.size() == 1 && r.adv.empty(), NotImplemented,
             "x[...] = v with a boolean mask combined with other tensor indices is not supported "
             "yet");
    auto [p, mask] = r.masks.front();
    const int64_t k = mask->ndim(), nd = v_target->ndim();
    TensorRef m = to_dtype(b, Arg(mask), DType::Bool).tensor();
    Shape mdims;
    for (int64_t j = 0; j < k; ++j) mdims.push_back(p + j);
    m = b.call(OpId::prim_broadcast_in_dim,
               {Arg(m), Arg::int_list(v_target->shape), Arg::int_list(mdims)})
            .tensor();
    Arg val = value;
    if (value.is_tensor()) {
      // The value broadcasts against x[mask]'s shape pre + [nnz] + rest; nnz is unknown.
      const int64_t R = nd - p - k;
      TensorRef v = strip_leading_ones(b, value.tensor(), nd - k + 1);
      Shape vs = v->shape, dims, kept;
      int64_t vn = static_cast<int64_t>(vs.size());
      if (vn <= R) {
        for (int64_t i = 0; i < vn; ++i) dims.push_back(nd - vn + i);
        kept = vs;
      } else {
        int64_t j = vn - R - 1;
        KR_CHECK(vs[j] == 1 && j <= p, NotImplemented,
                 "x[mask] = v with a value of shape ", shape_str(value.tensor()->shape),
                 " depends on the number of True elements of the mask (data-dependent); "
                 "keraunos supports values that broadcast to the unmasked dims");
        for (int64_t i = 0; i < vn; ++i) {
          if (i == j) continue;
          kept.push_back(vs[i]);
          dims.push_back(i < j ? p - j + i : p + k + (i - j - 1));
        }
        v = p_reshape(b, v, kept);
      }
      for (size_t i = 0; i < kept.size(); ++i)
        KR_CHECK(kept[i] == 1 || kept[i] == v_target->shape[dims[i]], Runtime,
                 "shape mismatch: value tensor of shape ", shape_str(value.tensor()->shape),
                 " cannot be broadcast to indexing result of shape ", shape_str(v_target->shape));
      v = to_dtype(b, Arg(v), x->dtype).tensor();
      val = b.call(OpId::prim_broadcast_in_dim,
                   {Arg(v), Arg::int_list(v_target->shape), Arg::int_list(dims)});
    }
    TensorRef res = b.call(OpId::prim_where, {Arg(m), val, Arg(v_target)}).tensor();
    b.write_into(v_target, res);
    return a[0];
  }
  if (!r.adv.empty()) {
    // index_put semantics. prims.index_put takes leading indices only: the indexed dims move
    // first, the values follow (eager puts the index dims first unless they are adjacent).
    Shape bshape = broadcast_indices(r.adv);
    Shape rshape = advanced_shape(v_target->shape, r.adv, bshape);
    TensorRef vals = value_for(b, value, x->dtype, x->device, rshape, true);
    Shape perm;
    Arg::List indices;
    for (const auto& [d, t] : r.adv) {
      perm.push_back(d);
      indices.push_back(to_dtype(b, Arg(t), DType::Int64));
    }
    for (int64_t d = 0; d < v_target->ndim(); ++d)
      if (std::find(perm.begin(), perm.end(), d) == perm.end()) perm.push_back(d);
    int64_t first = r.adv.front().first, nb = static_cast<int64_t>(bshape.size());
    if (adjacent(r.adv) && first > 0) {
      Shape pv;
      for (int64_t i = 0; i < nb; ++i) pv.push_back(first + i);
      for (int64_t i = 0; i < first; ++i) pv.push_back(i);
      for (int64_t i = first + nb; i < vals->ndim(); ++i) pv.push_back(i);
      vals = p_permute(b, vals, pv);
    }
    TensorRef p = p_permute(b, v_target, perm);
    TensorRef res = b.call(OpId::prim_index_put,
                           {Arg(p), Arg(std::move(indices)), Arg(vals), Arg(false)})
                        .tensor();
    Shape inv(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
    b.write_into(v_target, p_permute(b, res, inv));
    return a[0];
  }
  check_no_internal_overlap(v_target, "copy_");
  if (value.is_tensor()) {
    // setitem expands the value to the target's shape before copying (stride 0 where it
    // broadcasts), and eager checks overlap on that expanded value.
    const auto& v = value.tensor();
    auto expanded = std::make_shared<TensorProxy>(*v);
    if (v->shape != v_target->shape && v->ndim() <= v_target->ndim()) {
      expanded->shape = v_target->shape;
      expanded->strides.assign(v_target->ndim(), 0);
      int64_t off = v_target->ndim() - v->ndim();
      for (int64_t i = 0; i < v->ndim(); ++i)
        if (v->shape[i] == v_target->shape[off + i]) expanded->strides[off + i] = v->strides[i];
    }
    check_no_partial_overlap(v_target, expanded, "copy_");
  }
  TensorRef vals = value_for(b, value, x->dtype, x->device, v_target->shape, false);
  b.write_into(v_target, vals);
  return a[0];
}

Arg impl_masked_fill(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const auto& mask = a[1].tensor();
  KR_CHECK(mask->dtype == DType::Bool, Runtime,
           "masked_fill_ only supports boolean masks, but got mask with dtype ",
           ctype_name(mask->dtype));
  if (a[2].is_tensor())
    KR_CHECK(a[2].tensor()->ndim() == 0, Runtime,
             "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ",
             a[2].tensor()->ndim(), " dimension(s).");
  Shape shape = broadcast_shapes({x->shape, mask->shape}, "masked_fill");
  TensorRef xb = expand_to(b, x, shape), mb = expand_to(b, mask, shape);
  // Eager fills a contiguous clone of the (expanded) input.
  if (!xb->is_contiguous()) xb = b.call(OpId::prim_reshape, {Arg(xb), Arg::int_list(shape)}).tensor();
  Arg v = a[2];
  if (v.is_tensor()) v = Arg(expand_to(b, to_dtype(b, v, x->dtype).tensor(), shape));
  return b.call(OpId::prim_where, {Arg(mb), v, Arg(xb)});
}

Arg impl_index_put(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const auto& values = a[2].tensor();
  const auto& list = a[1].list();
  KR_CHECK(static_cast<int64_t>(list.size()) <= x->ndim(), Value,
           "too many indices for tensor of dimension ", x->ndim(), " (got ", list.size(), ")");
  KR_CHECK(values->dtype == x->dtype, Runtime,
           "Index put requires the source and destination dtypes match, got ",
           dtype_scalar_name(x->dtype), " for the destination and ", dtype_scalar_name(values->dtype),
           " for the source.");
  std::vector<std::pair<int64_t, TensorRef>> adv;
  Arg::List indices;
  for (size_t d = 0; d < list.size(); ++d) {
    KR_CHECK(!list[d].is_none(), Type, "expected Tensor as element ", d,
             " in argument 1, but got NoneType");
    const auto& t = list[d].tensor();
    KR_CHECK(t->dtype == DType::Int64 || t->dtype == DType::Int32 || is_mask(t), Value,
             "tensors used as indices must be long, int, byte or bool tensors");
    KR_CHECK(!is_mask(t), NotImplemented,
             "index_put with a boolean mask index is not supported yet (use x[mask] = v or "
             "torch.where)");
    adv.emplace_back(static_cast<int64_t>(d), t);
    indices.push_back(to_dtype(b, Arg(t), DType::Int64));
  }
  if (adv.empty()) {
    // No index tensors: every element is written.
    TensorRef v = value_for(b, Arg(values), x->dtype, x->device, x->shape, true);
    if (a[3].as_bool()) return Arg(p2(b, OpId::prim_add, Arg(x), Arg(v)));
    return b.call(OpId::prim_reshape, {Arg(v), Arg::int_list(x->shape)});
  }
  Shape rshape = advanced_shape(x->shape, adv, broadcast_indices(adv));
  TensorRef v = value_for(b, Arg(values), x->dtype, x->device, rshape, true);
  return b.call(OpId::prim_index_put, {Arg(x), Arg(std::move(indices)), Arg(v), a[3]});
}

Arg impl_index_copy(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const auto& index = a[2].tensor();
  const auto& src = a[3].tensor();
  int64_t dim = wrap_dim(a[1].as_int(), x->ndim(), "index_copy_");
  KR_CHECK(index->ndim() <= 1, Value, "index_copy_(): Index should have dimension 1 or 0 (got ",
           index->ndim(), ")");
  int64_t n = index->numel();
  if (x->ndim() > 1 || src->ndim() > 1)
    KR_CHECK(src->ndim() == x->ndim(), Value,
             "index_copy_(): When source and destination are not scalars, their dimensionality "
             "must match. Source dimensionality (",
             src->ndim(), "), destination dimensionality (", x->ndim(), ")");
  int64_t src_dim = src->ndim() ? src->shape[dim] : 1;
  KR_CHECK(index->dtype == DType::Int64, Runtime,
           "index_copy_(): Expected a long tensor for index, but got ", dtype_scalar_name(index->dtype));
  KR_CHECK(src->dtype == x->dtype, Runtime,
           "index_copy_(): self and source expected to have the same dtype, but got (self) ",
           dtype_scalar_name(x->dtype), " and (source) ", dtype_scalar_name(src->dtype));
  for (int64_t d = 0; d < x->ndim() && src->ndim() == x->ndim(); ++d) {
    if (d == dim) continue;
    KR_CHECK(x->shape[d] == src->shape[d], Runtime,
             "index_copy_(): Source/destination tensor must have same slice shapes. Destination "
             "slice shape: ",
             x->shape[d], " at dimension ", d, " and source slice shape: ", src->shape[d],
             " at dimension 0.");
  }
  KR_CHECK(n == src_dim, Value, "index_copy_(): Number of indices (", n,
           ") should be equal to source.size(dim) (", src_dim, ")");
  TensorRef idx = p_reshape(b, index, {n});
  if (x->ndim() == 0) {
    // A scalar is a 1-element vector here (eager: the index can only be 0, or empty).
    TensorRef r = b.call(OpId::prim_index_copy, {Arg(p_reshape(b, x, Shape{1})), Arg(int64_t{0}),
                                                 Arg(idx), Arg(p_reshape(b, src, Shape{n}))})
                      .tensor();
    return Arg(p_reshape(b, r, Shape{}));
  }
  TensorRef s = src->ndim() == x->ndim() ? src : p_reshape(b, src, Shape{1});
  return b.call(OpId::prim_index_copy, {Arg(x), Arg(dim), Arg(idx), Arg(s)});
}

Arg impl_index_select(Builder& b, const Arg::List& a) {
  const auto& x = a[0].tensor();
  const auto& index = a[2].tensor();
  int64_t dim = wrap_dim(a[1].as_int(), x->ndim(), "index_select");
  KR_CHECK(index->ndim() <= 1, Value, "index_select(): Index is supposed to be a vector");
  KR_CHECK(index->dtype == DType::Int64 || index->dtype == DType::Int32, Runtime,
           "index_select(): Expected dtype int32 or int64 for index");
  TensorRef idx = p_reshape(b, index, {index->numel()});
  if (x->ndim() == 0) {
    // A scalar is a 1-element vector here; the result is a scalar again.
    KR_CHECK(index->numel() == 1, Runtime,
             "index_select(): Index to scalar can have only 1 value, got ", index->numel(),
             " value(s)");
    TensorRef r =
        b.call(OpId::prim_take,
               {Arg(p_reshape(b, x, Shape{1})), Arg(idx), Arg(int64_t{0}), Arg(int64_t{0})})
            .tensor();
    return Arg(p_reshape(b, r, Shape{}));
  }
  return b.call(OpId::prim_take, {Arg(x), Arg(idx), Arg(dim), Arg(int64_t{0})});
}

static Arg cat_impl(Builder& b, const std::vector<TensorRef>& ts, int64_t dim_arg) {
  for (size_t i = 0; i < ts.size(); ++i)
    KR_CHECK(ts[i]->ndim() > 0, Runtime, "zero-dimensional tensor (at position ", i,
             ") cannot be concatenated");
  auto skip = [](const TensorRef& t) { return t->ndim() == 1 && t->shape[0] == 0; };
  Arg::List all;
  for (const auto& t : ts) all.emplace_back(t);
  DType dtype = result_type(all, b.options().default_float);
  const TensorRef* ref = nullptr;
  for (const auto& t : ts)
    if (!skip(t)) {
      ref = &t;
      break;
    }
  if (!ref) {
    wrap_dim(dim_arg, 1, "torch.cat");
    Arg::List parts;
    for (const auto& t : ts) parts.push_back(to_dtype(b, Arg(t), dtype));
    return b.call(OpId::prim_cat, {Arg(std::move(parts)), Arg(int64_t{0})});
  }
  int64_t dim = wrap_dim(dim_arg, (*ref)->ndim(), "torch.cat");
  Arg::List parts;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    if (skip(t)) continue;
    KR_CHECK(t->ndim() == (*ref)->ndim(), Runtime,
             "Tensors must have same number of dimensions: got ", (*ref)->ndim(), " and ",
             t->ndim());
    for (int64_t d = 0; d < t->ndim(); ++d)
      KR_CHECK(d == dim || t->shape[d] == (*ref)->shape[d], Runtime,
               "Sizes of tensors must match except in dimension ", dim, ". Expected size ",
               (*ref)->shape[d], " but got size ", t->shape[d], " for tensor number ", i,
               " in the list.");
    parts.push_back(to_dtype(b, Arg(t), dtype));
  }
  return b.call(OpId::prim_cat, {Arg(std::move(parts)), Arg(dim)});
}

Arg impl_cat(Builder& b, const Arg::List& a) {
  auto ts = a[0].tensor_list();
  KR_CHECK(!ts.empty(), Value, "torch.cat(): expected a non-empty list of Tensors");
  return cat_impl(b, ts, a[1].as_int());
}

Arg impl_stack(Builder& b, const Arg::List& a) {
  auto ts = a[0].tensor_list();
  KR_CHECK(!ts.empty(), Runtime, "stack expects a non-empty TensorList");
  for (size_t i = 0; i < ts.size(); ++i)
    KR_CHECK(ts[i]->shape == ts[0]->shape, Runtime,
             "stack expects each tensor to be equal size, but got ", shape_str(ts[0]->shape),
             " at entry 0 and ", shape_str(ts[i]->shape), " at entry ", i);
  int64_t dim = wrap_dim(a[1].as_int(), ts[0]->ndim() + 1, "stack");
  Arg::List all;
  for (const auto& t : ts) all.emplace_back(t);
  DType dtype = result_type(all, b.options().default_float);
  Shape shape = ts[0]->shape;
  shape.insert(shape.begin() + dim, 1);
  Arg::List parts;
  for (const auto& t : ts)
    parts.emplace_back(p_reshape(b, to_dtype(b, Arg(t), dtype).tensor(), shape));
  return b.call(OpId::prim_cat, {Arg(std::move(parts)), Arg(dim)});
}

} // namespace keraunos::ops

namespace keraunos {
TensorRef advanced_index(Builder& b, const TensorRef& base,
                         const std::vector<std::pair<int64_t, TensorRef>>& indices) {
  return ops::advanced_gather(b, base, indices);
}
} // namespace keraunos

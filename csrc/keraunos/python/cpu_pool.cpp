// The CPU buffer pool (cpu_pool.h) and its Python face: `_C.cpu_matmul` (the CPU programs'
// matmul into a pooled result), `_C.empty_cpu_pool` and `_C.cpu_pool_stats`.
#include "cpu_pool.h"

#include "keraunos/support/options.h"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace keraunos::py {

namespace {

// What the pool may hold; a request past it is a plain allocation.
constexpr int64_t kCapBytes = int64_t{1} << 30;

struct Pool {
  std::unordered_map<int64_t, std::vector<nb::object>> by_bytes; // untyped storages
  int64_t held = 0, hits = 0, misses = 0;
  nb::object empty, empty_strided, matmul, use_count, is_grad_enabled, cpu;

  Pool() {
    nb::module_ torch = nb::module_::import_("torch");
    empty = torch.attr("empty");
    empty_strided = torch.attr("empty_strided");
    matmul = torch.attr("matmul");
    use_count = torch.attr("_C").attr("_storage_Use_Count");
    is_grad_enabled = torch.attr("is_grad_enabled");
    cpu = torch.attr("device")("cpu");
  }

  void clear() {
    by_bytes.clear();
    held = 0;
  }
};

// Made on first use, never destroyed: no Python call may run at static destruction.
Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

bool enabled() { return options::flag("cpu_pool"); }

int64_t as_int(nb::handle h) { return nb::cast<int64_t>(h); }

} // namespace

nb::object pooled_empty(nb::handle shape, nb::handle strides, nb::handle dtype, int64_t nbytes) {
  if (nbytes < kPoolMinBytes || !enabled()) return {};
  Pool& p = pool();
  if (auto it = p.by_bytes.find(nbytes); it != p.by_bytes.end()) {
    // Most recently handed out first (kept at the back): a temporary dies soon after it is
    // made, so that block is likely still in cache, as glibc's most recently freed chunk is.
    auto& blocks = it->second;
    for (size_t i = blocks.size(); i-- > 0;) {
      const nb::object& st = blocks[i];
      // The pool's references only; the size check covers a storage someone resized meanwhile.
      if (Py_REFCNT(st.ptr()) != 1 || as_int(p.use_count(st.attr("_cdata"))) != 1 ||
          as_int(st.attr("nbytes")()) != nbytes)
        continue;
      ++p.hits;
      std::rotate(blocks.begin() + static_cast<std::ptrdiff_t>(i),
                  blocks.begin() + static_cast<std::ptrdiff_t>(i) + 1, blocks.end());
      nb::object t = p.empty(0, "dtype"_a = dtype, "device"_a = p.cpu);
      return t.attr("set_")(blocks.back(), 0, shape, strides);
    }
  }
  ++p.misses;
  if (p.held + nbytes > kCapBytes) return {};
  nb::object t = p.empty_strided(shape, strides, "dtype"_a = dtype, "device"_a = p.cpu);
  nb::object st = t.attr("untyped_storage")();
  if (as_int(st.attr("nbytes")()) != nbytes) return t; // not the layout the caller described
  p.by_bytes[nbytes].push_back(std::move(st));
  p.held += nbytes;
  return t;
}

namespace {

// torch.matmul(a, b) of CPU tensors, its result in a pooled buffer where the shapes are plain
// (a of two or more dims times a matrix, or equal batch dims) and autograd does not record
// (matmul's out= variant has no gradient); otherwise torch.matmul itself.
nb::object cpu_matmul(nb::handle a, nb::handle b) {
  Pool& p = pool();
  if (!enabled() ||
      (nb::cast<bool>(p.is_grad_enabled()) &&
       (nb::cast<bool>(a.attr("requires_grad")) || nb::cast<bool>(b.attr("requires_grad")))))
    return p.matmul(a, b);
  nb::tuple as = nb::borrow<nb::tuple>(a.attr("shape")), bs = nb::borrow<nb::tuple>(b.attr("shape"));
  const size_t na = as.size(), nbd = bs.size();
  nb::object dtype = a.attr("dtype");
  if (na < 2 || nbd < 2 || (nbd > 2 && nbd != na) || !dtype.equal(b.attr("dtype")))
    return p.matmul(a, b);
  for (size_t d = 0; nbd > 2 && d + 2 < na; ++d)
    if (as_int(as[d]) != as_int(bs[d])) return p.matmul(a, b); // broadcast batch dims
  if (as_int(as[na - 1]) != as_int(bs[nbd - 2])) return p.matmul(a, b); // torch's error
  std::vector<int64_t> shape;
  for (size_t d = 0; d + 1 < na; ++d) shape.push_back(as_int(as[d]));
  shape.push_back(as_int(bs[nbd - 1]));
  std::vector<int64_t> strides(shape.size());
  int64_t n = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = n;
    n *= shape[d];
  }
  nb::list shape_l, strides_l;
  for (size_t d = 0; d < shape.size(); ++d) {
    shape_l.append(shape[d]);
    strides_l.append(strides[d]);
  }
  const int64_t bytes = n * as_int(dtype.attr("itemsize"));
  nb::object out = pooled_empty(nb::tuple(shape_l), nb::tuple(strides_l), dtype, bytes);
  if (!out.is_valid()) return p.matmul(a, b);
  return p.matmul(a, b, "out"_a = out);
}

} // namespace

} // namespace keraunos::py

void bind_cpu_pool(nb::module_& m) {
  using namespace keraunos::py;
  m.def("cpu_matmul", &cpu_matmul, "a"_a, "b"_a);
  m.def("empty_cpu_pool", []() { pool().clear(); });
  m.def("cpu_pool_stats", []() {
    Pool& p = pool();
    int64_t blocks = 0;
    for (const auto& [bytes, v] : p.by_bytes) blocks += static_cast<int64_t>(v.size());
    nb::dict d;
    d["held_bytes"] = p.held;
    d["blocks"] = blocks;
    d["hits"] = p.hits;
    d["misses"] = p.misses;
    return d;
  });
}

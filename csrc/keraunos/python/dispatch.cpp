// The per-call hot path: signature of the call (shapes, strides, dtypes, devices,
// requires_grad, which tensor arguments share storage, values of the other arguments) ->
// cached program. Everything here reads tensors through the Python C API only: no libtorch.
#include "dispatch.h"

#include "keraunos/ir/error.h"

#include <cstring>
#include <functional>

namespace keraunos::py {

namespace {

enum Tag : int64_t {
  kTensor = 1,
  kNone,
  kBool,
  kInt,
  kFloat,
  kStr,
  kTuple,
  kList,
  kDict,
  kObject,
};

struct Interned {
  PyObject *shape, *stride, *dtype, *storage_offset, *data_ptr, *get_device, *requires_grad,
      *itemsize;
  Interned() {
    shape = PyUnicode_InternFromString("shape");
    stride = PyUnicode_InternFromString("stride");
    dtype = PyUnicode_InternFromString("dtype");
    storage_offset = PyUnicode_InternFromString("storage_offset");
    data_ptr = PyUnicode_InternFromString("data_ptr");
    get_device = PyUnicode_InternFromString("get_device");
    requires_grad = PyUnicode_InternFromString("requires_grad");
    itemsize = PyUnicode_InternFromString("itemsize");
  }
};
const Interned& names() {
  static const Interned n;
  return n;
}

int64_t as_i64(PyObject* o) {
  int64_t v = PyLong_AsLongLong(o);
  Py_DECREF(o);
  return v;
}

void push_tuple(std::vector<int64_t>& out, PyObject* tup) {
  Py_ssize_t n = PyTuple_GET_SIZE(tup);
  out.push_back(n);
  for (Py_ssize_t i = 0; i < n; ++i) out.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(tup, i)));
  Py_DECREF(tup);
}

} // namespace

size_t CallKey::hash() const {
  size_t h = ints.size();
  for (auto v : ints) h = h * 1000003u ^ std::hash<int64_t>{}(v);
  for (const auto& s : strs) h = h * 1000003u ^ std::hash<std::string>{}(s);
  return h;
}

Dispatcher::Dispatcher(nb::object tensor_type, nb::object compile_fn)
    : tensor_type_(std::move(tensor_type)), compile_fn_(std::move(compile_fn)) {}

void Dispatcher::walk(PyObject* o, CallKey& key, std::vector<PyObject*>& tensors,
                      std::vector<nb::object>& keep) {
  auto& k = key.ints;
  PyTypeObject* tt = reinterpret_cast<PyTypeObject*>(tensor_type_.ptr());
  if (Py_TYPE(o) == tt || PyObject_TypeCheck(o, tt)) {
    const auto& n = names();
    k.push_back(kTensor);
    PyObject* dtype = PyObject_GetAttr(o, n.dtype);
    if (!dtype) throw nb::python_error();
    k.push_back(reinterpret_cast<int64_t>(dtype)); // torch.dtype objects are singletons
    Py_DECREF(dtype);
    PyObject* shape = PyObject_GetAttr(o, n.shape);
    if (!shape) throw nb::python_error();
    push_tuple(k, shape);
    PyObject* stride = PyObject_CallMethodNoArgs(o, n.stride);
    if (!stride) {
      // Sparse, nested and other layouts without strides: a named refusal, not torch's
      // "do not have strides" from inside the signature walk.
      nb::python_error torch_error; // takes (and clears) torch's error
      std::string layout = nb::cast<std::string>(nb::str(nb::handle(o).attr("layout")));
      KR_CHECK(false, NotImplemented, "keraunos: a tensor argument without strides (layout ",
               layout,
               ") is not supported; pass a strided (dense) tensor");
    }
    push_tuple(k, stride);
    k.push_back(as_i64(PyObject_CallMethodNoArgs(o, n.storage_offset)));
    k.push_back(as_i64(PyObject_CallMethodNoArgs(o, n.get_device)));
    PyObject* rg = PyObject_GetAttr(o, n.requires_grad);
    k.push_back(rg == Py_True);
    Py_XDECREF(rg);
    tensors.push_back(o);
    return;
  }
  if (o == Py_None) {
    k.push_back(kNone);
  } else if (PyBool_Check(o)) {
    k.push_back(kBool);
    k.push_back(o == Py_True);
  } else if (PyLong_Check(o)) {
    k.push_back(kInt);
    int overflow = 0;
    k.push_back(PyLong_AsLongLongAndOverflow(o, &overflow));
    if (overflow) {
      k.push_back(PyObject_Hash(o));
      keep.push_back(nb::borrow(o));
    }
  } else if (PyFloat_Check(o)) {
    k.push_back(kFloat);
    double d = PyFloat_AS_DOUBLE(o);
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    k.push_back(bits);
  } else if (PyUnicode_Check(o)) {
    k.push_back(kStr);
    key.strs.emplace_back(PyUnicode_AsUTF8(o));
  } else if (PyTuple_Check(o) || PyList_Check(o)) {
    bool tup = PyTuple_Check(o);
    Py_ssize_t n = tup ? PyTuple_GET_SIZE(o) : PyList_GET_SIZE(o);
    k.push_back(tup ? kTuple : kList);
    k.push_back(n);
    for (Py_ssize_t i = 0; i < n; ++i)
      walk(tup ? PyTuple_GET_ITEM(o, i) : PyList_GET_ITEM(o, i), key, tensors, keep);
  } else if (PyDict_Check(o)) {
    k.push_back(kDict);
    k.push_back(PyDict_Size(o));
    PyObject *dk, *dv;
    Py_ssize_t pos = 0;
    while (PyDict_Next(o, &pos, &dk, &dv)) {
      if (PyUnicode_Check(dk)) {
        key.strs.emplace_back(PyUnicode_AsUTF8(dk));
      } else {
        walk(dk, key, tensors, keep);
      }
      walk(dv, key, tensors, keep);
    }
  } else {
    // Any other object (a dtype, a module, a function) specializes by identity.
    k.push_back(kObject);
    k.push_back(reinterpret_cast<int64_t>(o));
    keep.push_back(nb::borrow(o));
  }
}

// For each tensor, the index of the first earlier tensor sharing its storage, or -1.
std::vector<int64_t> Dispatcher::alias_groups(const std::vector<PyObject*>& tensors) {
  const auto& n = names();
  std::vector<int64_t> bases(tensors.size()), groups(tensors.size(), -1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyObject* t = tensors[i];
    int64_t ptr = as_i64(PyObject_CallMethodNoArgs(t, n.data_ptr));
    int64_t off = as_i64(PyObject_CallMethodNoArgs(t, n.storage_offset));
    PyObject* dtype = PyObject_GetAttr(t, n.dtype);
    int64_t isz = as_i64(PyObject_GetAttr(dtype, n.itemsize));
    Py_DECREF(dtype);
    if (PyErr_Occurred()) throw nb::python_error();
    bases[i] = ptr - off * isz;
    if (bases[i] == 0) continue; // empty storages never alias
    for (size_t j = 0; j < i; ++j)
      if (bases[j] == bases[i]) {
        groups[i] = groups[j] >= 0 ? groups[j] : static_cast<int64_t>(j);
        break;
      }
  }
  return groups;
}

nb::object Dispatcher::call(nb::args args, nb::kwargs kwargs) {
  CallKey key;
  std::vector<PyObject*> tensors;
  std::vector<nb::object> keep;
  key.ints.reserve(32);
  walk(args.ptr(), key, tensors, keep);
  if (kwargs.size() > 0) walk(kwargs.ptr(), key, tensors, keep);
  // Grad mode: a program compiled without it may use kernels that autograd cannot see.
  static PyObject* grad_enabled = [] {
    nb::object f = nb::module_::import_("torch").attr("is_grad_enabled");
    return f.release().ptr();
  }();
  PyObject* ge = PyObject_CallNoArgs(grad_enabled);
  if (!ge) throw nb::python_error();
  key.ints.push_back(ge == Py_True);
  Py_DECREF(ge);
  std::vector<int64_t> groups;
  if (tensors.size() > 1) {
    groups = alias_groups(tensors);
    key.ints.insert(key.ints.end(), groups.begin(), groups.end());
  }
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    ++misses_;
    nb::list ts;
    for (PyObject* t : tensors) ts.append(nb::borrow(t));
    nb::list gs;
    for (size_t i = 0; i < tensors.size(); ++i) gs.append(groups.empty() ? -1 : groups[i]);
    nb::tuple r = nb::cast<nb::tuple>(compile_fn_(ts, gs, args, kwargs));
    Entry e;
    e.program = r[0];
    for (nb::handle x : r[1]) e.extra.push_back(nb::borrow(x));
    e.post = r[2];
    e.keep = std::move(keep);
    it = cache_.emplace(std::move(key), std::move(e)).first;
  } else {
    ++hits_;
  }
  const Entry& e = it->second;
  size_t n = tensors.size() + e.extra.size();
  PyObject* small[16];
  std::vector<PyObject*> big;
  PyObject** argv = small;
  if (n + 1 > 16) {
    big.resize(n + 1);
    argv = big.data();
  }
  for (size_t i = 0; i < tensors.size(); ++i) argv[i + 1] = tensors[i];
  for (size_t i = 0; i < e.extra.size(); ++i) argv[tensors.size() + i + 1] = e.extra[i].ptr();
  PyObject* res = PyObject_Vectorcall(e.program.ptr(), argv + 1,
                                      n | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  if (!res) throw nb::python_error();
  nb::object out = nb::steal(res);
  if (!e.post.is_none()) return e.post(out);
  return out;
}

void Dispatcher::clear() { cache_.clear(); }

int Dispatcher::traverse(visitproc visit, void* arg) {
  Py_VISIT(compile_fn_.ptr());
  for (auto& [k, e] : cache_) {
    Py_VISIT(e.program.ptr());
    Py_VISIT(e.post.ptr());
    for (auto& x : e.extra) Py_VISIT(x.ptr());
  }
  return 0;
}

void Dispatcher::release() {
  cache_.clear();
  compile_fn_ = nb::none();
}

} // namespace keraunos::py

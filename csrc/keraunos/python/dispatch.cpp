// The per-call hot path: signature of the call (shapes, strides, dtypes, devices,
// requires_grad, which tensor arguments share storage, values of the other arguments) ->
// cached program. Everything here reads tensors through the Python C API only: no libtorch.
#include "dispatch.h"

#include "keraunos/ir/error.h"

#include <nanobind/stl/string.h>

#include <cstring>
#include <functional>
#include <string>

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

// Takes a new reference (NULL when the call that produced it failed: its error is raised).
int64_t as_i64(PyObject* o) {
  if (!o) throw nb::python_error();
  int64_t v = PyLong_AsLongLong(o);
  Py_DECREF(o);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

PyObject* attr_of(const char* module, const char* name) {
  nb::object f = nb::module_::import_(module).attr(name);
  return f.release().ptr();
}

// The global torch state a traced program depends on, into the key: grad mode (a program
// compiled without it may use kernels that autograd cannot see), the default dtype (factories
// and Python floats take it) and the autocast regions in force (their casts are traced).
void push_global_state(CallKey& key) {
  static PyObject* grad_enabled = attr_of("torch", "is_grad_enabled");
  static PyObject* default_dtype = attr_of("torch", "get_default_dtype");
  static PyObject* any_autocast = attr_of("torch._C", "_is_any_autocast_enabled");
  PyObject* r = PyObject_CallNoArgs(grad_enabled);
  if (!r) throw nb::python_error();
  key.ints.push_back(r == Py_True);
  Py_DECREF(r);
  r = PyObject_CallNoArgs(default_dtype);
  if (!r) throw nb::python_error();
  key.ints.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(r))); // dtypes are singletons
  Py_DECREF(r);
  r = PyObject_CallNoArgs(any_autocast);
  if (!r) throw nb::python_error();
  bool autocast = r == Py_True;
  Py_DECREF(r);
  key.ints.push_back(autocast);
  if (autocast) {
    static PyObject* autocast_state = attr_of("keraunos.tracer", "_autocast_state");
    nb::object st = nb::steal(PyObject_CallNoArgs(autocast_state));
    if (!st.is_valid()) throw nb::python_error();
    key.strs.push_back(nb::cast<std::string>(nb::repr(st)));
  }
}

// Takes a new reference to a tuple of ints (a torch.Size or a stride tuple).
void push_tuple(std::vector<int64_t>& out, PyObject* tup) {
  if (!tup) throw nb::python_error();
  nb::object owner = nb::steal(tup);
  if (!PyTuple_Check(tup)) throw nb::type_error("keraunos: expected a tuple of ints");
  Py_ssize_t n = PyTuple_GET_SIZE(tup);
  out.push_back(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    int64_t v = PyLong_AsLongLong(PyTuple_GET_ITEM(tup, i));
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    out.push_back(v);
  }
}

const char* utf8(PyObject* s) {
  const char* c = PyUnicode_AsUTF8(s);
  if (!c) throw nb::python_error(); // e.g. a lone surrogate
  return c;
}

// torch._C._functorch's interpreter-stack query and wrapped-tensor test, or nullptr when this
// torch has none.
struct Functorch {
  PyObject *peek = nullptr, *is_wrapped = nullptr;
  Functorch() {
    PyObject* mod = PyImport_ImportModule("torch._C._functorch");
    if (mod) {
      peek = PyObject_GetAttrString(mod, "peek_interpreter_stack");
      is_wrapped = PyObject_GetAttrString(mod, "is_functorch_wrapped_tensor");
      Py_DECREF(mod);
    }
    if (!peek || !is_wrapped) {
      PyErr_Clear();
      Py_CLEAR(peek);
      Py_CLEAR(is_wrapped);
    }
  }
};
const Functorch& functorch() {
  static const Functorch f; // leaked on purpose: lives as long as the interpreter
  return f;
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
    push_tuple(k, PyObject_GetAttr(o, n.shape));
    PyObject* stride = PyObject_CallMethodNoArgs(o, n.stride);
    if (!stride) {
      // Sparse, nested and other layouts without strides: a named refusal, not torch's
      // "do not have strides" from inside the signature walk.
      nb::python_error torch_error; // takes (and clears) torch's error
      std::string layout = "?";
      if (PyObject* l = PyObject_GetAttrString(o, "layout")) {
        if (PyObject* ls = PyObject_Str(l)) {
          if (const char* c = PyUnicode_AsUTF8(ls)) layout = c;
          Py_DECREF(ls);
        }
        Py_DECREF(l);
      }
      PyErr_Clear();
      throw UnsupportedCall("keraunos: a tensor argument without strides (layout " + layout +
                            ") is not supported; pass a strided (dense) tensor");
    }
    push_tuple(k, stride);
    k.push_back(as_i64(PyObject_CallMethodNoArgs(o, n.storage_offset)));
    k.push_back(as_i64(PyObject_CallMethodNoArgs(o, n.get_device)));
    PyObject* rg = PyObject_GetAttr(o, n.requires_grad);
    if (!rg) throw nb::python_error();
    k.push_back(rg == Py_True);
    Py_DECREF(rg);
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
      Py_hash_t h = PyObject_Hash(o);
      if (h == -1) throw nb::python_error();
      k.push_back(h);
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
    key.strs.emplace_back(utf8(o));
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
        key.strs.emplace_back(utf8(dk));
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

// Inside a torch.func transform (torch.vmap, torch.func.grad, jvp, ...) tensors are wrappers
// whose shape is the per-example one and which have no storage of their own: keraunos can
// neither key nor run on them. Refused before anything runs. Outside a transform this is one
// call (the interpreter stack is empty).
void Dispatcher::check_not_transformed(const std::vector<PyObject*>& tensors) {
  const Functorch& ft = functorch();
  if (!ft.peek || tensors.empty()) return;
  PyObject* level = PyObject_CallNoArgs(ft.peek);
  if (!level) throw nb::python_error();
  bool active = level != Py_None;
  Py_DECREF(level);
  if (!active) return;
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyObject* w = PyObject_CallOneArg(ft.is_wrapped, tensors[i]);
    if (!w) throw nb::python_error();
    bool wrapped = w == Py_True;
    Py_DECREF(w);
    if (wrapped)
      throw UnsupportedCall(
          "keraunos: tensor argument " + std::to_string(i) +
          " is transformed by torch.func (torch.vmap, torch.func.grad, jvp, ...): keraunos "
          "compiles functions of plain tensors only; call the jitted function outside the "
          "transform (torch.compile runs such regions eagerly)");
  }
}

std::vector<int64_t> alias_groups(const std::vector<PyObject*>& tensors) {
  const auto& n = names();
  std::vector<int64_t> bases(tensors.size()), groups(tensors.size(), -1);
  for (size_t i = 0; i < tensors.size(); ++i) {
    PyObject* t = tensors[i];
    PyObject* p = PyObject_CallMethodNoArgs(t, n.data_ptr);
    if (!p) {
      // No storage (a wrapper tensor subclass, a functorch wrapper): nothing keraunos can run
      // on. Refused with the reason torch gave.
      nb::python_error err; // takes (and clears) the pending error
      std::string why = "data_ptr() failed";
      try {
        why = nb::cast<std::string>(nb::str(err.value()));
      } catch (...) {
      }
      PyTypeObject* ty = Py_TYPE(t);
      throw UnsupportedCall("keraunos: tensor argument " + std::to_string(i) + " (" +
                            ty->tp_name + ") has no storage keraunos can read: " + why);
    }
    int64_t ptr = as_i64(p);
    int64_t off = as_i64(PyObject_CallMethodNoArgs(t, n.storage_offset));
    PyObject* dtype = PyObject_GetAttr(t, n.dtype);
    if (!dtype) throw nb::python_error();
    nb::object dtype_owner = nb::steal(dtype);
    int64_t isz = as_i64(PyObject_GetAttr(dtype, n.itemsize));
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
  check_not_transformed(tensors);
  push_global_state(key);
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
  // Owned copies: the program may re-enter this dispatcher (clear(), a recursive call that
  // compiles), which may invalidate the cache entry while the program still runs.
  nb::object program = it->second.program, post = it->second.post;
  std::vector<nb::object> extra = it->second.extra;
  size_t n = tensors.size() + extra.size();
  PyObject* small[16];
  std::vector<PyObject*> big;
  PyObject** argv = small;
  if (n + 1 > 16) {
    big.resize(n + 1);
    argv = big.data();
  }
  for (size_t i = 0; i < tensors.size(); ++i) argv[i + 1] = tensors[i];
  for (size_t i = 0; i < extra.size(); ++i) argv[tensors.size() + i + 1] = extra[i].ptr();
  PyObject* res = PyObject_Vectorcall(program.ptr(), argv + 1,
                                      n | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  if (!res) throw nb::python_error();
  nb::object out = nb::steal(res);
  if (!post.is_none()) return post(out);
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

#include "convert.h"

#include "keraunos/ir/error.h"

#include <nanobind/stl/shared_ptr.h>

namespace keraunos::py {

static std::optional<int64_t> slice_part(PyObject* o) {
  if (o == Py_None) return std::nullopt;
  KR_CHECK(PyLong_Check(o), NotImplemented,
           "slice bounds must be Python ints (tensor-valued slice bounds are data-dependent)");
  return PyLong_AsLongLong(o);
}

Arg arg_from_py(nb::handle h) {
  PyObject* o = h.ptr();
  if (o == Py_None) return Arg();
  if (PyBool_Check(o)) return Arg(o == Py_True);
  if (PyLong_Check(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    KR_CHECK(!overflow, Value, "integer argument out of the int64 range");
    return Arg(static_cast<int64_t>(v));
  }
  if (PyFloat_Check(o)) return Arg(PyFloat_AS_DOUBLE(o));
  if (PyUnicode_Check(o)) return Arg(std::string(nb::borrow<nb::str>(h).c_str()));
  if (PyTuple_Check(o) || PyList_Check(o)) {
    Arg::List l;
    for (nb::handle e : h) l.push_back(arg_from_py(e));
    return Arg(std::move(l));
  }
  if (PySlice_Check(o)) {
    auto* s = reinterpret_cast<PySliceObject*>(o);
    return Arg(Slice{slice_part(s->start), slice_part(s->stop), slice_part(s->step)});
  }
  if (o == Py_Ellipsis) return Arg(EllipsisArg{});
  if (nb::isinstance<DType>(h)) return Arg(nb::cast<DType>(h));
  if (nb::isinstance<Device>(h)) return Arg(nb::cast<Device>(h));
  if (nb::isinstance<TensorProxy>(h)) return Arg(TensorRef(nb::cast<std::shared_ptr<TensorProxy>>(h)));
  KR_USER_ERROR(Type, "unsupported argument of type '", Py_TYPE(o)->tp_name, "'");
}

nb::object arg_to_py(const Arg& a) {
  struct V {
    nb::object operator()(NoneArg) const { return nb::none(); }
    nb::object operator()(bool b) const { return nb::bool_(b); }
    nb::object operator()(int64_t i) const { return nb::int_(i); }
    nb::object operator()(double d) const { return nb::float_(d); }
    nb::object operator()(const std::string& s) const { return nb::str(s.c_str()); }
    nb::object operator()(DType d) const { return nb::cast(d); }
    nb::object operator()(Device d) const { return nb::cast(d); }
    nb::object operator()(const TensorRef& t) const {
      return nb::cast(std::const_pointer_cast<TensorProxy>(t));
    }
    nb::object operator()(const Slice& s) const {
      auto o = [](const std::optional<int64_t>& x) -> nb::object {
        return x ? nb::object(nb::int_(*x)) : nb::none();
      };
      return nb::steal(PySlice_New(o(s.start).ptr(), o(s.stop).ptr(), o(s.step).ptr()));
    }
    nb::object operator()(EllipsisArg) const { return nb::borrow(Py_Ellipsis); }
    nb::object operator()(const Arg::List& l) const {
      nb::list out;
      for (const auto& e : l) out.append(arg_to_py(e));
      return nb::tuple(out);
    }
  };
  return std::visit(V{}, a.v);
}

} // namespace keraunos::py

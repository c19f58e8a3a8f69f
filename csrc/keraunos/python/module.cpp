// The nanobind extension `keraunos._C`: IR types, the trace builder, the pass pipeline, the
// torch executor's code generator and the per-call dispatcher.
#include "convert.h"
#include "dispatch.h"
#include "keraunos/codegen/torch_program.h"
#include "keraunos/ir/error.h"
#include "keraunos/ir/verifier.h"
#include "keraunos/ops/backward.h"
#include "keraunos/ops/builder.h"
#include "keraunos/passes/autodiff.h"
#include "keraunos/passes/pass_manager.h"
#include "keraunos/support/options.h"

#include <chrono>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace nb::literals;
using namespace keraunos;
using keraunos::py::arg_from_py;
using keraunos::py::arg_to_py;

namespace {

Kwargs kwargs_from_py(nb::handle kw) {
  Kwargs out;
  if (kw.is_none()) return out;
  for (auto item : nb::borrow<nb::dict>(kw))
    out.emplace_back(nb::cast<std::string>(item.first), arg_from_py(item.second));
  return out;
}

Arg::List args_from_py(nb::handle args) {
  Arg::List out;
  for (nb::handle a : args) out.push_back(arg_from_py(a));
  return out;
}

int dispatcher_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<py::Dispatcher>(self)->traverse(visit, arg);
}

int dispatcher_clear(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<py::Dispatcher>(self)->release();
  return 0;
}

PyType_Slot dispatcher_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(dispatcher_traverse)},
                                  {Py_tp_clear, reinterpret_cast<void*>(dispatcher_clear)},
                                  {0, nullptr}};

} // namespace

void bind_cpu(nb::module_& m);      // bind_cpu.cpp
void bind_cpu_pool(nb::module_& m); // cpu_pool.cpp
void bind_embedded(nb::module_& m); // bind_embedded.cpp
void bind_fusion(nb::module_& m);   // bind_fusion.cpp
void bind_runtime(nb::module_& m);  // bind_runtime.cpp

NB_MODULE(_C, m) {
  m.doc() = "keraunos core (C++)";
  // Traces and proxies reachable from module globals at interpreter exit are not freed by
  // Python; nanobind would report them as leaks.
  nb::set_leak_warnings(false);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const UserError& e) {
      PyObject* type = PyExc_RuntimeError;
      switch (e.kind()) {
      case ErrorKind::Type: type = PyExc_TypeError; break;
      case ErrorKind::Value: type = PyExc_ValueError; break;
      case ErrorKind::NotImplemented: type = PyExc_NotImplementedError; break;
      case ErrorKind::Runtime: type = PyExc_RuntimeError; break;
      case ErrorKind::Index: type = PyExc_IndexError; break;
      }
      PyErr_SetString(type, e.what());
    } catch (const InternalError& e) {
      PyErr_SetString(PyExc_AssertionError, e.what());
    }
  });

  nb::enum_<DType>(m, "DType")
#define KR_X(e, n, s, sz, k, c) .value(n, DType::e)
      KERAUNOS_FOREACH_DTYPE(KR_X)
#undef KR_X
      ;
  m.def("dtype_name", [](DType d) { return std::string(dtype_name(d)); });
  m.def("promote_types", &promote_types);
  m.def("itemsize", &itemsize);

  nb::class_<Device>(m, "Device")
      .def("__init__",
           [](Device* d, const std::string& type, int index) {
             KR_CHECK(type == "cpu" || type == "cuda", NotImplemented,
                      "keraunos supports cpu and cuda devices, not '", type, "'");
             new (d) Device{type == "cpu" ? DeviceType::CPU : DeviceType::CUDA,
                            type == "cpu" ? -1 : std::max(index, 0)};
           })
      .def_prop_ro("type", [](const Device& d) { return d.type == DeviceType::CPU ? "cpu" : "cuda"; })
      .def_ro("index", &Device::index)
      .def("__str__", &Device::str)
      .def("__eq__", [](const Device& a, const Device& b) { return a == b; });

  nb::class_<TensorProxy>(m, "TensorProxy")
      .def_ro("name", &TensorProxy::name)
      .def_ro("dtype", &TensorProxy::dtype)
      .def_ro("device", &TensorProxy::device)
      .def_ro("shape", &TensorProxy::shape)
      .def_ro("strides", &TensorProxy::strides)
      .def_ro("storage_offset", &TensorProxy::storage_offset)
      .def_ro("storage_id", &TensorProxy::storage_id)
      .def_ro("requires_grad", &TensorProxy::requires_grad)
      .def("is_contiguous", &TensorProxy::is_contiguous)
      .def("__repr__", [](const TensorProxy& t) { return t.name + ": " + t.type_str(); });

  nb::class_<SourceLoc>(m, "SourceLoc")
      .def(nb::init<>())
      .def_rw("file", &SourceLoc::file)
      .def_rw("line", &SourceLoc::line)
      .def_rw("function", &SourceLoc::function);

  nb::class_<Trace>(m, "Trace")
      .def_ro("stage", &Trace::stage)
      .def_rw("ms", &Trace::ms)
      .def("__str__", [](const Trace& t) { return t.str(true); })
      .def("str", &Trace::str, "with_subsymbols"_a = true)
      .def_prop_ro("inputs",
                   [](const Trace& t) {
                     std::vector<std::shared_ptr<TensorProxy>> v;
                     for (const auto& i : t.inputs) v.push_back(std::const_pointer_cast<TensorProxy>(i));
                     return v;
                   })
      .def_prop_ro("num_symbols", [](const Trace& t) { return t.bsyms.size(); })
      .def("symbol_names",
           [](const Trace& t) {
             std::vector<std::string> v;
             for (const auto& b : t.bsyms) v.push_back(b.def().qualified_name());
             return v;
           })
      .def("verify",
           [](const Trace& t, bool functional) {
             VerifyOptions o;
             o.functional = functional;
             o.reinfer = [](const BoundSymbol& b) { return reinfer(b, BuilderOptions{}); };
             return verify(t, o);
           },
           "functional"_a = false)
      .def("torch_program",
           [](const Trace& t, const std::string& name, bool boxed) { return torch_program(t, name, boxed); },
           "name"_a = "program", "boxed"_a = false)
      .def("flatten_to_prims", &flatten_to_prims);

  nb::class_<Builder>(m, "Builder")
      .def("__init__",
           [](Builder* b, DType default_float) {
             BuilderOptions o;
             o.default_float = default_float;
             new (b) Builder(o);
           },
           "default_float"_a = DType::Float32)
      .def("add_input",
           [](Builder& b, DType dtype, Device device, Shape shape, Shape strides, int64_t offset,
              int64_t storage_id, bool requires_grad) {
             return std::const_pointer_cast<TensorProxy>(
                 b.add_input(dtype, device, std::move(shape), std::move(strides), offset,
                             storage_id, requires_grad));
           })
      .def("call",
           [](Builder& b, const std::string& op, nb::handle args, nb::handle kwargs,
              const std::string& display, const std::string& file, int line,
              const std::string& function) {
             const OpDef* d = find_op(op);
             KR_INTERNAL(d != nullptr, "unknown op '", op, "'");
             auto loc = std::make_shared<SourceLoc>(SourceLoc{file, line, function});
             Arg r = b.call_user(d->id, args_from_py(args), kwargs_from_py(kwargs), display, loc);
             return arg_to_py(r);
           })
      .def("set_return", [](Builder& b, nb::handle out) { b.set_return(arg_from_py(out)); },
           nb::arg("out").none())
      .def("finish", &Builder::finish);

  m.def("has_op", [](const std::string& name) { return find_op(name) != nullptr; });
  m.def("op_names", []() {
    std::vector<std::string> v;
    for (int i = 0; i < kNumOps; ++i) v.emplace_back(op_def(static_cast<OpId>(i)).id_name);
    return v;
  });
  m.def("op_info", [](const std::string& name) {
    const OpDef* d = find_op(name);
    KR_CHECK(d != nullptr, Value, "unknown op '", name, "'");
    nb::dict info;
    info["name"] = std::string(d->name);
    info["schema"] = d->schema.str();
    info["torch_fn"] = std::string(d->torch_fn);
    info["prim"] = d->is_prim();
    info["inplace"] = d->is_inplace();
    info["elementwise"] = d->has(tags::E);
    info["reduction"] = d->has(tags::R);
    info["view"] = d->has(tags::V);
    info["random"] = d->has(tags::N);
    info["inplace_of"] = d->inplace_of == OpId::kNumOps
                             ? std::string()
                             : std::string(op_def(d->inplace_of).id_name);
    return info;
  });

  m.def("run_pipeline",
        [](const Trace& t, const std::string& fusion_type, bool verify, DType default_float) {
          PassContext ctx;
          ctx.fusion_type = fusion_type;
          ctx.verify = verify;
          ctx.builder.default_float = default_float;
          return run_pipeline(t, ctx);
        },
        "trace"_a, "fusion_type"_a = "consecutive", "verify"_a = false,
        "default_float"_a = DType::Float32);

  m.def("autodiff",
        [](const Trace& t, const Trace& acquired, DType default_float) {
          PassContext ctx;
          ctx.builder.default_float = default_float;
          auto t0 = std::chrono::steady_clock::now();
          GradSplit s = autodiff(t, acquired, ctx);
          s.joint.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          nb::list leaves;
          for (const auto& l : s.leaves) {
            if (l.kind == GradSplit::Leaf::Value)
              leaves.append(nb::make_tuple("value"));
            else if (l.kind == GradSplit::Leaf::Tensor)
              leaves.append(nb::make_tuple("tensor", l.differentiable));
            else
              leaves.append(nb::make_tuple("alias", l.input, l.identity, l.detached, l.shape,
                                           l.strides, l.offset));
          }
          nb::list donatable;
          for (bool d : s.donatable) donatable.append(d);
          return nb::make_tuple(std::move(s.joint), std::move(s.forward), std::move(s.backward),
                                leaves, s.num_saved, donatable);
        },
        "trace"_a, "acquired"_a, "default_float"_a = DType::Float32,
        "The joint forward + backward trace of a functional trace, and its split: (joint, "
        "forward, backward, leaves, num_saved, donatable); donatable: per backward input, "
        "whether its memory may be reused after its last read; leaves: per leaf of the return, ('value',), "
        "('tensor', differentiable) or ('alias', input, identity, detached, size, stride, "
        "storage_offset).");
  m.def("recorded_write", [](const Trace& acquired) -> std::optional<std::string> {
    std::string w = recorded_write(acquired);
    if (w.empty()) return std::nullopt;
    return w;
  });
  m.def("grad_kind", [](const std::string& name) {
    const OpDef* d = find_op(name);
    KR_CHECK(d != nullptr, Value, "unknown op '", name, "'");
    switch (grad_entry(d->id).kind) {
    case GradKind::Rule: return "rule";
    case GradKind::NoGrad: return "none";
    case GradKind::Refused: return "refused";
    case GradKind::Torch: return "torch";
    }
    return "refused";
  });

  // Raised by the dispatcher for arguments it cannot run on (dispatch.h); torch.compile's
  // regions fall back to eager on it.
  nb::exception<py::UnsupportedCall>(m, "UnsupportedCall", PyExc_NotImplementedError);
  nb::class_<py::Dispatcher>(m, "Dispatcher", nb::type_slots(dispatcher_slots))
      .def(nb::init<nb::object, nb::object>())
      .def("__call__", &py::Dispatcher::call)
      .def_prop_ro("hits", &py::Dispatcher::hits)
      .def_prop_ro("misses", &py::Dispatcher::misses)
      .def_prop_ro("size", &py::Dispatcher::size)
      .def("clear", &py::Dispatcher::clear);
  m.def(
      "alias_groups",
      [](const std::vector<nb::object>& tensors) {
        std::vector<PyObject*> ts;
        ts.reserve(tensors.size());
        for (const auto& t : tensors) ts.push_back(t.ptr());
        return py::alias_groups(ts);
      },
      "tensors"_a, "For each tensor, the index of the first earlier one sharing its storage, or -1.");

  // The options registry (support/options.h): keraunos.options() lists it.
  m.def("option_table", [] {
    nb::list out;
    for (const options::Option& o : options::all()) {
      nb::dict d;
      d["name"] = o.name;
      d["env"] = o.env ? nb::object(nb::str(o.env)) : nb::none();
      static const char* kKinds[] = {"flag", "text", "words", "tuning"};
      d["kind"] = kKinds[static_cast<int>(o.kind)];
      d["default"] = o.fallback;
      d["jit_arg"] = o.jit_arg ? nb::object(nb::str(o.jit_arg)) : nb::none();
      d["doc"] = o.doc;
      d["set"] = options::get(o.name);
      nb::list keys;
      for (const options::TuningKey& k : options::tuning_keys())
        if (std::string_view(k.option) == o.name)
          keys.append(nb::make_tuple(k.name, k.lo, k.hi, k.pow2, k.zero_ok, k.is_switch, k.doc));
      d["keys"] = keys;
      out.append(d);
    }
    return out;
  });
  m.def("option", [](const std::string& name) -> nb::object {
    for (const options::Option& o : options::all()) {
      if (name != o.name) continue;
      switch (o.kind) {
      case options::Kind::Flag: return nb::bool_(options::flag(name));
      case options::Kind::Text: return nb::str(options::text(name).c_str());
      case options::Kind::Words: return nb::cast(options::words(name));
      case options::Kind::Tuning: {
        nb::dict d;
        for (const auto& [k, v] : options::tuning(name)) d[k.c_str()] = v;
        return d;
      }
      }
    }
    options::get(name); // the unknown-option error
    return nb::none();
  }, "name"_a, "The option's value now (typed: bool, str, list of words or dict of keys).");
  m.def("option_override", [](const std::string& name) { return options::override_of(name); },
        "name"_a, "set_option's value for the option (None when not set).");
  m.def(
      "set_option",
      [](const std::string& name, std::optional<std::string> value) {
        options::set(name, std::move(value));
      },
      "name"_a, "value"_a.none(),
        "Sets an option for this process (None: back to its environment variable or default).");

  bind_cpu(m);
  bind_embedded(m);
  bind_fusion(m);
  bind_cpu_pool(m);
  bind_runtime(m);
}

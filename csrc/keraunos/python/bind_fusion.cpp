// The fusion executors' Python face: `_C.fused_program(trace, ...)` lowers a partitioned trace,
// has each kernel's executor compile it (executors/executor.h) and returns the program source
// with one callable object per kernel.
// A kernel object's call is the hot path: it reads its tensors through the Python C API
// (data_ptr, stride), allocates its outputs with torch.empty_strided and runs the kernel with
// the GIL released.
#include "cpu_pool.h"
#include "keraunos/codegen/fused_program.h"
#include "keraunos/executors/executor.h"
#include "keraunos/ir/error.h"
#include "keraunos/support/options.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;
using namespace keraunos;

namespace {

std::atomic<int64_t> g_relayouts{0};

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

struct Names {
  PyObject *data_ptr = intern("data_ptr"), *stride = intern("stride");
};
const Names& names() {
  static const Names n;
  return n;
}

nb::tuple int_tuple(const Shape& s) {
  nb::list l;
  for (auto v : s) l.append(v);
  return nb::tuple(l);
}

struct InputSpec {
  Shape shape, strides;
  nb::object dtype, device;
  nb::tuple shape_t, strides_t;
  bool boxed = false; // handed over in a one-element list: an output may take its memory
};

// Whether the tensor in `box` (a one-element list the program made, dropping its own name for
// the tensor) may lend its memory to a kernel's output: the list holds the only Python
// reference, the Python object the only C++ one (autograd's saved variable adds one under
// retain_graph), and no other tensor uses its storage (a view of a base counts the base: the
// autodiff split donates only forward intermediates whose storage nothing outside the program
// reaches). Counted with the storage object this check makes (or the CPU pool's: a storage has
// one Python object, which holds one reference). The tensor spans its whole
// storage: a slice of a larger buffer (q of a fused qkv projection whose k and v are freed)
// would otherwise keep all of it alive inside the output it lends to.
bool lendable(PyObject* box) {
  PyObject* x = PyList_GET_ITEM(box, 0);
  if (Py_REFCNT(x) != 1) return false;
  nb::handle t(x);
  if (nb::cast<int64_t>(t.attr("_use_count")()) != 1) return false;
  const bool view = !t.attr("_base").is_none();
  // Kept for the process (released, never decreffed: no Python call at static destruction).
  static const nb::handle use_count =
      nb::object(nb::module_::import_("torch").attr("_C").attr("_storage_Use_Count")).release();
  nb::object storage = t.attr("untyped_storage")();
  if (nb::cast<int64_t>(use_count(storage.attr("_cdata"))) != (view ? 3 : 2)) return false;
  return nb::cast<int64_t>(t.attr("storage_offset")()) == 0 &&
         nb::cast<int64_t>(storage.attr("nbytes")()) ==
             nb::cast<int64_t>(t.attr("numel")()) * nb::cast<int64_t>(t.attr("element_size")());
}

struct OutputSpec {
  nb::tuple shape, strides;
  nb::object dtype, device;
  nb::tuple args;  // (shape, strides): torch.empty_strided's arguments, built once
  nb::dict kwargs; // {dtype, device}
  bool into = false; // written into a tensor passed after the inputs
  int donor = -1;    // the boxed input whose memory it takes when that is lendable
  int64_t bytes = 0; // of the buffer the kernel writes
};

// A fresh output is first touched by the kernel, and on Linux each 4 KiB page of it costs a
// page fault (and the page's zeroing) on that first write: for a 64 MiB output that is 16k
// faults, on memory-sized CPU kernels more time than the kernel itself (eager and Inductor pay
// it too). Large CPU outputs therefore ask for transparent huge pages on their 2 MiB-aligned
// part, as PyTorch's CPU allocator does under THP_MEM_ALLOC_ENABLE=1: 32 faults instead. Only
// advice, and a no-op where THP is off ("never"). KERAUNOS_HUGEPAGES=0 turns it off.
constexpr int64_t kHugePageOutput = int64_t{4} << 20;

bool huge_pages_enabled() {
  static const bool on = options::flag("hugepages");
  return on;
}

void advise_huge_pages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  auto begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  auto end = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

class FusedKernel {
public:
  std::string name, ir, source;
  std::string cuda_check_source; // KERAUNOS_CHECK_CUDA_CODEGEN: the CUDA a CPU kernel would get
  // KERAUNOS_DUMP=kernels: (stage, listing) after lowering and after each kernel pass.
  std::vector<std::pair<std::string, std::string>> stages;
  std::shared_ptr<const executors::CompiledKernel> exec;
  bool cuda = false;
  int cuda_device = -1;
  nb::object current_stream; // torch._C._cuda_getCurrentRawStream
  std::vector<InputSpec> inputs;
  std::vector<OutputSpec> outputs;
  nb::object empty_strided;
  int64_t work = 0; // elements touched; small kernels keep the GIL

  nb::object call(nb::args args) {
    const size_t n_in = inputs.size();
    size_t n_into = 0;
    for (const auto& o : outputs) n_into += o.into;
    KR_INTERNAL(args.size() == n_in + n_into, "kernel ", name, " called with ", args.size(),
                " tensors, expected ", n_in + n_into);
    const auto& nm = names();
    void* small[16];
    std::vector<void*> big;
    void** ptrs = small;
    if (n_in + outputs.size() > 16) {
      big.resize(n_in + outputs.size());
      ptrs = big.data();
    }
    std::vector<nb::object> keep; // relayouted inputs
    std::vector<bool> relayouted(n_in, false);
    for (size_t i = 0; i < n_in; ++i) {
      PyObject* t = args[i].ptr();
      const InputSpec& spec = inputs[i];
      if (spec.boxed) t = PyList_GET_ITEM(t, 0);
      PyObject* st = PyObject_CallMethodNoArgs(t, nm.stride);
      if (!st) throw nb::python_error();
      bool same = PyTuple_GET_SIZE(st) == static_cast<Py_ssize_t>(spec.strides.size());
      for (size_t d = 0; same && d < spec.strides.size(); ++d)
        if (spec.shape[d] > 1 && PyLong_AsLongLong(PyTuple_GET_ITEM(st, d)) != spec.strides[d])
          same = false;
      Py_DECREF(st);
      if (!same) {
        // The tensor torch produced is laid out differently from what the trace inferred:
        // copy it into the layout the kernel was generated for.
        ++g_relayouts;
        nb::object fresh = empty_strided(spec.shape_t, spec.strides_t, "dtype"_a = spec.dtype,
                                         "device"_a = spec.device);
        // A broadcast layout (stride 0) holds one element per broadcast line: copy those.
        nb::object dst = fresh, src = nb::borrow(args[i]);
        for (size_t d = 0; d < spec.strides.size(); ++d)
          if (spec.strides[d] == 0 && spec.shape[d] > 1) {
            dst = dst.attr("narrow")(d, 0, 1);
            src = src.attr("narrow")(d, 0, 1);
          }
        dst.attr("copy_")(src);
        keep.push_back(fresh);
        t = fresh.ptr();
        relayouted[i] = true;
      }
      PyObject* p = PyObject_CallMethodNoArgs(t, nm.data_ptr);
      if (!p) throw nb::python_error();
      ptrs[i] = reinterpret_cast<void*>(PyLong_AsUnsignedLongLong(p));
      Py_DECREF(p);
    }
    std::vector<nb::object> outs;
    size_t into_i = n_in;
    nb::list fresh_outs;
    for (size_t j = 0; j < outputs.size(); ++j) {
      const OutputSpec& o = outputs[j];
      nb::object t;
      if (o.into) {
        t = nb::borrow(args[into_i++]);
      } else if (o.donor >= 0 && !relayouted[o.donor] && lendable(args[o.donor].ptr())) {
        t = nb::borrow(PyList_GET_ITEM(args[o.donor].ptr(), 0));
        fresh_outs.append(t);
      } else {
        if (!cuda && o.bytes >= keraunos::py::kPoolMinBytes)
          t = keraunos::py::pooled_empty(o.shape, o.strides, o.dtype, o.bytes);
        if (!t.is_valid()) {
          PyObject* fresh = PyObject_Call(empty_strided.ptr(), o.args.ptr(), o.kwargs.ptr());
          if (!fresh) throw nb::python_error();
          t = nb::steal(fresh);
        }
        fresh_outs.append(t);
      }
      PyObject* p = PyObject_CallMethodNoArgs(t.ptr(), nm.data_ptr);
      if (!p) throw nb::python_error();
      ptrs[n_in + j] = reinterpret_cast<void*>(PyLong_AsUnsignedLongLong(p));
      Py_DECREF(p);
      if (!cuda && !o.into && o.donor < 0 && o.bytes >= kHugePageOutput && huge_pages_enabled())
        advise_huge_pages(ptrs[n_in + j], o.bytes);
    }
    if (cuda) {
      // torch's current stream on the kernel's device (an int handle).
      PyObject* dev = PyLong_FromLong(cuda_device);
      PyObject* st = PyObject_CallOneArg(current_stream.ptr(), dev);
      Py_DECREF(dev);
      if (!st) throw nb::python_error();
      void* stream = PyLong_AsVoidPtr(st);
      Py_DECREF(st);
      exec->launch(ptrs, stream);
    } else if (work > (1 << 14)) {
      nb::gil_scoped_release release;
      exec->launch(ptrs, nullptr);
    } else {
      exec->launch(ptrs, nullptr);
    }
    return nb::tuple(fresh_outs);
  }
};

nb::object torch_dtype(nb::handle torch, DType d) {
  return torch.attr(std::string(dtype_name(d)).c_str());
}

nb::object torch_device(nb::handle torch, const Device& d) {
  if (d.type == DeviceType::CPU) return torch.attr("device")("cpu");
  return torch.attr("device")("cuda", d.index);
}

int64_t kernel_work(const codegen::KernelCall& kc) {
  int64_t w = 0;
  for (const auto& t : kc.inputs) w += t->numel();
  for (const auto& t : kc.outputs) w += t->numel();
  return w;
}

} // namespace

void bind_fusion(nb::module_& m) {
  nb::class_<FusedKernel>(m, "FusedKernel")
      .def_ro("name", &FusedKernel::name)
      .def_ro("ir", &FusedKernel::ir)
      .def_ro("source", &FusedKernel::source)
      .def_ro("cuda_check_source", &FusedKernel::cuda_check_source)
      .def_ro("stages", &FusedKernel::stages)
      .def("__call__", &FusedKernel::call)
      .def("__repr__", [](const FusedKernel& k) { return "<keraunos kernel " + k.name + ">"; });

  m.def("_relayout_count", []() { return g_relayouts.load(); });

  // Returns (source, [FusedKernel]) for `trace` with CPU (and, later, CUDA) regions claimed.
  m.def(
      "fused_program",
      [](const Trace& trace, const std::string& name, bool cpu_fusion, bool cuda_fusion,
         bool check_cuda_codegen, bool kernel_stages, bool boxed, std::vector<bool> donatable) {
        codegen::FusionOptions opt;
        opt.boxed = boxed;
        opt.donatable = std::move(donatable);
        opt.cpu = cpu_fusion;
        opt.cuda = cuda_fusion;
        opt.cuda_twins = check_cuda_codegen;
        opt.kernel_stages = kernel_stages;
        codegen::FusedProgram fp = codegen::fused_program(trace, name, opt);
        nb::module_ torch = nb::module_::import_("torch");
        nb::object empty_strided = torch.attr("empty_strided");
        std::vector<const kir::Kernel*> cpu_kernels, twins;
        for (const auto& kc : fp.kernels)
          if (kc.kernel.device == DeviceType::CPU) {
            cpu_kernels.push_back(&kc.kernel);
            twins.push_back(kc.cuda_twin.get());
          }
        std::vector<std::string> check_sources(cpu_kernels.size());
        if (check_cuda_codegen) {
          // CI without a GPU: every kernel also goes through the CUDA emitter and NVRTC.
          nb::gil_scoped_release release;
          for (size_t i = 0; i < cpu_kernels.size(); ++i)
            check_sources[i] =
                executors::check_cuda_codegen(twins[i] ? *twins[i] : *cpu_kernels[i], 9, 0);
        }
        // Each kernel through its device's executor: the CPU's in one library, CUDA's one by one
        // on their device.
        std::vector<std::shared_ptr<const executors::CompiledKernel>> compiled(fp.kernels.size());
        {
          nb::gil_scoped_release release;
          std::vector<size_t> on_cpu;
          for (size_t i = 0; i < fp.kernels.size(); ++i) {
            const auto& kc = fp.kernels[i];
            if (kc.kernel.device == DeviceType::CPU) {
              on_cpu.push_back(i);
              continue;
            }
            compiled[i] = executors::executor_for(DeviceType::CUDA)
                              .compile({&kc.kernel}, kc.outputs.at(0)->device.index)
                              .at(0);
          }
          auto cpu = executors::executor_for(DeviceType::CPU).compile(cpu_kernels, -1);
          for (size_t c = 0; c < on_cpu.size(); ++c) compiled[on_cpu[c]] = cpu.at(c);
        }
        nb::list objs;
        for (size_t ki = 0; ki < fp.kernels.size(); ++ki) {
          const auto& kc = fp.kernels[ki];
          auto* k = new FusedKernel();
          k->name = kc.kernel.name;
          k->ir = kc.kernel.str();
          for (const auto& st : kc.stages) k->stages.emplace_back(st.pass, st.listing);
          k->exec = compiled[ki];
          k->source = k->exec->source();
          if (kc.kernel.device == DeviceType::CUDA) {
            k->cuda = true;
            k->cuda_device = kc.outputs.at(0)->device.index;
            k->current_stream = torch.attr("_C").attr("_cuda_getCurrentRawStream");
          } else {
            for (size_t i = 0; i < cpu_kernels.size(); ++i)
              if (cpu_kernels[i] == &kc.kernel) k->cuda_check_source = std::move(check_sources[i]);
          }
          k->empty_strided = empty_strided;
          k->work = kernel_work(kc);
          for (size_t i = 0; i < kc.inputs.size(); ++i) {
            InputSpec s;
            s.shape = kc.inputs[i]->shape;
            s.strides = kc.kernel.buffers[i].strides;
            s.shape_t = int_tuple(s.shape);
            s.strides_t = int_tuple(s.strides);
            s.dtype = torch_dtype(torch, kc.inputs[i]->dtype);
            s.device = torch_device(torch, kc.inputs[i]->device);
            s.boxed = std::count(kc.donor.begin(), kc.donor.end(), static_cast<int>(i)) > 0;
            k->inputs.push_back(std::move(s));
          }
          for (size_t j = 0; j < kc.outputs.size(); ++j) {
            const auto& b = kc.kernel.buffers[kc.inputs.size() + j];
            OutputSpec o;
            o.shape = int_tuple(b.shape);
            o.strides = int_tuple(b.strides);
            o.dtype = torch_dtype(torch, b.dtype);
            o.device = torch_device(torch, kc.outputs[j]->device);
            o.into = kc.write_into[j] != nullptr;
            o.donor = kc.donor[j];
            o.args = nb::make_tuple(o.shape, o.strides);
            o.kwargs["dtype"] = o.dtype;
            o.kwargs["device"] = o.device;
            int64_t span = 1; // elements from the first to one past the last (dense layout)
            for (size_t d = 0; d < b.shape.size(); ++d) span += (b.shape[d] - 1) * b.strides[d];
            o.bytes = b.shape.empty() || std::count(b.shape.begin(), b.shape.end(), 0) > 0
                          ? 0
                          : span * itemsize(b.dtype);
            k->outputs.push_back(std::move(o));
          }
          objs.append(nb::cast(k, nb::rv_policy::take_ownership));
        }
        return nb::make_tuple(fp.source, objs);
      },
      "trace"_a, "name"_a, "cpu"_a = true, "cuda"_a = true, "check_cuda_codegen"_a = false,
      "kernel_stages"_a = false, "boxed"_a = false, "donatable"_a = std::vector<bool>{});
}

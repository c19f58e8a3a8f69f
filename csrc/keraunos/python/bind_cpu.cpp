// Bindings of the CPU compile-and-load runtime (runtime/cpu_compiler.h): compiler info, compiling
// a source into a loaded library, calling a kernel of the void** ABI on raw pointers (for tests
// and the CPU fusion executor's Python glue), cache statistics.
#include "keraunos/runtime/cpu_compiler.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace nb::literals;

void bind_cpu(nb::module_& m) {
  using keraunos::cpu::CompiledLibrary;
  namespace cpu = keraunos::cpu;

  // Its own type, so the executor (and users) can tell "no compiler here" from a bug.
  nb::exception<cpu::CompilerUnavailable>(m, "CpuCompilerUnavailable", PyExc_RuntimeError);

  nb::class_<CompiledLibrary>(m, "CpuLibrary")
      .def_prop_ro("key", &CompiledLibrary::key)
      .def_prop_ro("path", &CompiledLibrary::path)
      .def("symbol_address",
           [](const CompiledLibrary& lib, const std::string& name) {
             return reinterpret_cast<uintptr_t>(lib.symbol(name));
           })
      // Calls `extern "C" void symbol(void** ptrs, const int64_t* args)`; the GIL is released
      // (kernels may run long, in OpenMP threads). The caller keeps the memory alive.
      .def("call",
           [](const CompiledLibrary& lib, const std::string& symbol,
              const std::vector<uintptr_t>& ptrs, const std::vector<int64_t>& args) {
             cpu::KernelFn fn = lib.kernel(symbol);
             std::vector<void*> p(ptrs.size());
             for (size_t i = 0; i < ptrs.size(); ++i) p[i] = reinterpret_cast<void*>(ptrs[i]);
             nb::gil_scoped_release release;
             fn(p.data(), args.data());
           },
           "symbol"_a, "ptrs"_a, "args"_a)
      .def("__repr__",
           [](const CompiledLibrary& lib) { return "<CpuLibrary " + lib.path() + ">"; });

  m.def("cpu_compiler_info", []() {
    cpu::CompilerInfo ci;
    {
      nb::gil_scoped_release release; // may run the compiler (the probe)
      ci = cpu::cpu_compiler_info();
    }
    nb::dict d;
    d["available"] = ci.available;
    d["reason"] = ci.reason;
    d["path"] = ci.path;
    d["identity"] = ci.identity;
    d["flags"] = ci.flags;
    d["openmp"] = ci.openmp;
    d["march_native"] = ci.march_native;
    d["vector_math"] = ci.vector_math;
    d["cache_dir"] = ci.cache_dir;
    return d;
  });

  m.def("cpu_compile",
        [](const std::string& source, std::optional<std::string> symbol) {
          std::shared_ptr<CompiledLibrary> lib;
          {
            nb::gil_scoped_release release;
            lib = cpu::compile_and_load(source);
          }
          if (symbol) lib->symbol(*symbol); // fail here, not at the first call
          return lib;
        },
        "source"_a, "symbol"_a = nb::none());

  m.def("cpu_cache_stats", []() {
    cpu::CacheStats s = cpu::cpu_cache_stats();
    nb::dict d;
    d["memory_hits"] = s.memory_hits;
    d["disk_hits"] = s.disk_hits;
    d["compiles"] = s.compiles;
    d["compile_ms"] = s.compile_ms;
    d["disk_load_ms"] = s.disk_load_ms;
    return d;
  });

  // Tests only: forget the compiler and the in-memory cache; re-read CXX, KERAUNOS_CXXFLAGS and
  // KERAUNOS_CACHE_DIR; search `search_path` instead of $PATH for the compiler.
  m.def("_cpu_reset",
        [](std::optional<std::string> search_path) {
          cpu::reset_cpu_runtime_for_testing(std::move(search_path));
        },
        "search_path"_a = nb::none());
}

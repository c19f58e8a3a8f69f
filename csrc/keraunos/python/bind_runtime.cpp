// Bindings of the runtime layer: NVRTC (compile CUDA C++ to CUBIN), the CUBIN cache, and a
// minimal view of the CUDA driver (load a CUBIN, launch a kernel on a torch stream) for tests
// and for the CUDA fusion executor's Python glue.
#include "keraunos/runtime/cuda_driver.h"
#include "keraunos/runtime/kernel_cache.h"
#include "keraunos/runtime/nvrtc.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace nb::literals;
using namespace keraunos::runtime;

namespace {

nb::bytes to_bytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }

std::pair<bool, std::string> to_pair(const Availability& a) { return {a.available, a.reason}; }

// Owns the module and the kernels looked up in it; launch() takes the arguments packed like
// the kernel's parameter list (struct.pack) so Python needs no per-type plumbing.
class PyCudaModule {
public:
  PyCudaModule(nb::bytes cubin, int device)
      : module_(std::string(cubin.c_str(), cubin.size()), device) {}

  void launch(const std::string& name, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
              nb::bytes args, unsigned shared_mem, std::uintptr_t stream) {
    const CUfunction f = module_.function(name);
    CudaModule::launch_packed(f, grid.data(), block.data(), shared_mem,
                              reinterpret_cast<CUstream>(stream),
                              std::string(args.c_str(), args.size()));
  }

private:
  CudaModule module_;
};

} // namespace

void bind_runtime(nb::module_& m) {
  m.def("nvrtc_available", [] { return to_pair(nvrtc_available()); },
        "(True, '') when libnvrtc loads, else (False, why).");
  m.def("nvrtc_version", &nvrtc_version, "(major, minor) of the loaded NVRTC.");
  m.def("nvrtc_library_path", &nvrtc_library_path);
  m.def("set_nvrtc_search_dirs", &set_nvrtc_search_dirs, "dirs"_a,
        "Directories to look for libnvrtc in before CUDA_HOME and the loader's path.");
  m.def(
      "compile_cuda",
      [](const std::string& source, const std::string& name, int arch,
         const std::vector<std::string>& options, bool cache) {
        std::string cubin;
        {
          nb::gil_scoped_release release; // NVRTC takes tens of milliseconds
          cubin = cache ? compile_cuda_cached(source, name, arch, options)
                        : compile_cuda(source, name, arch, options).cubin;
        }
        return to_bytes(cubin);
      },
      "source"_a, "name"_a, "arch"_a = 90, "options"_a = std::vector<std::string>{},
      "cache"_a = true, "CUDA C++ -> CUBIN (bytes) for sm_<arch>, through the kernel cache.");
  m.def(
      "compile_cuda_log",
      [](const std::string& source, const std::string& name, int arch,
         const std::vector<std::string>& options) {
        NvrtcResult r;
        {
          nb::gil_scoped_release release;
          r = compile_cuda(source, name, arch, options);
        }
        return std::make_pair(to_bytes(r.cubin), r.log);
      },
      "source"_a, "name"_a, "arch"_a = 90, "options"_a = std::vector<std::string>{},
      "Uncached compile: (cubin, NVRTC log).");
  m.def("kernel_cache_stats", [] {
    ArtifactCache& c = cuda_kernel_cache();
    const ArtifactCache::Stats s = c.stats();
    nb::dict d;
    d["dir"] = c.dir().string();
    d["memory_hits"] = s.memory_hits;
    d["disk_hits"] = s.disk_hits;
    d["misses"] = s.misses;
    d["corrupt_files"] = s.corrupt_files;
    d["write_failures"] = s.write_failures;
    return d;
  });
  m.def("kernel_cache_clear_memory", [] { cuda_kernel_cache().clear_memory(); },
        "Forget the in-memory CUBINs (the disk cache stays): the next compile reads the disk.");

  m.def("cuda_driver_available", [] { return to_pair(cuda_driver_available()); },
        "(True, '') when libcuda loads and sees a device, else (False, why).");
  m.def("cuda_compute_capability", &compute_capability, "device"_a = 0);
  nb::class_<PyCudaModule>(m, "CudaModule")
      .def(nb::init<nb::bytes, int>(), "cubin"_a, "device"_a = 0)
      .def("launch", &PyCudaModule::launch, "name"_a, "grid"_a, "block"_a, "args"_a,
           "shared_mem"_a = 0, "stream"_a = 0,
           "Launch kernel `name`; `args` packed like its parameters (struct.pack), `stream` a "
           "CUstream as an int (torch.cuda.current_stream().cuda_stream).");
}

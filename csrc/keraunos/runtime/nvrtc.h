// NVRTC, loaded at run time: CUDA C++ source -> CUBIN, with no link-time dependency on CUDA
// (DESIGN §3), so one keraunos build runs on machines without a GPU and CI (no GPU) still
// compiles every generated kernel.
//
// Generated kernels are header-free (they define what they need), so no include path is
// passed to NVRTC and no CUDA headers are needed anywhere.
//
// Where libnvrtc is looked for, in order (the first that loads wins):
//   1. $KERAUNOS_NVRTC_LIBRARY, a path or a soname. When set, it is the only candidate: a
//      user who names a library wants that one, not a silent fallback to another version.
//   2. The directories given to set_nvrtc_search_dirs: Python passes the lib folders of the
//      `nvidia-cuda-nvrtc` wheel (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib), since only Python
//      knows where its site-packages are.
//   3. $CUDA_HOME/lib64 (then $CUDA_PATH/lib64).
//   4. libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so through the dynamic loader's search path.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace keraunos::runtime {

struct NvrtcResult {
  std::string cubin; // an ELF image for the driver's cuModuleLoadData
  std::string log;   // NVRTC's log (warnings), possibly empty
};

struct Availability {
  bool available = false;
  std::string reason; // why not (every candidate tried, with dlerror); empty when available
};

// Directories to try before $CUDA_HOME and the loader's path. A failed earlier load attempt is
// forgotten, so the next use tries again with these; a library already loaded stays loaded.
void set_nvrtc_search_dirs(std::vector<std::string> dirs);

// Loads libnvrtc on first use. Never throws.
Availability nvrtc_available();

// {major, minor} of the loaded NVRTC. Throws a user RuntimeError when NVRTC is unavailable.
std::pair<int, int> nvrtc_version();

// The path (or soname) libnvrtc was loaded from; throws like nvrtc_version.
std::string nvrtc_library_path();

// The options every compile gets, before `extra_options`: --gpu-architecture=sm_<arch>,
// -default-device, -std=c++17. Fast math stays off unless the caller asks for it.
std::vector<std::string> nvrtc_default_options(int sm_arch);

// Compiles `source` to a CUBIN for sm_<sm_arch> (e.g. 90). `name` names the program in NVRTC's
// messages. A compile error is a keraunos bug (we generated the source): it raises an internal
// error carrying NVRTC's log and the numbered source. NVRTC missing is a user RuntimeError.
NvrtcResult compile_cuda(const std::string& source, const std::string& name, int sm_arch = 90,
                         const std::vector<std::string>& extra_options = {});

// compile_cuda through the process's CUDA kernel cache (memory, then
// $KERAUNOS_CACHE_DIR/cuda on disk); returns the CUBIN. The key covers the source, the
// architecture, NVRTC's version and every option.
std::string compile_cuda_cached(const std::string& source, const std::string& name,
                                int sm_arch = 90,
                                const std::vector<std::string>& extra_options = {});

} // namespace keraunos::runtime

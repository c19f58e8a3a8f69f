#include "keraunos/runtime/nvrtc.h"
#include "keraunos/support/options.h"

#include "keraunos/ir/error.h"
#include "keraunos/runtime/kernel_cache.h"

#include <cstdlib>
#include <dlfcn.h>
#include <memory>
#include <mutex>
#include <sstream>
#include <unistd.h>

namespace keraunos::runtime {

namespace {

// The few declarations of nvrtc.h we use (its ABI has been stable since CUDA 11): including
// CUDA headers would make keraunos need a CUDA toolkit to build.
using nvrtcResult = int; // an enum in nvrtc.h; NVRTC_SUCCESS is 0
constexpr nvrtcResult kNvrtcSuccess = 0;
struct NvrtcProgramImpl; // _nvrtcProgram, opaque
using nvrtcProgram = NvrtcProgramImpl*;

// The resolved entry points. Built once, never freed, and the library is never dlclose'd: a
// compile in flight on another thread may be using it, and unloading NVRTC gains nothing.
struct NvrtcApi {
  std::string path;
  int major = 0, minor = 0;
  nvrtcResult (*version)(int*, int*);
  nvrtcResult (*create_program)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                const char* const*);
  nvrtcResult (*compile_program)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*get_program_log_size)(nvrtcProgram, std::size_t*);
  nvrtcResult (*get_program_log)(nvrtcProgram, char*);
  nvrtcResult (*get_cubin_size)(nvrtcProgram, std::size_t*);
  nvrtcResult (*get_cubin)(nvrtcProgram, char*);
  nvrtcResult (*destroy_program)(nvrtcProgram*);
  const char* (*get_error_string)(nvrtcResult);
};

// The one piece of global mutable state here: where to look, and the library once found. It
// exists because dlopen is per process, and because the search directories come from Python
// after this library is loaded. A failure is remembered (so nvrtc_available() stays cheap)
// until new search directories are given.
struct NvrtcLoader {
  std::mutex mu;
  std::vector<std::string> search_dirs;
  std::unique_ptr<const NvrtcApi> api; // set once, never reset
  bool failed = false;
  std::string failure;
};

NvrtcLoader& loader() {
  static NvrtcLoader l;
  return l;
}

template <typename Fn> bool resolve(void* lib, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

// Opens one candidate; on failure appends why to `tried`.
std::unique_ptr<const NvrtcApi> try_open(const std::string& candidate, std::string& tried) {
  // RTLD_LOCAL: NVRTC's symbols must not interpose anyone else's (torch may load its own copy).
  // Opened by full path, libnvrtc finds libnvrtc-builtins next to itself (its RPATH is $ORIGIN).
  void* lib = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = ::dlerror();
    tried += "\n  " + candidate + ": " + (err ? err : "dlopen failed");
    return nullptr;
  }
  auto api = std::make_unique<NvrtcApi>();
  std::string missing;
  resolve(lib, "nvrtcVersion", api->version, missing);
  resolve(lib, "nvrtcCreateProgram", api->create_program, missing);
  resolve(lib, "nvrtcCompileProgram", api->compile_program, missing);
  resolve(lib, "nvrtcGetProgramLogSize", api->get_program_log_size, missing);
  resolve(lib, "nvrtcGetProgramLog", api->get_program_log, missing);
  resolve(lib, "nvrtcGetCUBINSize", api->get_cubin_size, missing);
  resolve(lib, "nvrtcGetCUBIN", api->get_cubin, missing);
  resolve(lib, "nvrtcDestroyProgram", api->destroy_program, missing);
  resolve(lib, "nvrtcGetErrorString", api->get_error_string, missing);
  if (!missing.empty() || api->version(&api->major, &api->minor) != kNvrtcSuccess) {
    tried += "\n  " + candidate + ": loaded, but " +
             (missing.empty() ? "nvrtcVersion failed" : "missing " + missing) +
             " (NVRTC older than CUDA 11.1?)";
    ::dlclose(lib);
    return nullptr;
  }
  // The file actually loaded (a soname candidate resolves to some directory on the path).
  Dl_info info{};
  api->path = ::dladdr(reinterpret_cast<void*>(api->version), &info) && info.dli_fname
                  ? info.dli_fname
                  : candidate;
  // libnvrtc dlopens libnvrtc-builtins.so.<major>.<minor> by soname when it compiles, and has
  // no RPATH: from a wheel's folder (not on the loader's path) that fails. Loading it first, by
  // full path from libnvrtc's own folder, makes NVRTC's dlopen find it already loaded. Where
  // that file is absent, NVRTC's own lookup may still succeed; a compile reports it if not.
  if (const std::size_t slash = api->path.rfind('/'); slash != std::string::npos) {
    const std::string builtins = api->path.substr(0, slash) + "/libnvrtc-builtins.so." +
                                 std::to_string(api->major) + "." + std::to_string(api->minor);
    if (::access(builtins.c_str(), R_OK) == 0) ::dlopen(builtins.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  return api;
}

std::vector<std::string> candidates(const std::vector<std::string>& search_dirs) {
  static constexpr const char* kNames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  if (auto lib = options::get("nvrtc_library")) return {*lib};
  std::vector<std::string> dirs = search_dirs;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* home = std::getenv(var); home && *home)
      dirs.push_back(std::string(home) + "/lib64");
  std::vector<std::string> out;
  for (const std::string& dir : dirs)
    for (const char* name : kNames) out.push_back(dir + "/" + name);
  for (const char* name : kNames) out.emplace_back(name);
  return out;
}

// The loaded API, or nullptr with `reason` set. Thread-safe; loads at most once.
const NvrtcApi* load(std::string* reason) {
  NvrtcLoader& l = loader();
  std::lock_guard lock(l.mu);
  if (!l.api && !l.failed) {
    std::string tried;
    for (const std::string& candidate : candidates(l.search_dirs))
      if ((l.api = try_open(candidate, tried))) break;
    if (!l.api) {
      l.failed = true;
      l.failure = "libnvrtc was not found (install the nvidia-cuda-nvrtc wheel, or set "
                  "KERAUNOS_NVRTC_LIBRARY or CUDA_HOME); tried:" +
                  tried;
    }
  }
  if (!l.api && reason) *reason = l.failure;
  return l.api.get();
}

const NvrtcApi& api_or_throw() {
  std::string reason;
  const NvrtcApi* api = load(&reason);
  KR_CHECK(api, Runtime, "CUDA kernels need NVRTC: ", reason);
  return *api;
}

std::string numbered(const std::string& source) {
  std::ostringstream os;
  std::istringstream in(source);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string num = std::to_string(n);
    os << std::string(num.size() < 4 ? 4 - num.size() : 0, ' ') << num << "  " << line << '\n';
  }
  return os.str();
}

// Destroys the program on every path out of compile_cuda.
struct ProgramGuard {
  const NvrtcApi& api;
  nvrtcProgram prog = nullptr;
  ~ProgramGuard() {
    if (prog) api.destroy_program(&prog);
  }
};

} // namespace

void set_nvrtc_search_dirs(std::vector<std::string> dirs) {
  NvrtcLoader& l = loader();
  std::lock_guard lock(l.mu);
  l.search_dirs = std::move(dirs);
  l.failed = false;
}

Availability nvrtc_available() {
  Availability a;
  a.available = load(&a.reason) != nullptr;
  return a;
}

std::pair<int, int> nvrtc_version() {
  const NvrtcApi& api = api_or_throw();
  return {api.major, api.minor};
}

std::string nvrtc_library_path() { return api_or_throw().path; }

std::vector<std::string> nvrtc_default_options(int sm_arch) {
  return {"--gpu-architecture=sm_" + std::to_string(sm_arch), "-default-device", "-std=c++17"};
}

NvrtcResult compile_cuda(const std::string& source, const std::string& name, int sm_arch,
                         const std::vector<std::string>& extra_options) {
  KR_CHECK(sm_arch >= 50 && sm_arch < 1000, Value, "compile_cuda: sm_arch must be a compute "
           "capability such as 90 (sm_90), got ", sm_arch);
  const NvrtcApi& api = api_or_throw();
  std::vector<std::string> options = nvrtc_default_options(sm_arch);
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());

  ProgramGuard guard{api};
  nvrtcResult r =
      api.create_program(&guard.prog, source.c_str(), name.c_str(), 0, nullptr, nullptr);
  KR_INTERNAL(r == kNvrtcSuccess, "nvrtcCreateProgram(", name,
              ") failed: ", api.get_error_string(r));
  const nvrtcResult compiled =
      api.compile_program(guard.prog, static_cast<int>(argv.size()), argv.data());

  NvrtcResult out;
  std::size_t log_size = 0;
  if (api.get_program_log_size(guard.prog, &log_size) == kNvrtcSuccess && log_size > 1) {
    out.log.resize(log_size);
    if (api.get_program_log(guard.prog, out.log.data()) != kNvrtcSuccess) out.log.clear();
    while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n'))
      out.log.pop_back();
  }
  if (compiled != kNvrtcSuccess) {
    std::string opts;
    for (const std::string& o : options) opts += " " + o;
    KR_INTERNAL(false, "NVRTC failed to compile the generated kernel '", name, "' (",
                api.get_error_string(compiled), ", NVRTC ", api.major, ".", api.minor,
                ", options:", opts, ")\n--- NVRTC log ---\n", out.log, "\n--- source ---\n",
                numbered(source), "---");
  }
  std::size_t cubin_size = 0;
  r = api.get_cubin_size(guard.prog, &cubin_size);
  KR_INTERNAL(r == kNvrtcSuccess && cubin_size > 0, "nvrtcGetCUBINSize(", name, ") failed: ",
              api.get_error_string(r));
  out.cubin.resize(cubin_size);
  r = api.get_cubin(guard.prog, out.cubin.data());
  KR_INTERNAL(r == kNvrtcSuccess, "nvrtcGetCUBIN(", name, ") failed: ", api.get_error_string(r));
  return out;
}

std::string compile_cuda_cached(const std::string& source, const std::string& name, int sm_arch,
                                const std::vector<std::string>& extra_options) {
  const auto [major, minor] = nvrtc_version();
  CacheKey key;
  // Bump the tag when the way CUBINs are produced changes in a way the other parts miss.
  key.add("keraunos-cuda-v2").add(source).add(major).add(minor);
  for (const std::string& o : nvrtc_default_options(sm_arch)) key.add(o);
  key.add("--");
  for (const std::string& o : extra_options) key.add(o);
  // `name` is left out: it only labels messages, and equal sources compile to equal CUBINs.
  return cuda_kernel_cache().get_or_build(
      key.hex(), [&] { return compile_cuda(source, name, sm_arch, extra_options).cubin; });
}

} // namespace keraunos::runtime

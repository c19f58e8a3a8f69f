// The CPU compile-and-load runtime: generated C++ kernels are compiled by the system C++
// compiler into shared objects, loaded with dlopen and cached in memory and on disk
// (runtime/kernel_cache.h has the layout).
//
// Kernel ABI (what the CPU fusion executor generates):
//   extern "C" void kernel(void** ptrs, const int64_t* args);
// `ptrs` holds the data pointers of the tensors, `args` the sizes, strides and scalars.
//
// The compiler is found once per process (CXX, then c++, g++, clang++ on PATH) and probed once
// (is -fopenmp accepted and linkable? -march=native?); the probe's answer is cached on disk too,
// so a process that only loads cached kernels never runs the compiler beyond `--version`.
// Environment, read when the runtime is first used (reset_cpu_runtime_for_testing re-reads it):
//   CXX                  the compiler; words after the first are passed before our flags (ccache)
//   KERAUNOS_CXXFLAGS    extra flags, split on whitespace (no shell quoting)
//   KERAUNOS_CACHE_DIR   cache root (default ~/.cache/keraunos); kernels go to <root>/cpu
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace keraunos::cpu {

using KernelFn = void (*)(void** ptrs, const int64_t* args);

// No usable C++ compiler (or no writable cache folder): not a keraunos bug and not the user's
// program's fault. The CPU fusion executor turns it into a warning and hands the region to the
// torch executor. Deliberately not a UserError or an InternalError.
class CompilerUnavailable : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct CompileOptions {
  // Passed in this order, before KERAUNOS_CXXFLAGS. -ffp-contract=off: GCC fuses a * b + c
  // into one FMA by default, even in ISO C++ mode, and its single rounding differs from eager's
  // two (x * 3 + 1 came out 1 ulp off torch's); torch.compile's C++ backend turns it off too.
  // -fno-trapping-math -fno-math-errno change no result in the default floating-point
  // environment but let GCC vectorize the helpers' selects and sqrt; -fwrapv gives integer
  // overflow eager's wrap-around.
  std::vector<std::string> flags{"-O3",         "-march=native", "-fPIC",   "-shared",
                                 "-std=c++17", "-fopenmp",      "-ffp-contract=off",
                                 "-fno-trapping-math", "-fno-math-errno", "-fwrapv"};
  // Those of `flags` dropped when the compiler rejects them (probed once per compiler).
  std::vector<std::string> optional_flags{"-march=native", "-fopenmp"};
  std::vector<std::string> extra_flags;
  // The default flags plus KERAUNOS_CXXFLAGS.
  static CompileOptions from_env();
};

struct CompilerInfo {
  bool available = false;
  std::string reason; // why not, when !available
  std::string path;   // the executable
  std::string identity;
  std::vector<std::string> flags; // what kernels are compiled with, after the probe
  bool openmp = false;
  bool march_native = false;
  bool vector_math = false; // glibc's libmvec (kr_cpu.h's sin, cos, tan, erf)
  std::string cache_dir;
};

// A loaded kernel library. Kernels' function pointers are valid while it lives: hold the
// shared_ptr as long as you call them.
class CompiledLibrary {
public:
  CompiledLibrary(void* handle, std::string key, std::string path);
  ~CompiledLibrary();
  CompiledLibrary(const CompiledLibrary&) = delete;
  CompiledLibrary& operator=(const CompiledLibrary&) = delete;

  // The address of an extern "C" symbol; an internal error when it is missing.
  void* symbol(const std::string& name) const;
  KernelFn kernel(const std::string& name) const {
    return reinterpret_cast<KernelFn>(symbol(name));
  }
  const std::string& key() const { return key_; }
  const std::string& path() const { return path_; }

private:
  void* handle_;
  std::string key_;
  std::string path_;
};

// Compiles `source` (or finds it in the memory or disk cache) and loads it. Throws
// CompilerUnavailable without a compiler, InternalError (the compiler's output and the path of
// the saved source) when it does not compile. Thread-safe.
std::shared_ptr<CompiledLibrary> compile_and_load(const std::string& source,
                                                  const CompileOptions& options);
std::shared_ptr<CompiledLibrary> compile_and_load(const std::string& source);

// Finds and probes the compiler for these options if not done yet; never throws for a
// missing compiler (available=false and a reason instead).
CompilerInfo cpu_compiler_info(const CompileOptions& options);
CompilerInfo cpu_compiler_info();

struct CacheStats {
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t compiles = 0;
  double compile_ms = 0; // in the compiler, summed
  double disk_load_ms = 0; // verifying + dlopen of disk hits, summed
};
CacheStats cpu_cache_stats();

// Tests only: forget the compiler, the probes, the in-memory cache and the statistics, and
// re-read the environment on next use. `search_path` replaces $PATH for finding the compiler.
// Libraries still held elsewhere stay loaded.
void reset_cpu_runtime_for_testing(std::optional<std::string> search_path = std::nullopt);

} // namespace keraunos::cpu

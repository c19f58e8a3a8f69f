#include "keraunos/runtime/cpu_compiler.h"
#include "keraunos/support/options.h"

#include "keraunos/ir/error.h"
#include "keraunos/runtime/kernel_cache.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <mutex>
#include <spawn.h>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <unordered_map>

extern char** environ;

namespace keraunos::cpu {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

bool is_executable_file(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// execvp's lookup, done by us so the compiler's path is known (it is part of the cache key).
std::optional<std::string> find_executable(const std::string& name, const std::string& search) {
  if (name.find('/') != std::string::npos)
    return is_executable_file(name) ? std::optional<std::string>(name) : std::nullopt;
  size_t start = 0;
  for (;;) {
    size_t end = search.find(':', start);
    std::string dir = search.substr(start, end == std::string::npos ? end : end - start);
    fs::path p = fs::path(dir.empty() ? "." : dir) / name;
    if (is_executable_file(p)) return p.string();
    if (end == std::string::npos) return std::nullopt;
    start = end + 1;
  }
}

struct ProcessResult {
  bool started = false;
  int exit_code = -1; // 128 + signal when killed
  std::string output; // stdout and stderr, interleaved as written
};

// Runs argv[0] (a path) with argv and no shell: nothing in a path or flag is interpreted.
ProcessResult run_process(const std::vector<std::string>& argv) {
  ProcessResult r;
  int fds[2];
  // Close-on-exec, so compilers spawned at once by other threads do not inherit our pipe and
  // keep it open past our child's exit.
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    r.output = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    r.output = argv[0] + ": " + std::strerror(rc);
    return r;
  }
  r.started = true;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return r; // exit_code stays -1
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status)
                                  : (WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1);
  return r;
}

// What identifies the host CPU for -march=native: the first processor's model and feature
// lines of /proc/cpuinfo (frequencies and core ids vary and are left out).
std::string host_cpu_identity() {
  auto text = runtime::read_file("/proc/cpuinfo");
  if (!text) return "unknown-cpu";
  static constexpr const char* kKeep[] = {"vendor_id", "cpu family", "model",   "stepping",
                                          "flags",     "Features",   "CPU implementer",
                                          "CPU architecture", "CPU variant", "CPU part", "isa",
                                          "uarch"};
  std::string out;
  std::istringstream is(*text);
  std::string line;
  while (std::getline(is, line)) {
    if (line.empty()) break; // end of the first processor's block
    for (const char* k : kKeep) {
      size_t n = std::strlen(k);
      if (line.compare(0, n, k) == 0 && line.size() > n && (line[n] == ' ' || line[n] == '\t')) {
        out += line;
        out += '\n';
      }
    }
  }
  return out;
}

bool depends_on_host_cpu(const std::vector<std::string>& flags) {
  for (const auto& f : flags)
    if (f.find("=native") != std::string::npos) return true;
  return false;
}

struct Toolchain {
  bool available = false;
  std::string reason;
  std::string path;
  std::vector<std::string> launcher_args; // words after the program in CXX (e.g. ccache g++)
  std::string identity;
  // path and launcher words: what the key records about where the compiler lives
  std::string key_path() const { return join({path, join(launcher_args)}, "\x1f"); }
};

Toolchain find_toolchain(const std::optional<std::string>& search_override) {
  std::string search;
  if (search_override) {
    search = *search_override;
  } else if (const char* p = std::getenv("PATH")) {
    search = p;
  } else {
    search = "/usr/local/bin:/usr/bin:/bin";
  }
  std::vector<std::vector<std::string>> candidates;
  if (auto words = options::words("cxx"); !words.empty()) candidates.push_back(words);
  for (const char* name : {"c++", "g++", "clang++"}) candidates.push_back({name});

  Toolchain tc;
  std::string tried;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& words = candidates[i];
    std::string label = (i == 0 && candidates.size() == 4 ? "CXX=" : "") + join(words);
    auto path = find_executable(words[0], search);
    if (!path) {
      tried += "\n  " + label + ": not found";
      continue;
    }
    std::vector<std::string> argv{*path};
    argv.insert(argv.end(), words.begin() + 1, words.end());
    argv.push_back("--version");
    ProcessResult r = run_process(argv);
    if (!r.started || r.exit_code != 0) {
      tried += "\n  " + label + " (" + *path + "): `--version` failed: " + r.output;
      continue;
    }
    tc.available = true;
    tc.path = *path;
    tc.launcher_args.assign(words.begin() + 1, words.end());
    tc.identity = r.output.substr(0, r.output.find('\n'));
    return tc;
  }
  tc.reason = "no C++ compiler found (set CXX, or put c++, g++ or clang++ on PATH; searched "
              "PATH=" +
              search + "):" + tried;
  return tc;
}

// A tiny library that needs the optional features: OpenMP's header, pragma and runtime.
constexpr const char* kProbeSource = R"(#ifdef _OPENMP
#include <omp.h>
#endif
extern "C" int keraunos_probe(int n) {
  int s = 0;
#pragma omp parallel for reduction(+ : s)
  for (int i = 0; i < n; ++i) s += i;
#ifdef _OPENMP
  s += omp_get_max_threads() * 0;
#endif
  return s;
}
)";

// glibc's vector math library: GCC vectorizes these calls into its SIMD variants (kr_cpu.h uses
// it for sin, cos, tan and erf when the probe keeps -DKR_HAVE_MVEC=1 -lmvec).
constexpr const char* kMvecProbeSource = R"(#include <cmath>
extern "C" {
__attribute__((simd("notinbranch"))) float sinf(float) noexcept;
int keraunos_probe(int n) {
  float x[64], y[64];
  for (int i = 0; i < 64; ++i) x[i] = 0.1f * static_cast<float>(i + n);
  for (int i = 0; i < 64; ++i) y[i] = sinf(x[i]);
  int bad = 0;
  for (int i = 0; i < 64; ++i) bad += std::fabs(y[i] - static_cast<float>(std::sin(double(x[i])))) > 1e-6f;
  return bad;
}
}
)";
// --no-as-needed: the flags come before the kernel's source, where an --as-needed linker
// (Ubuntu's default) would drop the library.
const std::vector<std::string> kMvecFlags{"-DKR_HAVE_MVEC=1", "-Wl,--no-as-needed", "-lmvec"};

struct Probed {
  bool ok = false;
  std::vector<std::string> flags; // effective: kept flags, then extra flags
  std::string error;
};

class Runtime {
public:
  explicit Runtime(std::optional<std::string> search) : search_(std::move(search)) {
    defaults_ = CompileOptions::from_env();
  }

  const CompileOptions& defaults() const { return defaults_; }

  // The compiler, the folder and the flags for `options`; throws CompilerUnavailable.
  struct Ready {
    const Toolchain* tc;
    fs::path dir;
    std::vector<std::string> flags;
    std::string cpu;
  };
  Ready prepare(const CompileOptions& options) {
    std::lock_guard<std::mutex> g(mu_);
    ensure_toolchain_locked();
    if (!tc_.available) throw CompilerUnavailable(tc_.reason);
    if (!dir_error_.empty()) throw CompilerUnavailable(dir_error_);
    const Probed& p = probe_locked(options);
    if (!p.ok) throw CompilerUnavailable(p.error);
    std::string cpu;
    if (depends_on_host_cpu(p.flags)) {
      if (cpu_id_.empty()) cpu_id_ = host_cpu_identity();
      cpu = cpu_id_;
    }
    return {&tc_, dir_, p.flags, cpu};
  }

  CompilerInfo info(const CompileOptions& options) {
    CompilerInfo ci;
    std::lock_guard<std::mutex> g(mu_);
    ensure_toolchain_locked();
    ci.path = tc_.path;
    ci.identity = tc_.identity;
    ci.cache_dir = dir_.string();
    if (!tc_.available || !dir_error_.empty()) {
      ci.reason = !tc_.available ? tc_.reason : dir_error_;
      return ci;
    }
    const Probed& p = probe_locked(options);
    ci.available = p.ok;
    ci.reason = p.error;
    ci.flags = p.flags;
    for (const auto& f : p.flags) {
      ci.openmp |= f == "-fopenmp";
      ci.march_native |= f == "-march=native";
      ci.vector_math |= f == "-lmvec";
    }
    return ci;
  }

  std::shared_ptr<CompiledLibrary> lookup(const std::string& key) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = libs_.find(key);
    if (it == libs_.end()) return nullptr;
    std::shared_ptr<CompiledLibrary> lib = it->second.lock();
    if (!lib) {
      libs_.erase(it);
      return nullptr;
    }
    ++stats_.memory_hits;
    return lib;
  }

  // Keeps the first library stored under `key` (another thread may have raced us to it).
  std::shared_ptr<CompiledLibrary> insert(const std::string& key,
                                          std::shared_ptr<CompiledLibrary> lib, bool compiled,
                                          double ms) {
    std::lock_guard<std::mutex> g(mu_);
    if (compiled) {
      ++stats_.compiles;
      stats_.compile_ms += ms;
    } else {
      ++stats_.disk_hits;
      stats_.disk_load_ms += ms;
    }
    auto it = libs_.find(key);
    if (it != libs_.end())
      if (auto alive = it->second.lock()) return alive;
    libs_[key] = lib;
    return lib;
  }

  CacheStats stats() {
    std::lock_guard<std::mutex> g(mu_);
    return stats_;
  }

private:
  void ensure_toolchain_locked() {
    if (have_toolchain_) return;
    tc_ = find_toolchain(search_);
    dir_ = runtime::default_cache_root() / "cpu";
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec || ::access(dir_.c_str(), W_OK) != 0)
      dir_error_ = "cannot write the CPU kernel cache folder " + dir_.string() + ": " +
                   (ec ? ec.message() : std::strerror(errno)) +
                   " (set KERAUNOS_CACHE_DIR to a writable folder)";
    have_toolchain_ = true;
  }

  // Which optional flags this compiler accepts, once per requested flag set; a positive answer
  // is also kept on disk, so a later process skips the probe compiles (~100 ms each).
  const Probed& probe_locked(const CompileOptions& o) {
    std::vector<std::string> request = o.flags;
    request.push_back("\x1f"); // separates the three lists in the map key
    request.insert(request.end(), o.optional_flags.begin(), o.optional_flags.end());
    request.push_back("\x1f");
    request.insert(request.end(), o.extra_flags.begin(), o.extra_flags.end());
    auto it = probes_.find(request);
    if (it != probes_.end()) return it->second;

    runtime::CacheKey h;
    h.add("keraunos-cpu-probe-v3").add(tc_.key_path()).add(tc_.identity);
    for (const auto& f : request) h.add(f);
    fs::path record = dir_ / ("toolchain-" + h.hex().substr(0, 32) + ".txt");
    Probed p;
    if (auto text = runtime::read_file(record); text && text->rfind("ok\n", 0) == 0) {
      p.ok = true;
      p.flags = options::split_words(text->substr(3));
      return probes_.emplace(request, std::move(p)).first->second;
    }

    auto is_optional = [&](const std::string& f) {
      for (const auto& x : o.optional_flags)
        if (x == f) return true;
      return false;
    };
    auto with = [&](const std::vector<std::string>& keep_optional) {
      std::vector<std::string> v;
      for (const auto& f : o.flags) {
        if (!is_optional(f)) {
          v.push_back(f);
          continue;
        }
        for (const auto& k : keep_optional)
          if (k == f) v.push_back(f);
      }
      v.insert(v.end(), o.extra_flags.begin(), o.extra_flags.end());
      return v;
    };
    std::vector<std::string> all_optional;
    for (const auto& f : o.flags)
      if (is_optional(f)) all_optional.push_back(f);

    std::string why;
    if (probe_compile(with(all_optional), &why)) {
      p.flags = with(all_optional);
    } else {
      // Keep each optional flag that works on its own.
      std::vector<std::string> kept;
      for (const auto& f : all_optional)
        if (probe_compile(with({f}), nullptr)) kept.push_back(f);
      if (kept.size() == all_optional.size() || !probe_compile(with(kept), &why)) {
        p.error = "the C++ compiler " + tc_.path + " (" + tc_.identity +
                  ") cannot build a kernel library with `" + join(with(kept)) + "`:\n" + why;
        return probes_.emplace(request, std::move(p)).first->second;
      }
      p.flags = with(kept);
    }
    // glibc's vector math, where the compiler links and loads it and its sin is right (before
    // the user's extra flags, which stay last).
    std::vector<std::string> mvec = p.flags;
    mvec.insert(mvec.end() - static_cast<std::ptrdiff_t>(o.extra_flags.size()), kMvecFlags.begin(),
                kMvecFlags.end());
    if (probe_compile(mvec, nullptr, kMvecProbeSource, true)) p.flags = std::move(mvec);
    p.ok = true;
    runtime::write_file_atomic(record, "ok\n" + join(p.flags, "\n") + "\n"); // best effort
    return probes_.emplace(request, std::move(p)).first->second;
  }

  // Compiles and loads the probe with these flags (and, with `call`, checks that its
  // keraunos_probe(0) returns 0); all temporaries removed.
  bool probe_compile(const std::vector<std::string>& flags, std::string* why,
                     const char* source = kProbeSource, bool call = false) {
    fs::path base = runtime::temp_path_beside(dir_ / "probe");
    fs::path src = base.string() + ".cpp", so = base.string() + ".so";
    bool ok = runtime::write_file_atomic(src, source);
    if (ok) {
      std::vector<std::string> argv{tc_.path};
      argv.insert(argv.end(), tc_.launcher_args.begin(), tc_.launcher_args.end());
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.insert(argv.end(), {"-o", so.string(), src.string()});
      ProcessResult r = run_process(argv);
      ok = r.started && r.exit_code == 0;
      if (!ok && why) *why = r.output;
      if (ok) {
        // Linking is not enough: libgomp must also be found at load time.
        void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
        void* fn = h ? dlsym(h, "keraunos_probe") : nullptr;
        ok = fn && (!call || reinterpret_cast<int (*)(int)>(fn)(0) == 0);
        if (!ok && why) *why = std::string("dlopen: ") + (h ? "no symbol" : dlerror());
        if (h) dlclose(h);
      }
    } else if (why) {
      *why = "cannot write " + src.string();
    }
    ::unlink(src.c_str());
    ::unlink(so.c_str());
    return ok;
  }

  std::mutex mu_;
  std::optional<std::string> search_;
  CompileOptions defaults_;
  bool have_toolchain_ = false;
  Toolchain tc_;
  fs::path dir_;
  std::string dir_error_;
  std::map<std::vector<std::string>, Probed> probes_;
  std::string cpu_id_;
  // Weak: a library is unloaded when the last kernel using it is gone (a long-running process
  // that compiles many programs would otherwise run out of mappings), and loaded again from
  // disk if it is needed later.
  std::unordered_map<std::string, std::weak_ptr<CompiledLibrary>> libs_;
  CacheStats stats_;
};

// The process's runtime: the documented kernel cache (DESIGN §1.5). Heap-allocated and never
// destroyed (its libraries are unloaded by their last user; see pin_openmp_runtime).
// Created on first use, so the environment is read then (tests set it before).
std::mutex g_runtime_mu;
std::shared_ptr<Runtime>* g_runtime = new std::shared_ptr<Runtime>();
std::optional<std::string> g_search_override; // tests only (reset_cpu_runtime_for_testing)

std::shared_ptr<Runtime> runtime() {
  std::lock_guard<std::mutex> g(g_runtime_mu);
  if (!*g_runtime) *g_runtime = std::make_shared<Runtime>(g_search_override);
  return *g_runtime;
}

// Kernel libraries are unloaded when no kernel uses them any more, but the OpenMP runtime they
// pull in must stay: its worker threads stay parked in its code after a parallel region, so
// unloading it with the last kernel library (a process that never imported torch, or one whose
// torch uses another runtime) would pull the code out from under them. Marks whichever runtime
// is loaded as never-to-be-unloaded (RTLD_NOLOAD: only if it is already there).
void pin_openmp_runtime() {
  static std::atomic<bool> pinned{false};
  if (pinned.load(std::memory_order_relaxed)) return;
  for (const char* name : {"libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) {
      dlclose(h); // drops the reference just taken; NODELETE keeps the runtime mapped
      pinned = true;
    }
  }
}

// Every library the cache stores is compiled from its source plus this stamp, and is loaded
// only if the stamp it exports names the key it was looked up by. The .meta checksum only
// shows that the .so is the file its writer meant to store; the stamp shows that it was built
// for this key. Without it a `<key>.so` built from other code (another keraunos build or
// version writing the shared ~/.cache/keraunos with another key scheme, a copied or restored
// cache folder) is run as if it were ours, and so is a library that dlopen hands back for the
// path (glibc returns an object already loaded under the same name or inode, not the file now
// there).
constexpr const char* kKeySymbol = "keraunos_cache_key";

std::string stamped_source(const std::string& source, const std::string& key) {
  return source + "\n// keraunos CPU kernel cache stamp\nextern \"C\" __attribute__((visibility(" +
         "\"default\"), used)) const char " + kKeySymbol + "[] = \"" + key + "\";\n";
}

bool has_stamp(void* h, const std::string& key) {
  dlerror();
  const char* stamp = static_cast<const char*>(dlsym(h, kKeySymbol));
  return stamp && key == stamp;
}

// Loads `so` if it carries the stamp of `key`; nullptr (and why, in `error`) otherwise.
void* open_library(const fs::path& so, const std::string& key, std::string* error) {
  void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    if (error) *error = dlerror();
    return nullptr;
  }
  if (!has_stamp(h, key)) {
    if (error) *error = "the library does not carry the cache stamp of key " + key;
    dlclose(h);
    return nullptr;
  }
  pin_openmp_runtime();
  return h;
}

} // namespace

CompileOptions CompileOptions::from_env() {
  CompileOptions o;
  o.extra_flags = options::words("cxxflags");
  return o;
}

CompiledLibrary::CompiledLibrary(void* handle, std::string key, std::string path)
    : handle_(handle), key_(std::move(key)), path_(std::move(path)) {}

CompiledLibrary::~CompiledLibrary() {
  if (handle_) dlclose(handle_);
}

void* CompiledLibrary::symbol(const std::string& name) const {
  dlerror();
  void* p = dlsym(handle_, name.c_str());
  KR_INTERNAL(p != nullptr, "symbol '", name, "' not found in the compiled kernel library ",
              path_);
  return p;
}

std::shared_ptr<CompiledLibrary> compile_and_load(const std::string& source,
                                                  const CompileOptions& options) {
  auto rt = runtime();
  auto ready = rt->prepare(options);
  const Toolchain& tc = *ready.tc;
  std::string key =
      runtime::cpu_cache_key({source, tc.key_path(), tc.identity, ready.flags, ready.cpu});
  if (auto lib = rt->lookup(key)) return lib;

  // The one kernel cache's layout (runtime/kernel_cache.h): <key>.so and its .meta, with the
  // source beside them as <key>.cpp.
  runtime::ArtifactCache cache(ready.dir, ".so");
  const fs::path so = cache.path_for(key), cpp = ready.dir / (key + ".cpp");
  auto t0 = Clock::now();
  // A corrupt or truncated entry fails the check and is replaced below by renaming a fresh
  // one over it; it is never unlinked first, which could race with another process's rename.
  if (cache.valid_on_disk(key)) {
    if (void* h = open_library(so, key, nullptr)) {
      auto lib = std::make_shared<CompiledLibrary>(h, key, so.string());
      return rt->insert(key, std::move(lib), false, ms_since(t0));
    }
  }

  t0 = Clock::now();
  KR_INTERNAL(runtime::write_file_atomic(cpp, stamped_source(source, key)),
              "cannot write the kernel source to ", cpp.string());
  fs::path tmp_so = runtime::temp_path_beside(so);
  std::vector<std::string> argv{tc.path};
  argv.insert(argv.end(), tc.launcher_args.begin(), tc.launcher_args.end());
  argv.insert(argv.end(), ready.flags.begin(), ready.flags.end());
  argv.insert(argv.end(), {"-o", tmp_so.string(), cpp.string()});
  ProcessResult r = run_process(argv);
  if (!r.started || r.exit_code != 0) {
    ::unlink(tmp_so.c_str());
    KR_INTERNAL(false, "the C++ compiler failed on a generated kernel (exit code ", r.exit_code,
                ")\n  source: ", cpp.string(), "\n  command: ", join(argv), "\n",
                r.output);
  }
  KR_INTERNAL(cache.install(key, tmp_so), "cannot store the compiled kernel in ", so.string());
  double ms = ms_since(t0);
  std::string error;
  void* h = open_library(so, key, &error);
  KR_INTERNAL(h != nullptr, "cannot load the freshly compiled kernel library ", so.string(), ": ",
              error);
  return rt->insert(key, std::make_shared<CompiledLibrary>(h, key, so.string()), true, ms);
}

std::shared_ptr<CompiledLibrary> compile_and_load(const std::string& source) {
  auto rt = runtime();
  return compile_and_load(source, rt->defaults());
}

CompilerInfo cpu_compiler_info(const CompileOptions& options) {
  return runtime()->info(options);
}

CompilerInfo cpu_compiler_info() {
  auto rt = runtime();
  return rt->info(rt->defaults());
}

CacheStats cpu_cache_stats() { return runtime()->stats(); }

void reset_cpu_runtime_for_testing(std::optional<std::string> search_path) {
  std::shared_ptr<Runtime> old; // released after the lock: it may dlclose libraries
  std::lock_guard<std::mutex> g(g_runtime_mu);
  g_search_override = std::move(search_path);
  old = std::move(*g_runtime);
}

} // namespace keraunos::cpu

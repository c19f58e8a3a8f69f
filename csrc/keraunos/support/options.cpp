#include "keraunos/support/options.h"

#include "keraunos/ir/error.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

namespace keraunos::options {

namespace {

constexpr Option kOptions[] = {
    {"fusion", "KERAUNOS_FUSION", Kind::Flag, "1", "fusion",
     "Generate kernels for fusion regions; off runs every region through torch."},
    {"fusion_type", nullptr, Kind::Text, "dataflow", "fusion_type",
     "How fusion regions form: 'consecutive' fuses runs of adjacent fusible ops in program "
     "order; 'dataflow' merges any fusible neighbours whose merge creates no cycle."},
    {"verify", "KERAUNOS_VERIFY", Kind::Flag, "0", nullptr,
     "Check the trace invariants (DESIGN.md section 2) after every pass; read at each compile."},
    {"dump", "KERAUNOS_DUMP", Kind::Text, "", nullptr,
     "What to print at each compilation (comma-separated): 'traces' prints every stage "
     "(acquisition, each pass, the program) to stdout; 'kernels' prints every generated kernel "
     "after lowering and after each kernel pass (codegen/kernel_passes.h); read at each "
     "compile."},
    {"cache_dir", "KERAUNOS_CACHE_DIR", Kind::Text, "~/.cache/keraunos", nullptr,
     "The on-disk kernel cache (runtime/kernel_cache.h: CPU libraries in cpu/, CUDA binaries in "
     "cuda/, each with its .meta); read when the cache is first used."},
    {"cxx", "CXX", Kind::Words, "c++, g++ or clang++ on $PATH", nullptr,
     "The C++ compiler of CPU kernels (a command, possibly with launcher words); read when the "
     "compiler is first needed."},
    {"cxxflags", "KERAUNOS_CXXFLAGS", Kind::Words, "", nullptr,
     "Extra flags for the C++ compiler of CPU kernels (part of the cache key); read when the "
     "compiler is first needed."},
    {"hugepages", "KERAUNOS_HUGEPAGES", Kind::Flag, "1", nullptr,
     "Advise fresh CPU kernel outputs of 4 MiB or more as transparent huge pages; read once "
     "per process."},
    {"cpu_pool", "KERAUNOS_CPU_POOL", Kind::Flag, "1", nullptr,
     "Keep the memory of CPU kernel outputs and matmul results of 64 KiB or more for reuse "
     "once every tensor on it has died (at most 1 GiB; keraunos.empty_cpu_pool() releases "
     "it): no page faults for memory the process had already. Read at each allocation."},
    {"nvrtc_library", "KERAUNOS_NVRTC_LIBRARY", Kind::Text, "", nullptr,
     "The NVRTC library to load (a path); otherwise the nvidia-cuda-nvrtc wheel's, "
     "$CUDA_HOME/lib64's or the loader's libnvrtc. Read when NVRTC is first loaded."},
    {"cuda_tune", "KERAUNOS_CUDA_TUNE", Kind::Tuning, "", nullptr,
     "CUDA schedule parameters for experiments, 'key=value,...' (keys: "
     "keraunos.options()['cuda_tune']['keys']); read when a device's parameters are queried."},
    {"kernel_random", "KERAUNOS_KERNEL_RANDOM", Kind::Flag, "1", nullptr,
     "Random draws (torch.rand, randn, dropout, ...) computed by the kernels they fuse into, "
     "with a counter-based generator (Philox4x32-10) seeded from torch's generator: "
     "reproducible under torch.manual_seed but not eager's numbers; off, they come from torch "
     "(eager's numbers, one more pass over memory). Read at each compile."},
    {"check_cuda_codegen", "KERAUNOS_CHECK_CUDA_CODEGEN", Kind::Flag, "0", nullptr,
     "With CPU kernels, also generate and compile (NVRTC) the CUDA each kernel would get, as a "
     "check; read at each compile."},
};

constexpr int64_t kIntMax = 2147483647;

constexpr TuningKey kTuningKeys[] = {
    // The defaults and the measurements behind them: codegen/cuda_emitter.h, CudaDeviceInfo.
    {"cuda_tune", "block_threads", 32, 1024, true, true, false,
     "Block schedule: threads per row (0: by row length)."},
    {"cuda_tune", "block_min_blocks", 0, 32, false, false, false,
     "Block schedule, vector entry: __launch_bounds__'s blocks per SM (0: none)."},
    {"cuda_tune", "block_persist", 0, 1, false, false, true,
     "Block schedule: as many blocks as fit walk the rows, prefetching the next row."},
    {"cuda_tune", "cache_hints", 0, 7, false, false, false,
     "Block schedule cache hints (bits): 1 evict_first row loads, 2 evict_last loads of what "
     "every row reads, 4 streamed stores."},
    {"cuda_tune", "pointwise_vec", 1, 16, true, false, false,
     "Pointwise schedule: at most this many lanes per vector access."},
    {"cuda_tune", "cluster_hoist_kb", 0, 227, false, false, false,
     "Persistent clusters: KiB of shared memory per block for row-invariant operands."},
    {"cuda_tune", "cluster_merge_variance", 0, 1, false, false, true,
     "Cluster all-reduces: a variance's sum and squared deviations in one round."},
    {"cuda_tune", "cluster_merge_softmax", 0, 1, false, false, true,
     "Cluster all-reduces: softmax's max and sum of exp(x - max) in one round."},
    {"cuda_tune", "cluster_threads", 32, 1024, true, false, false,
     "Cluster schedule: threads per block."},
    {"cuda_tune", "max_cluster", 1, 16, true, false, false,
     "Cluster schedule: blocks per cluster (over 8 is a non-portable size)."},
    {"cuda_tune", "cluster_reg_values", 0, 64, false, false, false,
     "Cluster schedule: values per thread cached in registers."},
    {"cuda_tune", "cluster_smem_bytes", -1, kIntMax, false, false, false,
     "Cluster schedule: shared memory a block may cache its part of a row in (-1: all)."},
    {"cuda_tune", "cluster_persist", -1, kIntMax, false, false, false,
     "Persistent clusters: -1 as many as fit on the device, 0 one per row, n at most n."},
    {"cuda_tune", "cluster_prefetch", 0, 1, false, false, true,
     "Rows cached in shared memory are filled with cp.async, the next row's copies issued "
     "early (0: plain loads)."},
    {"cuda_tune", "cluster_async_reduce", 0, 1, false, false, true,
     "Cluster all-reduces through st.async and an mbarrier (0: a block all-reduce, then a "
     "cluster barrier)."},
    {"cuda_tune", "column_cluster", 1, 16, true, false, false,
     "Column schedule: at most this many blocks of a cluster split the rows of the same 32 "
     "columns when there are too few columns to fill the device (1: a block per 32 columns)."},
    {"cuda_tune", "reuse_values", 0, 1, false, false, true,
     "Row schedules: an expensive value a later loop computes again (softmax's exp(x - max)) "
     "is kept in registers (0: recomputed)."},
};

const Option& find(std::string_view name) {
  for (const Option& o : kOptions)
    if (name == o.name) return o;
  std::string known;
  for (const Option& o : kOptions) known += std::string(known.empty() ? "" : ", ") + o.name;
  KR_USER_ERROR(Value, "keraunos: unknown option '", name, "' (options: ", known, ")");
}

struct Overrides {
  std::mutex mu;
  std::map<std::string, std::optional<std::string>, std::less<>> values;
};
Overrides& overrides() {
  static Overrides o;
  return o;
}

std::string where(const Option& o) {
  return o.env ? std::string(o.env) : std::string("option ") + o.name;
}

std::optional<bool> parse_flag(std::string_view v) {
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s.empty() || s == "0" || s == "false" || s == "off" || s == "no") return false;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  return std::nullopt;
}

} // namespace

std::span<const Option> all() { return kOptions; }
std::span<const TuningKey> tuning_keys() { return kTuningKeys; }

std::optional<std::string> get(std::string_view name) {
  const Option& o = find(name);
  {
    Overrides& ov = overrides();
    std::lock_guard lock(ov.mu);
    if (auto it = ov.values.find(name); it != ov.values.end()) return it->second;
  }
  if (!o.env) return std::nullopt;
  const char* v = std::getenv(o.env);
  if (!v || (!*v && o.kind != Kind::Flag)) return std::nullopt;
  return std::string(v);
}

std::optional<std::string> override_of(std::string_view name) {
  find(name);
  Overrides& ov = overrides();
  std::lock_guard lock(ov.mu);
  if (auto it = ov.values.find(name); it != ov.values.end()) return it->second;
  return std::nullopt;
}

std::string text(std::string_view name) {
  auto v = get(name);
  return v ? *v : std::string(find(name).fallback);
}

bool flag(std::string_view name) {
  const Option& o = find(name);
  KR_INTERNAL(o.kind == Kind::Flag, "options: ", name, " is not a flag");
  auto v = get(name);
  if (!v) return *parse_flag(o.fallback);
  // Any other text turns a flag on, as a set environment variable is read by convention.
  return parse_flag(*v).value_or(true);
}

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  std::string w;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n') {
      if (!w.empty()) out.push_back(std::move(w));
      w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) out.push_back(std::move(w));
  return out;
}

std::vector<std::string> words(std::string_view name) {
  auto v = get(name);
  return v ? split_words(*v) : std::vector<std::string>{};
}

std::vector<std::pair<std::string, int64_t>> tuning(std::string_view name,
                                                    std::optional<std::string> spec) {
  const Option& o = find(name);
  KR_INTERNAL(o.kind == Kind::Tuning, "options: ", name, " is not a tuning option");
  if (!spec) spec = get(name);
  std::vector<std::pair<std::string, int64_t>> out;
  if (!spec) return out;
  const std::string w = where(o);
  std::istringstream items(*spec);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    KR_CHECK(eq != std::string::npos, Value, w, ": '", item, "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    const TuningKey* k = nullptr;
    for (const TuningKey& t : kTuningKeys)
      if (name == t.option && key == t.name) k = &t;
    if (!k) {
      std::string known;
      for (const TuningKey& t : kTuningKeys)
        if (name == t.option) known += std::string(known.empty() ? "" : ", ") + t.name;
      KR_USER_ERROR(Value, w, ": unknown key '", key, "' (", known, ")");
    }
    int64_t v = 0;
    try {
      size_t used = 0;
      v = std::stoll(value, &used);
      KR_CHECK(used == value.size(), Value, w, ": '", item, "' is not a number");
    } catch (const std::logic_error&) {
      KR_USER_ERROR(Value, w, ": '", item, "' is not a number");
    }
    if (k->is_switch) v = v != 0;
    bool ok = v >= k->lo && v <= k->hi && (!k->pow2 || (v & (v - 1)) == 0);
    ok = ok || (k->zero_ok && v == 0);
    KR_CHECK(ok, Value, w, ": ", key, " must be ", k->pow2 ? "a power of two in " : "in ", k->lo,
             "..", k->hi, k->zero_ok ? " or 0" : "", ", not ", value);
    out.emplace_back(key, v);
  }
  return out;
}

void set(std::string_view name, std::optional<std::string> value) {
  const Option& o = find(name);
  if (value) {
    if (o.kind == Kind::Flag)
      KR_CHECK(parse_flag(*value), Value, "keraunos: option ", name,
               " is on or off (1/0, true/false, on/off, yes/no), not '", *value, "'");
    if (o.kind == Kind::Tuning) tuning(name, *value); // refuses a bad spec now
  }
  Overrides& ov = overrides();
  std::lock_guard lock(ov.mu);
  if (value)
    ov.values[std::string(name)] = std::move(value);
  else
    ov.values.erase(std::string(name));
}

} // namespace keraunos::options

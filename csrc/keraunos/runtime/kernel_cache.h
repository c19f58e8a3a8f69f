// A cache of compiled artifacts (CUBINs now; the CPU compiler's shared objects later): a key
// string -> bytes, an in-memory map in front of a directory on disk.
//
// On-disk layout, shared by every kind of artifact:
//   <root>/<kind>/<key><suffix>     e.g. ~/.cache/keraunos/cuda/3f9a...e1.cubin
// where <root> is $KERAUNOS_CACHE_DIR, else ~/.cache/keraunos (the CPU cache's root too),
// and <key> is a hex digest (CacheKey). Each file is a 32-byte header and the payload:
//   magic "KRNCACHE" | u32 format version | u32 reserved (0) | u64 payload length |
//   u64 FNV-1a checksum of the payload        (integers little-endian)
// A file whose header, length or checksum does not match (a crash mid-write on a filesystem
// that reorders, a truncated copy, a disk error) is treated as a miss, counted, removed, and
// rebuilt by the caller.
//
// Writes go to a temporary file in the same directory, then rename(2) over the final name, so
// concurrent processes see either no file or a complete one; two that build the same key
// write the same bytes, and the last rename wins. No fsync: the checksum catches what a power
// loss can leave behind, and an fsync per kernel would cost more than most compiles.
//
// The disk is best effort: a cache directory that cannot be created or written only costs
// recompiles (counted in Stats::write_failures), never an error.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace keraunos::runtime {

// Builds a cache key from parts: a SHA-256 over each part prefixed by its length (so
// {"ab","c"} and {"a","bc"} differ), as 64 hex characters. Stable across builds and machines.
class CacheKey {
public:
  CacheKey& add(std::string_view part);
  CacheKey& add(std::int64_t value);
  std::string hex() const;

private:
  std::string material_;
};

std::string sha256_hex(std::string_view data);

// $KERAUNOS_CACHE_DIR, else $HOME/.cache/keraunos (as runtime/cpu_cache does: one root for
// every backend); empty when neither is set (the cache then stays in memory).
std::filesystem::path default_cache_root();

class ArtifactCache {
public:
  struct Stats {
    std::int64_t memory_hits = 0;
    std::int64_t disk_hits = 0;
    std::int64_t misses = 0;         // neither in memory nor (valid) on disk
    std::int64_t corrupt_files = 0;  // found on disk but rejected (and removed)
    std::int64_t write_failures = 0; // artifacts that could not be written to disk
  };

  // Artifacts live in `dir` (created on first write); an empty `dir` keeps them in memory only.
  ArtifactCache(std::filesystem::path dir, std::string suffix);

  // The artifact for `key`: from memory, else from disk (then kept in memory), else built by
  // `build`, stored in memory and on disk. `build` runs without any lock held: two threads
  // missing the same key may both build it (the results are equal), and an exception from
  // `build` propagates and caches nothing.
  std::string get_or_build(const std::string& key, const std::function<std::string()>& build);

  std::optional<std::string> lookup(const std::string& key);
  void store(const std::string& key, const std::string& bytes);

  // Forgets the in-memory copies (the disk is untouched): the next lookup reads the disk.
  void clear_memory();
  Stats stats() const;
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path path_for(const std::string& key) const;

  // The file format, exposed for tests and for tools that inspect the cache.
  static std::string encode(std::string_view payload);
  static std::optional<std::string> decode(std::string_view file_bytes);

private:
  std::optional<std::string> read_disk(const std::string& key);
  bool write_disk(const std::string& key, const std::string& bytes);

  const std::filesystem::path dir_;
  const std::string suffix_;
  mutable std::mutex mu_; // guards memory_ and stats_
  std::unordered_map<std::string, std::string> memory_;
  Stats stats_;
};

// The process's cache of CUBINs, in default_cache_root()/cuda, resolved on first use. A
// documented global (STYLE §3 allows caches): compiled kernels are valid for the whole process.
ArtifactCache& cuda_kernel_cache();

} // namespace keraunos::runtime

// The on-disk kernel cache: one for every kind of artifact (CPU kernel libraries, CUDA binaries),
// with one key hash, one layout, one file format and one writer; an in-memory map in front.
//
// Layout:
//   <root>/<kind>/<key><suffix>   the artifact itself, byte for byte (a .so must stay loadable
//                                 by dlopen; e.g. ~/.cache/keraunos/cpu/<key>.so,
//                                 ~/.cache/keraunos/cuda/<key>.cubin)
//   <root>/<kind>/<key>.meta      its size and FNV-1a 64 checksum (CacheMeta)
// where <root> is $KERAUNOS_CACHE_DIR, else ~/.cache/keraunos, else <tmp>/keraunos-<uid>, and
// <key> is the SHA-256 of the artifact's inputs (CacheKey). Kinds may keep companions beside an
// entry (the CPU cache keeps <key>.cpp, the source, and toolchain-<hash>.txt probes).
//
// An entry is valid when its .meta parses and the artifact matches it in size and checksum; a
// truncated, damaged or half-written entry is a miss (counted), rebuilt by the caller and
// replaced by rename. Every file is written under a temporary name in the same folder and
// renamed into place, the .meta before the artifact, so concurrent processes see either a
// complete entry or an invalid one, never a torn file; two that build the same key write the
// same bytes and the last rename wins. No fsync: the checksum catches what a power loss can
// leave behind. Nothing is unlinked before a rebuild (that could race with another process's
// rename). For CUBINs the disk is best effort: a folder that cannot be written only costs
// recompiles (Stats::write_failures); a CPU library must be loaded from a file, so there it is
// an error that names the folder.
//
// SHA-256 for keys: the file name is the key, so a collision would silently load the wrong
// kernel. FNV-1a 64 (http://www.isthe.com/chongo/tech/comp/fnv/) for checksums. Both are
// byte-order independent and never change between releases; the cache folder is trusted like
// the compiler itself.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace keraunos::runtime {

// FNV-1a 64, streaming.
class Fnv1a64 {
public:
  Fnv1a64& update(std::string_view bytes);
  uint64_t digest() const { return h_; }

private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};
uint64_t fnv1a64(std::string_view bytes);

std::string sha256_hex(std::string_view data);

// Builds a cache key from parts: a SHA-256 over each part prefixed by its length (8 bytes,
// little-endian), so {"ab","c"} and {"a","bc"} differ; 64 lowercase hex digits.
class CacheKey {
public:
  CacheKey& add(std::string_view part);
  CacheKey& add(std::int64_t value);
  std::string hex() const;

private:
  std::string material_;
};

// What a compiled CPU kernel library depends on. `cpu` identifies the host CPU when
// -march=native is in effect (a cache folder shared between machines must not hand one CPU's
// code to another).
struct CpuKeyInputs {
  std::string source;
  std::string compiler_path;
  std::string compiler_identity; // first line of `<cxx> --version`
  std::vector<std::string> flags; // the flags actually passed, in order
  std::string cpu;
};
// CacheKey over "keraunos-cpu-cache-v2", compiler_path, compiler_identity, the number of flags,
// each flag, cpu, source. Bump the version when the kernel ABI changes.
std::string cpu_cache_key(const CpuKeyInputs& in);

// The sidecar `<key>.meta`.
struct CacheMeta {
  uint64_t size = 0;
  uint64_t checksum = 0; // fnv1a64 of the artifact's bytes
  std::string str() const;
  static std::optional<CacheMeta> parse(std::string_view text);
};
CacheMeta meta_of(std::string_view bytes);

// $KERAUNOS_CACHE_DIR, else $HOME/.cache/keraunos, else <tmp>/keraunos-<uid> (created 0700; a
// folder of that name that another user owns or may write is refused: a path that cannot be
// created is returned instead).
std::filesystem::path default_cache_root();

// Whole-file I/O; nullopt when the file cannot be read.
std::optional<std::string> read_file(const std::filesystem::path& p);
// Writes `bytes` to a unique temporary file beside `p`, then renames it onto `p`. False (and
// nothing left behind) on failure.
bool write_file_atomic(const std::filesystem::path& p, std::string_view bytes);
// A fresh name beside `p` for this process and call: `<p>.tmp.<pid>.<n>`.
std::filesystem::path temp_path_beside(const std::filesystem::path& p);

class ArtifactCache {
public:
  struct Stats {
    std::int64_t memory_hits = 0;
    std::int64_t disk_hits = 0;
    std::int64_t misses = 0;         // neither in memory nor (valid) on disk
    std::int64_t corrupt_files = 0;  // found on disk but invalid (rebuilt)
    std::int64_t write_failures = 0; // artifacts that could not be written to disk
  };

  // Artifacts live in `dir` (created on first write) as `<key><suffix>`; an empty `dir` keeps
  // them in memory only.
  ArtifactCache(std::filesystem::path dir, std::string suffix);

  // The artifact for `key`: from memory, else from disk (then kept in memory), else built by
  // `build`, stored in memory and on disk. `build` runs without any lock held: two threads
  // missing the same key may both build it (the results are equal), and an exception from
  // `build` propagates and caches nothing.
  std::string get_or_build(const std::string& key, const std::function<std::string()>& build);

  std::optional<std::string> lookup(const std::string& key);
  void store(const std::string& key, const std::string& bytes);

  // For artifacts used as files (a library to dlopen), without the in-memory copy: whether the
  // entry on disk is valid, and installing a file built beside it (its .meta written, then the
  // file renamed onto the entry; false, with the file removed, on failure).
  bool valid_on_disk(const std::string& key);
  bool install(const std::string& key, const std::filesystem::path& built);

  // Forgets the in-memory copies (the disk is untouched): the next lookup reads the disk.
  void clear_memory();
  Stats stats() const;
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path path_for(const std::string& key) const;
  std::filesystem::path meta_path_for(const std::string& key) const;

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

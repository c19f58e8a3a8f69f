// The on-disk side of the CPU kernel cache: a stable hash, the cache key of a kernel, the file
// layout and the sidecar that lets a reader reject a truncated or corrupt shared object.
//
// Layout (one subfolder per backend, like the NVRTC cache beside it):
//   <KERAUNOS_CACHE_DIR or ~/.cache/keraunos>/cpu/<key>.so    the kernel library
//                                                 /<key>.cpp   its source + the key stamp
//                                                 /<key>.meta  size and checksum of the .so
//                                                 /toolchain-<hash>.txt  probed flags
// Every file is written under a temporary name in the same folder and renamed into place, so
// a reader sees either nothing or a complete file, even with several processes compiling the
// same kernel at once. The .so exports `keraunos_cache_key` (the key it was built for) and is
// loaded only under that key (cpu_compiler.cpp), so an entry built from other code is rebuilt.
//
// The hash is FNV-1a (http://www.isthe.com/chongo/tech/comp/fnv/): the 128-bit variant for
// keys (collisions between kernels would load the wrong code, so 64 bits felt thin for a cache
// that lives for years) and the 64-bit one for checksums. It is byte-order independent and
// never changes between releases, so keys stay valid across builds; it is not cryptographic —
// the cache folder is trusted like the compiler itself.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace keraunos::cpu {

// FNV-1a 64, streaming.
class Fnv1a64 {
public:
  Fnv1a64& update(std::string_view bytes);
  uint64_t digest() const { return h_; }

private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// FNV-1a 128, streaming; hex() is the 32-digit big-endian spelling of the number.
class Fnv1a128 {
public:
  Fnv1a128& update(std::string_view bytes);
  // A field: its length (8 bytes, little-endian) then its bytes, so ("ab", "c") and
  // ("a", "bc") hash differently.
  Fnv1a128& field(std::string_view bytes);
  unsigned __int128 digest() const { return h_; }
  std::string hex() const;

private:
  unsigned __int128 h_ = (static_cast<unsigned __int128>(0x6c62272e07bb0142ull) << 64) |
                         0x62b821756295c58dull;
};

uint64_t fnv1a64(std::string_view bytes);
std::string fnv1a128_hex(std::string_view bytes);

// What a compiled kernel depends on. `cpu` identifies the host CPU when -march=native is in
// effect (a cache folder shared between machines must not hand one CPU's code to another).
struct CacheKeyInputs {
  std::string source;
  std::string compiler_path;
  std::string compiler_identity; // first line of `<cxx> --version`
  std::vector<std::string> flags; // the flags actually passed, in order
  std::string cpu;
};

// 32 lowercase hex digits: FNV-1a 128 over these fields, each written as its length (8 bytes,
// little-endian) then its bytes: "keraunos-cpu-cache-v1", compiler_path, compiler_identity, the
// number of flags (decimal), each flag, cpu, source. Bump the version string when the layout or
// the kernel ABI changes.
std::string cache_key(const CacheKeyInputs& in);

// The sidecar `<key>.meta`.
struct CacheMeta {
  uint64_t size = 0;
  uint64_t checksum = 0; // fnv1a64 of the .so's bytes
  std::string str() const;
  static std::optional<CacheMeta> parse(std::string_view text);
};

// Files of one kernel inside the backend folder.
struct CacheEntryPaths {
  std::filesystem::path so, cpp, meta;
  static CacheEntryPaths of(const std::filesystem::path& dir, const std::string& key);
};

// KERAUNOS_CACHE_DIR, else $HOME/.cache/keraunos, else <tmp>/keraunos-<uid>; then "/cpu".
std::filesystem::path default_cpu_cache_dir();

// Whole-file I/O; nullopt when the file cannot be read.
std::optional<std::string> read_file(const std::filesystem::path& p);
// Writes `bytes` to a unique temporary file beside `p`, then renames it onto `p`. False (and
// nothing left behind) on failure.
bool write_file_atomic(const std::filesystem::path& p, std::string_view bytes);
// A fresh name beside `p` for this process and call: `<p>.tmp.<pid>.<n>`.
std::filesystem::path temp_path_beside(const std::filesystem::path& p);

// The meta of the bytes of a file.
CacheMeta meta_of(std::string_view bytes);
// True when `so` exists and matches `meta` in size and checksum.
bool verify_entry(const CacheEntryPaths& e);

} // namespace keraunos::cpu

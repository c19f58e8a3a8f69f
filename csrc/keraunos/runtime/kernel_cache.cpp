#include "keraunos/runtime/kernel_cache.h"

#include "keraunos/support/options.h"

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace keraunos::runtime {

namespace fs = std::filesystem;

// ---- hashing -------------------------------------------------------------------------------

namespace {

// SHA-256 (FIPS 180-4). A cryptographic hash for keys: the file name is the key, so a
// collision would silently load the wrong kernel; 64-bit hashes make that merely unlikely.
class Sha256 {
public:
  void update(std::string_view data) {
    for (unsigned char c : data) {
      block_[fill_++] = c;
      if (fill_ == 64) {
        compress();
        fill_ = 0;
      }
    }
    bits_ += static_cast<std::uint64_t>(data.size()) * 8;
  }

  std::array<std::uint8_t, 32> finish() {
    const std::uint64_t bits = bits_;
    block_[fill_++] = 0x80;
    if (fill_ > 56) {
      while (fill_ < 64) block_[fill_++] = 0;
      compress();
      fill_ = 0;
    }
    while (fill_ < 56) block_[fill_++] = 0;
    for (int i = 7; i >= 0; --i) block_[fill_++] = static_cast<std::uint8_t>(bits >> (8 * i));
    compress();
    std::array<std::uint8_t, 32> out{};
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<std::uint8_t>(h_[i] >> (24 - 8 * j));
    return out;
  }

private:
  static std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress() {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (std::uint32_t{block_[4 * i]} << 24) | (std::uint32_t{block_[4 * i + 1]} << 16) |
             (std::uint32_t{block_[4 * i + 2]} << 8) | std::uint32_t{block_[4 * i + 3]};
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
                  h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 =
          h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 =
          (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::uint8_t block_[64] = {};
  int fill_ = 0;
  std::uint64_t bits_ = 0;
};

constexpr uint64_t kFnv64Prime = 0x100000001b3ull;
constexpr std::string_view kCpuKeyVersion = "keraunos-cpu-cache-v2";
constexpr std::string_view kMetaMagic = "keraunos-cache-meta 1";

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

} // namespace

Fnv1a64& Fnv1a64::update(std::string_view bytes) {
  for (unsigned char c : bytes) {
    h_ ^= c;
    h_ *= kFnv64Prime;
  }
  return *this;
}

uint64_t fnv1a64(std::string_view bytes) { return Fnv1a64().update(bytes).digest(); }

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::uint8_t b : h.finish()) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}


CacheKey& CacheKey::add(std::string_view part) {
  put_u64(material_, part.size());
  material_.append(part);
  return *this;
}

CacheKey& CacheKey::add(std::int64_t value) { return add(std::to_string(value)); }

std::string CacheKey::hex() const { return sha256_hex(material_); }

std::string cpu_cache_key(const CpuKeyInputs& in) {
  CacheKey k;
  k.add(kCpuKeyVersion).add(in.compiler_path).add(in.compiler_identity);
  k.add(static_cast<std::int64_t>(in.flags.size()));
  for (const auto& f : in.flags) k.add(f);
  k.add(in.cpu).add(in.source);
  return k.hex();
}

std::string CacheMeta::str() const {
  std::ostringstream os;
  os << kMetaMagic << "\nsize " << size << "\nfnv1a64 " << hex64(checksum) << "\n";
  return os.str();
}

std::optional<CacheMeta> CacheMeta::parse(std::string_view text) {
  std::istringstream is{std::string(text)};
  std::string line;
  if (!std::getline(is, line) || line != kMetaMagic) return std::nullopt;
  CacheMeta m;
  bool have_size = false, have_sum = false;
  std::string word, value;
  while (is >> word >> value) {
    char* end = nullptr;
    if (word == "size") {
      m.size = std::strtoull(value.c_str(), &end, 10);
      have_size = end && *end == '\0' && !value.empty();
    } else if (word == "fnv1a64") {
      m.checksum = std::strtoull(value.c_str(), &end, 16);
      have_sum = end && *end == '\0' && value.size() == 16;
    }
  }
  if (!have_size || !have_sum) return std::nullopt;
  return m;
}

CacheMeta meta_of(std::string_view bytes) { return {bytes.size(), fnv1a64(bytes)}; }

fs::path default_cache_root() {
  if (auto d = options::get("cache_dir")) return fs::path(*d);
  if (const char* home = std::getenv("HOME"); home && *home)
    return fs::path(home) / ".cache" / "keraunos";
  // A shared temporary folder: ours only if we made it (or own it) and nobody else may write
  // in it; otherwise another user could plant kernels there.
  const char* tmp = std::getenv("TMPDIR");
  fs::path dir = fs::path(tmp && *tmp ? tmp : "/tmp") / ("keraunos-" + std::to_string(getuid()));
  ::mkdir(dir.c_str(), 0700);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
      (st.st_mode & 077) != 0)
    return fs::path("/nonexistent/keraunos-cache-refused"); // unwritable: memory only / error
  return dir;
}

std::optional<std::string> read_file(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  struct stat st {};
  if (fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::filesystem::path temp_path_beside(const std::filesystem::path& p) {
  // Unique within the process (the counter) and across processes (the pid); the only mutable
  // global here, and it is an atomic counter.
  static std::atomic<uint64_t> counter{0};
  return p.string() + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

bool write_file_atomic(const std::filesystem::path& p, std::string_view bytes) {
  auto tmp = temp_path_beside(p);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bool ok = done == bytes.size();
  ok = (::close(fd) == 0) && ok;
  if (ok) ok = std::rename(tmp.c_str(), p.c_str()) == 0;
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

// ---- the cache ------------------------------------------------------------------------------

ArtifactCache::ArtifactCache(fs::path dir, std::string suffix)
    : dir_(std::move(dir)), suffix_(std::move(suffix)) {}

fs::path ArtifactCache::path_for(const std::string& key) const { return dir_ / (key + suffix_); }
fs::path ArtifactCache::meta_path_for(const std::string& key) const {
  return dir_ / (key + ".meta");
}

std::optional<std::string> ArtifactCache::read_disk(const std::string& key) {
  if (dir_.empty()) return std::nullopt;
  auto meta_text = read_file(meta_path_for(key));
  std::optional<CacheMeta> meta = meta_text ? CacheMeta::parse(*meta_text) : std::nullopt;
  if (!meta) {
    if (meta_text) {
      std::lock_guard lock(mu_);
      ++stats_.corrupt_files;
    }
    return std::nullopt;
  }
  // The size first: a truncated artifact is rejected without reading it.
  const fs::path path = path_for(key);
  struct stat st {};
  std::optional<std::string> bytes;
  if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == meta->size)
    bytes = read_file(path);
  if (!bytes || bytes->size() != meta->size || fnv1a64(*bytes) != meta->checksum) {
    std::lock_guard lock(mu_);
    ++stats_.corrupt_files;
    return std::nullopt;
  }
  return bytes;
}

bool ArtifactCache::write_disk(const std::string& key, const std::string& bytes) {
  if (dir_.empty()) return false;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return false;
  return write_file_atomic(meta_path_for(key), meta_of(bytes).str()) &&
         write_file_atomic(path_for(key), bytes);
}

bool ArtifactCache::valid_on_disk(const std::string& key) { return read_disk(key).has_value(); }

bool ArtifactCache::install(const std::string& key, const fs::path& built) {
  auto bytes = read_file(built);
  bool ok = bytes && write_file_atomic(meta_path_for(key), meta_of(*bytes).str()) &&
            std::rename(built.c_str(), path_for(key).c_str()) == 0;
  if (!ok) {
    ::unlink(built.c_str());
    std::lock_guard lock(mu_);
    ++stats_.write_failures;
  }
  return ok;
}

std::optional<std::string> ArtifactCache::lookup(const std::string& key) {
  {
    std::lock_guard lock(mu_);
    if (auto it = memory_.find(key); it != memory_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
  }
  std::optional<std::string> bytes = read_disk(key);
  std::lock_guard lock(mu_);
  if (!bytes) {
    ++stats_.misses;
    return std::nullopt;
  }
  ++stats_.disk_hits;
  memory_.emplace(key, *bytes);
  return bytes;
}

void ArtifactCache::store(const std::string& key, const std::string& bytes) {
  const bool written = write_disk(key, bytes);
  std::lock_guard lock(mu_);
  if (!written && !dir_.empty()) ++stats_.write_failures;
  memory_.insert_or_assign(key, bytes);
}

std::string ArtifactCache::get_or_build(const std::string& key,
                                        const std::function<std::string()>& build) {
  if (std::optional<std::string> hit = lookup(key)) return std::move(*hit);
  std::string bytes = build();
  store(key, bytes);
  return bytes;
}

void ArtifactCache::clear_memory() {
  std::lock_guard lock(mu_);
  memory_.clear();
}

ArtifactCache::Stats ArtifactCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

ArtifactCache& cuda_kernel_cache() {
  static ArtifactCache cache(default_cache_root() / "cuda", ".cubin");
  return cache;
}

} // namespace keraunos::runtime

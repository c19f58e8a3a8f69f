#include "keraunos/runtime/kernel_cache.h"
#include "keraunos/support/options.h"

#include "keraunos/runtime/cpu_cache.h" // the one FNV-1a of the project

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
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

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
std::uint64_t get_le(std::string_view s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= std::uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

constexpr std::string_view kMagic = "KRNCACHE";
constexpr std::uint32_t kFormatVersion = 1;
constexpr std::size_t kHeaderSize = 32;

} // namespace

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

fs::path default_cache_root() {
  if (auto dir = options::get("cache_dir")) return fs::path(*dir);
  if (const char* home = std::getenv("HOME"); home && *home)
    return fs::path(home) / ".cache" / "keraunos";
  return {};
}

// ---- the cache ------------------------------------------------------------------------------

ArtifactCache::ArtifactCache(fs::path dir, std::string suffix)
    : dir_(std::move(dir)), suffix_(std::move(suffix)) {}

fs::path ArtifactCache::path_for(const std::string& key) const { return dir_ / (key + suffix_); }

std::string ArtifactCache::encode(std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  out.append(kMagic);
  put_u32(out, kFormatVersion);
  put_u32(out, 0);
  put_u64(out, payload.size());
  put_u64(out, cpu::fnv1a64(payload));
  out.append(payload);
  return out;
}

std::optional<std::string> ArtifactCache::decode(std::string_view file) {
  if (file.size() < kHeaderSize || file.substr(0, kMagic.size()) != kMagic) return std::nullopt;
  if (get_le(file, 8, 4) != kFormatVersion) return std::nullopt;
  const std::uint64_t length = get_le(file, 16, 8);
  if (length != file.size() - kHeaderSize) return std::nullopt; // truncated or trailing bytes
  std::string_view payload = file.substr(kHeaderSize);
  if (cpu::fnv1a64(payload) != get_le(file, 24, 8)) return std::nullopt;
  return std::string(payload);
}

std::optional<std::string> ArtifactCache::read_disk(const std::string& key) {
  if (dir_.empty()) return std::nullopt;
  const fs::path path = path_for(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return std::nullopt;
  std::optional<std::string> payload = decode(contents.view());
  if (!payload) {
    // Removing it (rather than only overwriting it after the rebuild) keeps a bad file from
    // being read again by other processes while this one rebuilds.
    std::error_code ec;
    fs::remove(path, ec);
    std::lock_guard lock(mu_);
    ++stats_.corrupt_files;
  }
  return payload;
}

bool ArtifactCache::write_disk(const std::string& key, const std::string& bytes) {
  if (dir_.empty()) return false;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return false;
  const fs::path final_path = path_for(key);
  // mkstemp: a name no other thread or process uses, in the same directory (rename(2) is
  // atomic only within one filesystem).
  std::string tmp = final_path.string() + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return false;
  const std::string file = encode(bytes);
  std::size_t written = 0;
  while (written < file.size()) {
    const ssize_t n = ::write(fd, file.data() + written, file.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  // mkstemp makes the file 0600; a shared cache directory would want the umask's choice, but a
  // per-user cache is the default and other users must not be able to plant kernels in it.
  const bool ok = ::close(fd) == 0 && written == file.size() &&
                  ::rename(tmp.c_str(), final_path.c_str()) == 0;
  if (!ok) ::unlink(tmp.c_str());
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
  static ArtifactCache cache = [] {
    fs::path root = default_cache_root();
    return ArtifactCache(root.empty() ? fs::path() : root / "cuda", ".cubin");
  }();
  return cache;
}

} // namespace keraunos::runtime

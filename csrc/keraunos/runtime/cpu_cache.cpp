#include "keraunos/runtime/cpu_cache.h"
#include "keraunos/support/options.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace keraunos::cpu {

namespace {
constexpr uint64_t kFnv64Prime = 0x100000001b3ull;
// 2^88 + 2^8 + 0x3b
const unsigned __int128 kFnv128Prime = (static_cast<unsigned __int128>(1) << 88) | 0x13b;
// The version of the key scheme: the kernel calling convention and the file layout.
constexpr std::string_view kKeyVersion = "keraunos-cpu-cache-v1";
constexpr std::string_view kMetaMagic = "keraunos-cpu-meta 1";

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
} // namespace

Fnv1a64& Fnv1a64::update(std::string_view bytes) {
  for (unsigned char c : bytes) {
    h_ ^= c;
    h_ *= kFnv64Prime;
  }
  return *this;
}

Fnv1a128& Fnv1a128::update(std::string_view bytes) {
  for (unsigned char c : bytes) {
    h_ ^= c;
    h_ *= kFnv128Prime;
  }
  return *this;
}

Fnv1a128& Fnv1a128::field(std::string_view bytes) {
  char len[8];
  uint64_t n = bytes.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  update(std::string_view(len, 8));
  return update(bytes);
}

std::string Fnv1a128::hex() const {
  return hex64(static_cast<uint64_t>(h_ >> 64)) + hex64(static_cast<uint64_t>(h_));
}

uint64_t fnv1a64(std::string_view bytes) { return Fnv1a64().update(bytes).digest(); }
std::string fnv1a128_hex(std::string_view bytes) { return Fnv1a128().update(bytes).hex(); }

std::string cache_key(const CacheKeyInputs& in) {
  Fnv1a128 h;
  h.field(kKeyVersion).field(in.compiler_path).field(in.compiler_identity);
  h.field(std::to_string(in.flags.size()));
  for (const auto& f : in.flags) h.field(f);
  h.field(in.cpu).field(in.source);
  return h.hex();
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

CacheEntryPaths CacheEntryPaths::of(const std::filesystem::path& dir, const std::string& key) {
  return {dir / (key + ".so"), dir / (key + ".cpp"), dir / (key + ".meta")};
}

std::filesystem::path default_cpu_cache_dir() {
  if (auto d = options::get("cache_dir")) return std::filesystem::path(*d) / "cpu";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "keraunos" / "cpu";
  const char* tmp = std::getenv("TMPDIR");
  return std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
         ("keraunos-" + std::to_string(getuid())) / "cpu";
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

CacheMeta meta_of(std::string_view bytes) { return {bytes.size(), fnv1a64(bytes)}; }

bool verify_entry(const CacheEntryPaths& e) {
  auto meta_text = read_file(e.meta);
  if (!meta_text) return false;
  auto meta = CacheMeta::parse(*meta_text);
  if (!meta) return false;
  // The size first: a truncated file is rejected without reading it.
  struct stat st {};
  if (::stat(e.so.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != meta->size)
    return false;
  auto bytes = read_file(e.so);
  return bytes && bytes->size() == meta->size && fnv1a64(*bytes) == meta->checksum;
}

} // namespace keraunos::cpu

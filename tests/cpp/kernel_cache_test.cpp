// The kernel cache: keys, the file format, memory/disk hits, corruption, concurrency.
#include "keraunos/runtime/kernel_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

using namespace keraunos::runtime;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class KernelCacheTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("keraunos_cache_test_" + std::to_string(rd()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  static void write(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  }

  fs::path dir_;
};

std::string key_of(const std::string& s) { return CacheKey().add(s).hex(); }

} // namespace

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Two blocks (56 bytes: the padding spills into a second block).
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(CacheKey, PartsAreDelimited) {
  EXPECT_NE(CacheKey().add("ab").add("c").hex(), CacheKey().add("a").add("bc").hex());
  EXPECT_EQ(CacheKey().add("x").add(std::int64_t{90}).hex(),
            CacheKey().add("x").add(std::int64_t{90}).hex());
  EXPECT_NE(CacheKey().add("x").add(std::int64_t{90}).hex(),
            CacheKey().add("x").add(std::int64_t{80}).hex());
  EXPECT_EQ(CacheKey().hex().size(), 64u);
}

TEST_F(KernelCacheTest, OnDiskFormatIsTheArtifactAndItsMeta) {
  const std::string payload("\x7f" "ELF\0\1\2binary", 13);
  const std::string key = key_of("k");
  ArtifactCache(dir_, ".bin").store(key, payload);
  EXPECT_EQ(read(dir_ / (key + ".bin")), payload); // byte for byte (dlopen-able)
  auto meta = CacheMeta::parse(read(dir_ / (key + ".meta")));
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->size, payload.size());
  EXPECT_EQ(meta->checksum, fnv1a64(payload));
  // A damaged .meta makes the entry a miss.
  write(dir_ / (key + ".meta"), "keraunos-cache-meta 1\nsize 13\n");
  ArtifactCache cache(dir_, ".bin");
  EXPECT_FALSE(cache.lookup(key));
  EXPECT_EQ(cache.stats().corrupt_files, 1);
}

TEST_F(KernelCacheTest, MemoryThenDiskThenBuild) {
  int builds = 0;
  auto build = [&] {
    ++builds;
    return std::string("cubin-bytes");
  };
  const std::string key = key_of("kernel source");
  {
    ArtifactCache cache(dir_ / "cuda", ".cubin");
    EXPECT_EQ(cache.get_or_build(key, build), "cubin-bytes");
    EXPECT_EQ(cache.get_or_build(key, build), "cubin-bytes");
    EXPECT_EQ(builds, 1);
    EXPECT_EQ(cache.stats().misses, 1);
    EXPECT_EQ(cache.stats().memory_hits, 1);
    EXPECT_TRUE(fs::exists(dir_ / "cuda" / (key + ".cubin")));
    EXPECT_EQ(cache.path_for(key), dir_ / "cuda" / (key + ".cubin"));
  }
  // A new cache (another process) over the same directory reads the disk.
  ArtifactCache cache(dir_ / "cuda", ".cubin");
  EXPECT_EQ(cache.get_or_build(key, build), "cubin-bytes");
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(cache.stats().disk_hits, 1);
  EXPECT_EQ(cache.stats().misses, 0);
  // No temporary files are left behind.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_ / "cuda")) {
    ++files;
    EXPECT_TRUE(entry.path().extension() == ".cubin" || entry.path().extension() == ".meta")
        << entry.path();
  }
  EXPECT_EQ(files, 2);
}

TEST_F(KernelCacheTest, CorruptFilesAreRebuilt) {
  const std::string key = key_of("k");
  const std::string payload(5000, 'p');
  ArtifactCache(dir_, ".bin").store(key, payload);
  const fs::path path = dir_ / (key + ".bin");
  const std::string good = read(path);

  int builds = 0;
  auto build = [&] {
    ++builds;
    return payload;
  };
  const std::vector<std::string> damaged = {
      good.substr(0, good.size() / 2),                       // truncated
      std::string(),                                         // empty
      std::string(good).replace(100, 1, "q"),                // a flipped payload byte
      std::string(good).replace(0, 8, "NOTMAGIC"),           // another file
  };
  for (const std::string& bad : damaged) {
    write(path, bad);
    ArtifactCache cache(dir_, ".bin");
    EXPECT_EQ(cache.get_or_build(key, build), payload);
    EXPECT_EQ(cache.stats().corrupt_files, 1);
    EXPECT_EQ(read(path), good); // rewritten whole
  }
  EXPECT_EQ(builds, static_cast<int>(damaged.size()));
}

TEST_F(KernelCacheTest, ClearMemoryRereadsDisk) {
  ArtifactCache cache(dir_, ".bin");
  const std::string key = key_of("k");
  cache.store(key, "bytes");
  cache.clear_memory();
  EXPECT_EQ(cache.lookup(key), "bytes");
  EXPECT_EQ(cache.stats().disk_hits, 1);
  fs::remove(cache.path_for(key));
  EXPECT_EQ(cache.lookup(key), "bytes"); // still in memory
  cache.clear_memory();
  EXPECT_FALSE(cache.lookup(key));
}

TEST_F(KernelCacheTest, BuildErrorsCacheNothing) {
  ArtifactCache cache(dir_, ".bin");
  const std::string key = key_of("k");
  EXPECT_THROW(cache.get_or_build(key, []() -> std::string { throw std::runtime_error("nvrtc"); }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(cache.path_for(key)));
  EXPECT_EQ(cache.get_or_build(key, [] { return std::string("ok"); }), "ok");
}

TEST_F(KernelCacheTest, UnwritableDirectoryFallsBackToMemory) {
  fs::create_directories(dir_);
  write(dir_ / "file", "x");
  ArtifactCache cache(dir_ / "file" / "cuda", ".bin"); // a directory under a regular file
  const std::string key = key_of("k");
  EXPECT_EQ(cache.get_or_build(key, [] { return std::string("v"); }), "v");
  EXPECT_EQ(cache.stats().write_failures, 1);
  EXPECT_EQ(cache.get_or_build(key, [] { return std::string("other"); }), "v");

  ArtifactCache memory_only({}, ".bin");
  EXPECT_EQ(memory_only.get_or_build(key, [] { return std::string("m"); }), "m");
  EXPECT_EQ(memory_only.stats().write_failures, 0);
}

TEST_F(KernelCacheTest, ConcurrentWritersLeaveOneValidFile) {
  // Several caches (as if several processes) building the same and different keys at once.
  constexpr int kThreads = 8, kKeys = 16;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      ArtifactCache cache(dir_, ".bin");
      for (int i = 0; i < kKeys; ++i) {
        const int k = (i + t) % kKeys;
        const std::string expected(1000 + k, static_cast<char>('a' + k));
        if (cache.get_or_build(key_of(std::to_string(k)), [&] { return expected; }) != expected)
          ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  }
  EXPECT_EQ(files, 2 * kKeys); // each artifact and its .meta
  ArtifactCache reader(dir_, ".bin");
  for (int k = 0; k < kKeys; ++k) EXPECT_TRUE(reader.valid_on_disk(key_of(std::to_string(k))));
}

TEST(DefaultCacheRoot, HonoursKeraunosCacheDir) {
  const char* old = std::getenv("KERAUNOS_CACHE_DIR");
  const std::string saved = old ? old : "";
  ::setenv("KERAUNOS_CACHE_DIR", "/tmp/kr-cache-root", 1);
  EXPECT_EQ(default_cache_root(), fs::path("/tmp/kr-cache-root"));
  if (old)
    ::setenv("KERAUNOS_CACHE_DIR", saved.c_str(), 1);
  else
    ::unsetenv("KERAUNOS_CACHE_DIR");
}

// The CPU kernel cache's pure parts: the FNV-1a hashes (reference vectors), the cache key (stable,
// and sensitive to every input and to field boundaries), the .meta sidecar and the check that
// rejects a damaged entry. The compiler itself is exercised by tests/python/test_cpu_compiler.py.
#include "keraunos/runtime/cpu_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

namespace keraunos::cpu {
namespace {

namespace fs = std::filesystem;

TEST(CpuCacheHash, Fnv1a64ReferenceVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(CpuCacheHash, Fnv1a128ReferenceVectors) {
  EXPECT_EQ(fnv1a128_hex(""), "6c62272e07bb014262b821756295c58d");
  EXPECT_EQ(fnv1a128_hex("a"), "d228cb696f1a8caf78912b704e4a8964");
  EXPECT_EQ(fnv1a128_hex("foobar"), "343e1662793c64bf6f0d3597ba446f18");
}

TEST(CpuCacheHash, StreamingEqualsOneShot) {
  EXPECT_EQ(Fnv1a128().update("foo").update("bar").hex(), fnv1a128_hex("foobar"));
  EXPECT_EQ(Fnv1a64().update("fo").update("obar").digest(), fnv1a64("foobar"));
}

CacheKeyInputs sample() {
  return {"extern \"C\" void k(void**, const long*) {}", "/usr/bin/c++", "c++ 12.2.0",
          {"-O3", "-march=native", "-fopenmp"}, "flags: avx2"};
}

TEST(CpuCacheKey, StableAcrossRunsAndBuilds) {
  // A changed value here invalidates every user's disk cache: bump kKeyVersion on purpose
  // instead (and update this string). The expected key was computed by an independent Python
  // implementation of the documented scheme: FNV-1a 128 over the fields, each as its length
  // (8 bytes, little-endian) then its bytes: "keraunos-cpu-cache-v1", path, identity, the
  // number of flags (decimal), each flag, cpu, source.
  EXPECT_EQ(cache_key(sample()), cache_key(sample()));
  EXPECT_EQ(cache_key(sample()).size(), 32u);
  EXPECT_EQ(cache_key(sample()), "115fb74b620c84672379d87b3f8efb04");
}

TEST(CpuCacheKey, EveryInputMatters) {
  const std::string base = cache_key(sample());
  auto changed = [&](auto edit) {
    CacheKeyInputs in = sample();
    edit(in);
    return cache_key(in);
  };
  EXPECT_NE(base, changed([](CacheKeyInputs& in) { in.source += " "; }));
  EXPECT_NE(base, changed([](CacheKeyInputs& in) { in.compiler_path = "/usr/bin/g++"; }));
  EXPECT_NE(base, changed([](CacheKeyInputs& in) { in.compiler_identity = "c++ 13.1.0"; }));
  EXPECT_NE(base, changed([](CacheKeyInputs& in) { in.flags.pop_back(); }));
  EXPECT_NE(base, changed([](CacheKeyInputs& in) { std::swap(in.flags[0], in.flags[1]); }));
  EXPECT_NE(base, changed([](CacheKeyInputs& in) { in.cpu = "flags: avx512f"; }));
}

TEST(CpuCacheKey, FieldBoundariesMatter) {
  CacheKeyInputs a = sample(), b = sample();
  a.flags = {"-O3 -g"};
  b.flags = {"-O3", "-g"};
  EXPECT_NE(cache_key(a), cache_key(b));
  a = b = sample();
  a.compiler_identity = "x";
  a.cpu = "yz";
  b.compiler_identity = "xy";
  b.cpu = "z";
  EXPECT_NE(cache_key(a), cache_key(b));
}

TEST(CpuCacheMeta, RoundTripAndRejects) {
  CacheMeta m = meta_of("hello");
  EXPECT_EQ(m.size, 5u);
  auto back = CacheMeta::parse(m.str());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->size, m.size);
  EXPECT_EQ(back->checksum, m.checksum);
  EXPECT_FALSE(CacheMeta::parse(""));
  EXPECT_FALSE(CacheMeta::parse("keraunos-cpu-meta 1\nsize 5\n"));
  EXPECT_FALSE(CacheMeta::parse("keraunos-cpu-meta 1\nsize 5x\nfnv1a64 0000000000000000\n"));
  EXPECT_FALSE(CacheMeta::parse("something else\nsize 5\nfnv1a64 0000000000000000\n"));
}

class CpuCacheFiles : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("keraunos-cpu-cache-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CpuCacheFiles, LayoutAndVerify) {
  auto e = CacheEntryPaths::of(dir_, "0123abcd");
  EXPECT_EQ(e.so, dir_ / "0123abcd.so");
  EXPECT_EQ(e.cpp, dir_ / "0123abcd.cpp");
  EXPECT_EQ(e.meta, dir_ / "0123abcd.meta");

  EXPECT_FALSE(verify_entry(e)); // nothing there
  const std::string lib(4096, '\x7f');
  ASSERT_TRUE(write_file_atomic(e.so, lib));
  EXPECT_FALSE(verify_entry(e)); // no sidecar
  ASSERT_TRUE(write_file_atomic(e.meta, meta_of(lib).str()));
  EXPECT_TRUE(verify_entry(e));

  ASSERT_TRUE(write_file_atomic(e.so, lib.substr(0, 100))); // truncated
  EXPECT_FALSE(verify_entry(e));
  std::string flipped = lib;
  flipped[2000] = 'x'; // same size, other bytes
  ASSERT_TRUE(write_file_atomic(e.so, flipped));
  EXPECT_FALSE(verify_entry(e));

  // No temporaries are left behind.
  for (const auto& f : fs::directory_iterator(dir_))
    EXPECT_EQ(f.path().string().find(".tmp."), std::string::npos) << f.path();
}

TEST_F(CpuCacheFiles, TempNamesAreUnique) {
  auto a = temp_path_beside(dir_ / "k.so"), b = temp_path_beside(dir_ / "k.so");
  EXPECT_NE(a, b);
  EXPECT_EQ(a.parent_path(), dir_);
}

TEST(CpuCacheDir, FollowsTheEnvironment) {
  const char* old = std::getenv("KERAUNOS_CACHE_DIR");
  std::string saved = old ? old : "";
  setenv("KERAUNOS_CACHE_DIR", "/some/where", 1);
  EXPECT_EQ(default_cpu_cache_dir(), fs::path("/some/where/cpu"));
  if (old)
    setenv("KERAUNOS_CACHE_DIR", saved.c_str(), 1);
  else
    unsetenv("KERAUNOS_CACHE_DIR");
}

} // namespace
} // namespace keraunos::cpu

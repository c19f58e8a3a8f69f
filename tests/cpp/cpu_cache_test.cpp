// The kernel cache's file side as the CPU compiler uses it (runtime/kernel_cache.h): the FNV-1a
// checksum (reference vectors), the CPU cache key (stable, and sensitive to every input and to
// field boundaries), the .meta sidecar and the check that rejects a damaged entry. The compiler
// itself is exercised by tests/python/test_cpu_compiler.py.
#include "keraunos/runtime/kernel_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

namespace keraunos::runtime {
namespace {

namespace fs = std::filesystem;

TEST(CpuCacheHash, Fnv1a64ReferenceVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(CpuCacheHash, StreamingEqualsOneShot) {
  EXPECT_EQ(Fnv1a64().update("fo").update("obar").digest(), fnv1a64("foobar"));
}

CpuKeyInputs sample() {
  return {"extern \"C\" void k(void**, const long*) {}", "/usr/bin/c++", "c++ 12.2.0",
          {"-O3", "-march=native", "-fopenmp"}, "flags: avx2"};
}

TEST(CpuCacheKey, StableAcrossRunsAndBuilds) {
  // A changed value here invalidates every user's disk cache: bump kCpuKeyVersion on purpose
  // instead (and update this string). The expected key was computed by an independent Python
  // implementation of the documented scheme (hashlib): SHA-256 over the fields, each as its
  // length (8 bytes, little-endian) then its bytes: "keraunos-cpu-cache-v2", path, identity,
  // the number of flags (decimal), each flag, cpu, source.
  EXPECT_EQ(cpu_cache_key(sample()), cpu_cache_key(sample()));
  EXPECT_EQ(cpu_cache_key(sample()).size(), 64u);
  EXPECT_EQ(cpu_cache_key(sample()),
            "25362d75d451e1590d3a4c66f73a215e2658599dad9c9a547fb8f8f7b80f5b41");
}

TEST(CpuCacheKey, EveryInputMatters) {
  const std::string base = cpu_cache_key(sample());
  auto changed = [&](auto edit) {
    CpuKeyInputs in = sample();
    edit(in);
    return cpu_cache_key(in);
  };
  EXPECT_NE(base, changed([](CpuKeyInputs& in) { in.source += " "; }));
  EXPECT_NE(base, changed([](CpuKeyInputs& in) { in.compiler_path = "/usr/bin/g++"; }));
  EXPECT_NE(base, changed([](CpuKeyInputs& in) { in.compiler_identity = "c++ 13.1.0"; }));
  EXPECT_NE(base, changed([](CpuKeyInputs& in) { in.flags.pop_back(); }));
  EXPECT_NE(base, changed([](CpuKeyInputs& in) { std::swap(in.flags[0], in.flags[1]); }));
  EXPECT_NE(base, changed([](CpuKeyInputs& in) { in.cpu = "flags: avx512f"; }));
}

TEST(CpuCacheKey, FieldBoundariesMatter) {
  CpuKeyInputs a = sample(), b = sample();
  a.flags = {"-O3 -g"};
  b.flags = {"-O3", "-g"};
  EXPECT_NE(cpu_cache_key(a), cpu_cache_key(b));
  a = b = sample();
  a.compiler_identity = "x";
  a.cpu = "yz";
  b.compiler_identity = "xy";
  b.cpu = "z";
  EXPECT_NE(cpu_cache_key(a), cpu_cache_key(b));
}

TEST(CpuCacheMeta, RoundTripAndRejects) {
  CacheMeta m = meta_of("hello");
  EXPECT_EQ(m.size, 5u);
  auto back = CacheMeta::parse(m.str());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->size, m.size);
  EXPECT_EQ(back->checksum, m.checksum);
  EXPECT_FALSE(CacheMeta::parse(""));
  EXPECT_FALSE(CacheMeta::parse("keraunos-cache-meta 1\nsize 5\n"));
  EXPECT_FALSE(CacheMeta::parse("keraunos-cache-meta 1\nsize 5x\nfnv1a64 0000000000000000\n"));
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
  ArtifactCache cache(dir_, ".so");
  const std::string key = "0123abcd";
  EXPECT_EQ(cache.path_for(key), dir_ / "0123abcd.so");
  EXPECT_EQ(cache.meta_path_for(key), dir_ / "0123abcd.meta");

  EXPECT_FALSE(cache.valid_on_disk(key)); // nothing there
  const std::string lib(4096, '\x7f');
  ASSERT_TRUE(write_file_atomic(cache.path_for(key), lib));
  EXPECT_FALSE(cache.valid_on_disk(key)); // no sidecar
  ASSERT_TRUE(write_file_atomic(cache.meta_path_for(key), meta_of(lib).str()));
  EXPECT_TRUE(cache.valid_on_disk(key));

  ASSERT_TRUE(write_file_atomic(cache.path_for(key), lib.substr(0, 100))); // truncated
  EXPECT_FALSE(cache.valid_on_disk(key));
  std::string flipped = lib;
  flipped[2000] = 'x'; // same size, other bytes
  ASSERT_TRUE(write_file_atomic(cache.path_for(key), flipped));
  EXPECT_FALSE(cache.valid_on_disk(key));

  // A library built beside the entry is installed over the damaged one.
  const auto built = temp_path_beside(cache.path_for(key));
  ASSERT_TRUE(write_file_atomic(built, lib));
  ASSERT_TRUE(cache.install(key, built));
  EXPECT_TRUE(cache.valid_on_disk(key));
  EXPECT_FALSE(fs::exists(built));

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
  EXPECT_EQ(default_cache_root(), fs::path("/some/where"));
  if (old)
    setenv("KERAUNOS_CACHE_DIR", saved.c_str(), 1);
  else
    unsetenv("KERAUNOS_CACHE_DIR");
}

} // namespace
} // namespace keraunos::runtime

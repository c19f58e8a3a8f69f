// The options registry (support/options.h): values from set(), the environment and defaults;
// the tuning keys' validation.
#include "keraunos/codegen/cuda_emitter.h"
#include "keraunos/ir/error.h"
#include "keraunos/support/options.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

using namespace keraunos;

namespace {

struct EnvGuard {
  std::string name;
  explicit EnvGuard(const char* n, const char* value) : name(n) {
    if (value)
      setenv(n, value, 1);
    else
      unsetenv(n);
  }
  ~EnvGuard() { unsetenv(name.c_str()); }
};

} // namespace

TEST(Options, EveryOptionHasADocAndEveryTuningKeyAnOption) {
  for (const auto& o : options::all()) {
    EXPECT_NE(std::string(o.doc), "") << o.name;
    if (o.env) EXPECT_EQ(std::string(o.env).rfind("KERAUNOS_", 0) == 0 || std::string(o.env) == "CXX", true) << o.env;
  }
  for (const auto& k : options::tuning_keys()) {
    bool found = false;
    for (const auto& o : options::all())
      found |= std::string(o.name) == k.option && o.kind == options::Kind::Tuning;
    EXPECT_TRUE(found) << k.name;
  }
}

TEST(Options, FlagsComeFromSetThenTheEnvironmentThenTheDefault) {
  EnvGuard g("KERAUNOS_HUGEPAGES", nullptr);
  EXPECT_TRUE(options::flag("hugepages"));
  {
    EnvGuard off("KERAUNOS_HUGEPAGES", "0");
    EXPECT_FALSE(options::flag("hugepages"));
    options::set("hugepages", "on");
    EXPECT_TRUE(options::flag("hugepages"));
    options::set("hugepages", std::nullopt);
    EXPECT_FALSE(options::flag("hugepages"));
  }
  EnvGuard empty("KERAUNOS_VERIFY", "");
  EXPECT_FALSE(options::flag("verify"));
  EXPECT_THROW(options::set("verify", "maybe"), UserError);
  EXPECT_THROW(options::get("no_such_option"), UserError);
}

TEST(Options, WordsAndText) {
  EnvGuard g("KERAUNOS_CXXFLAGS", "  -O1 -Wl,-z,now ");
  EXPECT_EQ(options::words("cxxflags"), (std::vector<std::string>{"-O1", "-Wl,-z,now"}));
  EnvGuard d("KERAUNOS_CACHE_DIR", "");
  EXPECT_FALSE(options::get("cache_dir").has_value()); // empty counts as unset
  EXPECT_EQ(options::text("fusion_type"), "dataflow");
}

TEST(Options, TuningKeysAreValidatedByTheTable) {
  auto t = options::tuning("cuda_tune", "block_threads=0,reuse_values=5,cluster_persist=-1");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0], (std::pair<std::string, int64_t>{"block_threads", 0}));
  EXPECT_EQ(t[1].second, 1); // a switch
  EXPECT_EQ(t[2].second, -1);
  for (const char* bad : {"block_threads=48", "block_threads=16", "max_cluster=3", "threads=3",
                          "max_cluster=x", "max_cluster", "cluster_persist=-2", "cache_hints=8"})
    EXPECT_THROW(options::tuning("cuda_tune", std::string(bad)), UserError) << bad;
  try {
    options::tuning("cuda_tune", std::string("max_cluster=3"));
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("KERAUNOS_CUDA_TUNE: max_cluster must be a power of two"),
              std::string::npos)
        << e.what();
  }
}

// The codegen's map from tuning keys to CudaDeviceInfo fields covers the registry's table.
TEST(Options, EveryCudaTuningKeySetsAField) {
  for (const auto& k : options::tuning_keys()) {
    codegen::CudaDeviceInfo d;
    EXPECT_NO_THROW(codegen::apply_cuda_tuning(d, std::string(k.name) + "=" + std::to_string(k.hi)))
        << k.name;
  }
}

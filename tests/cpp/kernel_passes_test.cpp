// The kernel pass list (codegen/kernel_passes.h): which passes run, in which order, on which
// devices, and golden listings (text in, text out) of the passes without one elsewhere
// (hoist_invariants and fuse_sibling_reductions: kernel_ir_test.cpp).
#include "keraunos/codegen/kernel_passes.h"
#include "keraunos/codegen/reuse_reduced_values.h"
#include "kir_builders.h"

#include <gtest/gtest.h>

using namespace keraunos;
using namespace keraunos::kir;
using namespace keraunos::kir::build;
using keraunos::codegen::KernelStage;

namespace {

std::vector<std::string> stage_names(const std::vector<KernelStage>& st) {
  std::vector<std::string> out;
  for (const auto& s : st) out.push_back(s.pass);
  return out;
}

} // namespace

TEST(KernelPasses, ListAndDevices) {
  std::vector<std::string> names;
  for (const auto& p : codegen::kernel_passes()) {
    names.emplace_back(p.name);
    EXPECT_FALSE(p.what.empty()) << p.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fuse_sibling_reductions", "reuse_reduced_values",
                                             "hoist_invariants"}));

  Kernel cpu = softmax(4, 64);
  cpu.device = DeviceType::CPU;
  std::vector<KernelStage> st;
  codegen::run_kernel_passes(cpu, &st);
  EXPECT_EQ(stage_names(st), (std::vector<std::string>{"lower", "fuse_sibling_reductions",
                                                       "reuse_reduced_values",
                                                       "hoist_invariants"}));
  EXPECT_EQ(st.back().listing, cpu.str());

  Kernel gpu = softmax(4, 64); // CUDA: recomputing beats storing and reloading
  st.clear();
  codegen::run_kernel_passes(gpu, &st);
  EXPECT_EQ(stage_names(st),
            (std::vector<std::string>{"lower", "fuse_sibling_reductions", "hoist_invariants"}));
  EXPECT_EQ(st.front().listing, softmax(4, 64).str());
  EXPECT_EQ(gpu.str(), softmax(4, 64).str()); // nothing for these passes to do here
}

TEST(KernelPasses, ReuseReducedValuesStoresTheExpAndReloadsIt) {
  Kernel k = softmax(4, 64);
  k.device = DeviceType::CPU;
  ASSERT_TRUE(codegen::reuse_reduced_values(k));
  EXPECT_EQ(k.str(), R"(kernel softmax(in0: f32[4, 64], out0: f32[4, 64]):
  parallel i0 < 4:
    acc a0 max
    reduce r0 < 64:
      v0 = load in0[64 * i0 + r0]
      update a0 max v0
    acc a1 sum
    reduce r1 < 64:
      v1 = load in0[64 * i0 + r1]
      let v2 = kr_exp(v1 - a0)
      update a1 sum v2
      store out0[64 * i0 + r1] = v2
    inner i1 < 64:
      v4 = load out0[64 * i0 + i1]
      let v5 = v4 / a1
      store out0[64 * i0 + i1] = v5
)");
}

TEST(KernelPasses, ReuseReducedValuesLeavesHalfOutputsAlone) {
  // A bfloat16 output cannot hold the float32 exp losslessly: the kernel is unchanged.
  Kernel k = softmax(4, 64, DType::BFloat16);
  k.device = DeviceType::CPU;
  const std::string before = k.str();
  EXPECT_FALSE(codegen::reuse_reduced_values(k));
  EXPECT_EQ(k.str(), before);
}

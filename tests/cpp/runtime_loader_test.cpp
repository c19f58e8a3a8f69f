// The NVRTC and driver loaders report a missing library instead of crashing; where NVRTC is
// found (KERAUNOS_NVRTC_LIBRARY, CUDA_HOME or the loader's path) a kernel compiles to ELF.
#include "keraunos/ir/error.h"
#include "keraunos/runtime/cuda_driver.h"
#include "keraunos/runtime/nvrtc.h"

#include <gtest/gtest.h>

using namespace keraunos;
using namespace keraunos::runtime;

TEST(NvrtcLoader, ReportsOrCompiles) {
  set_nvrtc_search_dirs({"/nonexistent-keraunos-dir"});
  const Availability a = nvrtc_available();
  if (!a.available) {
    EXPECT_NE(a.reason.find("libnvrtc"), std::string::npos) << a.reason;
    EXPECT_THROW(nvrtc_version(), UserError);
    GTEST_SKIP() << "NVRTC unavailable: " << a.reason;
  }
  const NvrtcResult r =
      compile_cuda("extern \"C\" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }", "k", 90);
  ASSERT_GE(r.cubin.size(), 4u);
  EXPECT_EQ(r.cubin.substr(0, 4), "\x7f" "ELF");
  EXPECT_THROW(compile_cuda("this is not C++", "bad", 90), InternalError);
}

TEST(CudaDriverLoader, ReportsWhenUnavailable) {
  const Availability a = cuda_driver_available();
  if (a.available) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(a.reason.empty());
  EXPECT_THROW(cuda_driver(), UserError);
}

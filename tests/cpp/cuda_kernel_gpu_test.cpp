// Emitted CUDA kernels run on a GPU: results against CPU references (double precision), both
// the vectorized and the scalar entry, and a bandwidth report against a device-to-device copy
// (printed, never asserted). Skipped without a CUDA device or without NVRTC.
//
// Run on a GPU machine with, e.g.:
//   KERAUNOS_NVRTC_LIBRARY=.../nvidia/cu13/lib/libnvrtc.so.13 \
//   KERAUNOS_DEVICE_DIR=csrc/keraunos/codegen/device ./keraunos_tests --gtest_filter='CudaGpu*'
#include "keraunos/runtime/cuda_driver.h"
#include "keraunos/executors/cuda_kernel.h"
#include "keraunos/runtime/nvrtc.h"
#include "keraunos/codegen/cuda_emitter.h"
#include "kir_builders.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <random>

using namespace keraunos;
using namespace keraunos::kir;
using namespace keraunos::kir::build;
using runtime::CUresult;

namespace {

using CUdeviceptr = unsigned long long;
struct CUevent_st;
using CUevent = CUevent_st*;

// The driver calls a test needs beyond the runtime's (memory, events).
struct TestDriver {
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, runtime::CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
};

const TestDriver* test_driver() {
  static const TestDriver* d = [] () -> const TestDriver* {
    if (!runtime::cuda_driver_available().available) return nullptr;
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return nullptr;
    auto* t = new TestDriver;
    auto get = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name)); };
    get(t->cuMemAlloc, "cuMemAlloc_v2");
    get(t->cuMemFree, "cuMemFree_v2");
    get(t->cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    get(t->cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    get(t->cuMemcpyDtoD, "cuMemcpyDtoD_v2");
    get(t->cuCtxSynchronize, "cuCtxSynchronize");
    get(t->cuEventCreate, "cuEventCreate");
    get(t->cuEventRecord, "cuEventRecord");
    get(t->cuEventSynchronize, "cuEventSynchronize");
    get(t->cuEventElapsedTime, "cuEventElapsedTime");
    runtime::ensure_context(0);
    return t;
  }();
  return d;
}

#define REQUIRE_GPU()                                                                              \
  do {                                                                                             \
    if (!runtime::cuda_driver_available().available)                                               \
      GTEST_SKIP() << "no CUDA device: " << runtime::cuda_driver_available().reason;               \
    if (!runtime::nvrtc_available().available)                                                     \
      GTEST_SKIP() << "NVRTC unavailable: " << runtime::nvrtc_available().reason;                  \
    ASSERT_NE(test_driver(), nullptr);                                                             \
  } while (0)

void ck(CUresult r, const char* what) { runtime::check_cuda(r, what); }

// A device allocation with `pad` spare bytes in front, so a test can misalign it on purpose.
struct DeviceBuffer {
  CUdeviceptr base = 0;
  size_t bytes = 0;
  size_t offset = 0;
  DeviceBuffer(size_t n, size_t offset_bytes = 0) : bytes(n), offset(offset_bytes) {
    ck(test_driver()->cuMemAlloc(&base, n + 16), "cuMemAlloc");
  }
  ~DeviceBuffer() { test_driver()->cuMemFree(base); }
  void* ptr() const { return reinterpret_cast<void*>(base + offset); }
  template <class T> void upload(const std::vector<T>& v) {
    ck(test_driver()->cuMemcpyHtoD(base + offset, v.data(), v.size() * sizeof(T)), "HtoD");
  }
  template <class T> std::vector<T> download(size_t n) const {
    std::vector<T> v(n);
    ck(test_driver()->cuMemcpyDtoH(v.data(), base + offset, n * sizeof(T)), "DtoH");
    return v;
  }
};

std::vector<float> random_floats(size_t n, unsigned seed, float lo = -3, float hi = 3) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

uint16_t f2bf(float f) { // as c10 on sm_80+ (cvt.rn.bf16.f32): NaN -> canonical 0x7FFF
  if (std::isnan(f)) return 0x7FFF;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float bf2f(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Runs `k` on `inputs` (host vectors of raw bytes) and returns each output's bytes.
std::vector<std::vector<char>> run(const Kernel& k, const std::vector<std::vector<char>>& inputs,
                                   size_t misalign = 0, std::string* entry = nullptr) {
  auto compiled = executors::compile_cuda_kernel(k, 0);
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<void*> ptrs;
  size_t in = 0;
  for (const Buffer& b : k.buffers) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(numel(b.shape), 1)) * itemsize(b.dtype);
    bufs.push_back(std::make_unique<DeviceBuffer>(bytes, misalign));
    if (!b.output) bufs.back()->upload(inputs.at(in++));
    ptrs.push_back(bufs.back()->ptr());
  }
  executors::launch(*compiled, ptrs.data(), nullptr);
  ck(test_driver()->cuCtxSynchronize(), "cuCtxSynchronize (kernel)");
  if (entry)
    *entry = misalign == 0 && !compiled->source().entry_vec.empty() ? compiled->source().entry_vec
                                                                     : compiled->source().entry;
  std::vector<std::vector<char>> outs;
  for (size_t i = 0; i < k.buffers.size(); ++i)
    if (k.buffers[i].output) outs.push_back(bufs[i]->download<char>(bufs[i]->bytes));
  return outs;
}

template <class T> std::vector<char> bytes_of(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <class T> std::vector<T> as(const std::vector<char>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double atol,
                  double rtol) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0, worst = 0;
  double worst_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const bool nan_ok = std::isnan(want[i]) && std::isnan(got[i]);
    if (!nan_ok && !(err <= atol + rtol * std::fabs(want[i]))) {
      if (bad++ == 0 || err > worst_err) worst = i, worst_err = err;
    }
  }
  EXPECT_EQ(bad, 0u) << "worst at " << worst << ": got " << got[worst] << " want " << want[worst];
}

Kernel rms_norm(int64_t rows, int64_t cols) {
  Kernel k;
  k.name = "rms_norm";
  k.buffers = {buffer("in0", F32, false, {rows, cols}), buffer("in1", F32, false, {cols}),
               buffer("out0", F32, true, {rows, cols})};
  auto row = [&](const char* v) { return idx({{"i0", cols}, {v, 1}}); };
  k.body = {par("i0", rows,
                {acc("a0", F32, ReduceOp::Sum),
                 red("r0", cols, {load("v0", F32, 0, row("r0")), let("v1", F32, "(v0 * v0)"),
                                  update("a0", ReduceOp::Sum, "v1")}),
                 let("v2", F32, "kr_rsqrt(((a0 / " + std::to_string(cols) + ".0f) + 1e-06f))"),
                 inner("i1", cols,
                       {load("v3", F32, 0, row("i1")), load("v4", F32, 1, idx({{"i1", 1}})),
                        let("v5", F32, "((v3 * v2) * v4)"), store(2, row("i1"), "v5")})})};
  return k;
}

std::vector<double> softmax_ref(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max<double>(m, x[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = std::exp(x[r * cols + c] - m) / s;
  }
  return y;
}

} // namespace

TEST(CudaGpu, GeluMulAddVectorizedAndScalar) {
  REQUIRE_GPU();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{257, 1024}, {1000, 999}, {1, 1}}) {
    const Kernel k = gelu_mul_add(rows, cols);
    const size_t n = static_cast<size_t>(rows * cols);
    auto x = random_floats(n, 1), y = random_floats(n, 2), z = random_floats(n, 3);
    std::vector<double> want(n);
    for (size_t i = 0; i < n; ++i)
      want[i] = 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0))) * y[i] + z[i];
    for (size_t misalign : {0, 4}) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " misalign " +
                   std::to_string(misalign));
      std::string entry;
      auto out = run(k, {bytes_of(x), bytes_of(y), bytes_of(z)}, misalign, &entry);
      expect_close(as<float>(out[0]), want, 1e-5, 1e-5);
      if (cols == 1024) EXPECT_EQ(entry, misalign ? "gelu_mul_add" : "gelu_mul_add_vec");
    }
  }
}

TEST(CudaGpu, HalfAndBFloat16RoundTripBitExact) {
  REQUIRE_GPU();
  // out0 = bf16(bf16 x * 3): compute in float, round to nearest even on the store.
  Kernel k;
  k.name = "bf16_scale";
  k.buffers = {buffer("in0", DType::BFloat16, false, {4096}),
               buffer("out0", DType::BFloat16, true, {4096})};
  const Index i = idx({{"i0", 1}});
  k.body = {par("i0", 4096, {load("v0", F32, 0, i), let("v1", F32, "(v0 * 3.0f)"), store(1, i, "v1")})};
  std::vector<uint16_t> x(4096);
  for (size_t j = 0; j < x.size(); ++j) x[j] = static_cast<uint16_t>(j * 16 + 3); // many exponents
  x[7] = 0x7FC1; // NaN
  auto out = as<uint16_t>(run(k, {bytes_of(x)})[0]);
  size_t bad = 0;
  for (size_t j = 0; j < x.size(); ++j) bad += out[j] != f2bf(bf2f(x[j]) * 3.0f);
  EXPECT_EQ(bad, 0u);
}

TEST(CudaGpu, SoftmaxShapes) {
  REQUIRE_GPU();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 8192}, {1000, 1000}, {3, 300000},
                            {1000, 128}, {7, 33}, {5000, 5}, {40, 32768}, {9, 131072},
                            {300, 262144}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const Kernel k = softmax(rows, cols);
    auto x = random_floats(static_cast<size_t>(rows * cols), 7);
    auto out = run(k, {bytes_of(x)});
    expect_close(as<float>(out[0]), softmax_ref(x, rows, cols), 1e-7, 1e-5);
  }
}

TEST(CudaGpu, LayerNormAndRmsNorm) {
  REQUIRE_GPU();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{256, 8192}, {100, 1000}, {33, 20000},
                                {8, 262144}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    auto x = random_floats(static_cast<size_t>(rows * cols), 11);
    auto w = random_floats(static_cast<size_t>(cols), 12), b = random_floats(static_cast<size_t>(cols), 13);
    std::vector<double> ln(x.size()), rms(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, v = 0, q = 0;
      for (int64_t c = 0; c < cols; ++c) s += x[r * cols + c], q += double(x[r * cols + c]) * x[r * cols + c];
      const double mean = s / cols;
      for (int64_t c = 0; c < cols; ++c) v += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
      const double inv = 1 / std::sqrt(v / cols + 1e-5), inv2 = 1 / std::sqrt(q / cols + 1e-6);
      for (int64_t c = 0; c < cols; ++c) {
        ln[r * cols + c] = (x[r * cols + c] - mean) * inv * w[c] + b[c];
        rms[r * cols + c] = x[r * cols + c] * inv2 * w[c];
      }
    }
    expect_close(as<float>(run(layer_norm(rows, cols), {bytes_of(x), bytes_of(w), bytes_of(b)})[0]),
                 ln, 1e-4, 1e-4);
    expect_close(as<float>(run(rms_norm(rows, cols), {bytes_of(x), bytes_of(w)})[0]), rms, 1e-4,
                 1e-4);
  }
}

TEST(CudaGpu, ReductionsRowColumnTinyAndFull) {
  REQUIRE_GPU();
  {
    auto x = random_floats(300 * 5000, 21);
    std::vector<double> want(300);
    for (int r = 0; r < 300; ++r) {
      double s = 0;
      for (int c = 0; c < 5000; ++c) s += x[r * 5000 + c];
      want[r] = s / 5000;
    }
    expect_close(as<float>(run(row_mean(300, 5000), {bytes_of(x)})[0]), want, 1e-5, 1e-4);
  }
  // One thread per column (70000 columns), the column schedule (1000 columns: 32 per block, the
  // last block part full; 4100 rows: 32 parts of a column, the last ones a row short).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1000, 70000}, {300, 1000}, {4100, 1000}}) {
    SCOPED_TRACE("column_max " + std::to_string(rows) + "x" + std::to_string(cols));
    auto x = random_floats(static_cast<size_t>(rows * cols), 22);
    x[5 * cols + 17] = NAN; // column 17 is NaN (propagates like amax)
    std::vector<double> want(static_cast<size_t>(cols), -INFINITY);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        want[c] = std::isnan(want[c]) || std::isnan(x[r * cols + c]) ? NAN : std::max<double>(want[c], x[r * cols + c]);
    expect_close(as<float>(run(column_max(rows, cols), {bytes_of(x)})[0]), want, 0, 0);
  }
  {
    // The column schedule with a per-row operand (rows not a multiple of the split).
    const int64_t rows = 1001, cols = 300;
    auto x = random_floats(static_cast<size_t>(rows * cols), 23);
    auto w = random_floats(static_cast<size_t>(rows), 24);
    std::vector<double> want(static_cast<size_t>(cols), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) want[c] += double{x[r * cols + c]} * w[r];
    expect_close(as<float>(run(column_weighted_sum(rows, cols), {bytes_of(x), bytes_of(w)})[0]),
                 want, 1e-4, 1e-4);
  }
  {
    // A full int32 -> int64 sum to a 0-d output (one block).
    Kernel k;
    k.name = "full_sum";
    k.buffers = {buffer("in0", DType::Int32, false, {100003}), buffer("out0", DType::Int64, true, {})};
    k.body = {acc("a0", DType::Int64, ReduceOp::Sum),
              red("r0", 100003, {load("v0", DType::Int64, 0, idx({{"r0", 1}})),
                                 update("a0", ReduceOp::Sum, "v0")}),
              store(1, idx({}), "a0")};
    std::vector<int32_t> x(100003);
    int64_t want = 0;
    for (size_t i = 0; i < x.size(); ++i) want += x[i] = static_cast<int32_t>(i * 2654435761u);
    EXPECT_EQ(as<int64_t>(run(k, {bytes_of(x)})[0])[0], want);
  }
}

// argmax / argmin as the lowering emits them (a max / min of (value, position) keys) under
// every row schedule: eager's first index of the extreme value, NaN the extreme, the first NaN.
TEST(CudaGpu, ArgmaxArgminTiesAndNaN) {
  REQUIRE_GPU();
  auto ref = [](const float* row, int64_t n, bool mn) {
    int64_t best = 0;
    for (int64_t i = 1; i < n && !std::isnan(row[best]); ++i)
      if (std::isnan(row[i]) || (mn ? row[i] < row[best] : row[i] > row[best])) best = i;
    return best;
  };
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 100}, {33, 5000}, {4, 70000},
                            {1000, 7}, {3, 1}}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + (bf16 ? " bf16" : ""));
      std::mt19937 gen(static_cast<unsigned>(rows * cols));
      std::uniform_int_distribution<int> small(-4, 4);
      std::vector<float> x(static_cast<size_t>(rows * cols));
      for (auto& v : x) v = static_cast<float>(small(gen));
      for (int64_t r = 0; r < rows; ++r) {
        float* row = x.data() + r * cols;
        if (r % 5 == 1) row[(r * 7919) % cols] = NAN, row[(r * 104729) % cols] = NAN;
        if (r % 5 == 2) std::fill(row, row + cols, 2.0f);              // all equal
        if (r % 5 == 3) std::fill(row, row + cols, -INFINITY);         // all -inf
        if (r % 5 == 4) row[cols - 1] = 100.0f, row[cols / 2] = 100.0f, row[0] = -0.0f;
      }
      std::vector<uint16_t> xb(x.size());
      if (bf16)
        for (size_t i = 0; i < x.size(); ++i) x[i] = bf2f(xb[i] = f2bf(x[i]));
      for (bool mn : {false, true}) {
        const Kernel k = row_argmax(rows, cols, bf16 ? DType::BFloat16 : F32, mn);
        std::vector<std::string> entries;
        for (size_t misalign : {0, 8}) { // 8: not 16-byte aligned, the scalar entry
          std::string entry;
          auto out = as<int64_t>(run(k, {bf16 ? bytes_of(xb) : bytes_of(x)}, misalign, &entry)[0]);
          size_t bad = 0;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t want = ref(x.data() + r * cols, cols, mn);
            if (out[static_cast<size_t>(r)] != want && bad++ == 0)
              ADD_FAILURE() << (mn ? "argmin" : "argmax") << " row " << r << ": got "
                            << out[static_cast<size_t>(r)] << " want " << want << " (" << entry
                            << ")";
          }
          EXPECT_EQ(bad, 0u) << entry;
        }
      }
    }
  }
}

// cumsum: rows scanned block-wide (chunks, carries), short rows, and columns walked by a thread.
TEST(CudaGpu, CumsumRowsAndColumns) {
  REQUIRE_GPU();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 1000}, {5, 70}, {3, 100000},
                            {100, 10}, {2, 512}, {7, 513}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    auto x = random_floats(static_cast<size_t>(rows * cols), 31);
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) want[r * cols + c] = s += x[r * cols + c];
    }
    expect_close(as<float>(run(row_cumsum(rows, cols), {bytes_of(x)})[0]), want,
                 1e-6 * 3 * static_cast<double>(cols), 1e-5);
    // int64: exact.
    std::vector<int64_t> xi(x.size()), wi(x.size());
    for (size_t i = 0; i < x.size(); ++i) xi[i] = static_cast<int64_t>(x[i] * 1000);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t s = 0;
      for (int64_t c = 0; c < cols; ++c) wi[r * cols + c] = s += xi[r * cols + c];
    }
    EXPECT_EQ(as<int64_t>(run(row_cumsum(rows, cols, DType::Int64), {bytes_of(xi)})[0]), wi);
    // The transposed problem: a scan over dim 0 of [cols, rows], one thread per column.
    Kernel k;
    k.name = "column_cumsum";
    k.buffers = {buffer("in0", DType::Int64, false, {cols, rows}),
                 buffer("out0", DType::Int64, true, {cols, rows})};
    const Index ix = idx({{"s0", rows}, {"i0", 1}});
    k.body = {par("i0", rows,
                  {acc("a0", DType::Int64, ReduceOp::Sum),
                   loop("s0", cols, LoopKind::Scan,
                        {load("v0", DType::Int64, 0, ix), update("a0", ReduceOp::Sum, "v0"),
                         let("v1", DType::Int64, "a0"), store(1, ix, "v1")})})};
    std::vector<int64_t> xt(xi.size()), wt(xi.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        xt[c * rows + r] = xi[r * cols + c], wt[c * rows + r] = wi[r * cols + c];
    EXPECT_EQ(as<int64_t>(run(k, {bytes_of(xt)})[0]), wt);
  }
}

// Bandwidth, printed: a device-to-device copy as the reference, then the kernels.
TEST(CudaGpu, BandwidthReport) {
  REQUIRE_GPU();
  const TestDriver& d = *test_driver();
  CUevent e0, e1;
  ck(d.cuEventCreate(&e0, 0), "cuEventCreate");
  ck(d.cuEventCreate(&e1, 0), "cuEventCreate");
  auto time_ms = [&](const std::function<void()>& f, int iters) {
    f();
    ck(d.cuCtxSynchronize(), "sync");
    ck(d.cuEventRecord(e0, nullptr), "record");
    for (int i = 0; i < iters; ++i) f();
    ck(d.cuEventRecord(e1, nullptr), "record");
    ck(d.cuEventSynchronize(e1), "sync");
    float ms = 0;
    ck(d.cuEventElapsedTime(&ms, e0, e1), "elapsed");
    return ms / iters;
  };
  const size_t n = size_t{1} << 28;
  DeviceBuffer a(n * 4), b(n * 4), c(n * 4), o(n * 4);
  const double copy_ms = time_ms([&] { ck(d.cuMemcpyDtoD(o.base, a.base, n * 4), "DtoD"); }, 20);
  const double copy_gbs = 2.0 * n * 4 / copy_ms / 1e6;
  std::printf("[bandwidth] cuMemcpyDtoD 2^28 f32: %.3f ms, %.0f GB/s\n", copy_ms, copy_gbs);
  auto report = [&](const Kernel& k, std::vector<void*> ptrs, double bytes) {
    auto compiled = executors::compile_cuda_kernel(k, 0);
    const double ms = time_ms([&] { executors::launch(*compiled, ptrs.data(), nullptr); }, 20);
    const auto& l = compiled->source().entry_vec.empty() ? compiled->launch_config()
                                                         : compiled->launch_config_vec();
    std::printf("[bandwidth] %-14s %-9s grid %u block %ux%u: %.3f ms, %.0f GB/s = %.1f%% of copy\n",
                k.name.c_str(), compiled->source().schedule.c_str(), l.grid[0], l.block[0],
                l.block[1], ms, bytes / ms / 1e6, 100.0 * bytes / ms / 1e6 / copy_gbs);
  };
  report(copy_kernel(static_cast<int64_t>(n)), {a.ptr(), o.ptr()}, 2.0 * n * 4);
  report(gelu_mul_add(1 << 14, 1 << 14), {a.ptr(), b.ptr(), c.ptr(), o.ptr()}, 4.0 * n * 4);
  // Other grid sizes for the vectorized pointwise kernels (the emitted default is one resident
  // wave): several waves, and one trip per thread.
  for (const Kernel& k : {copy_kernel(static_cast<int64_t>(n)), gelu_mul_add(1 << 14, 1 << 14)}) {
    const auto src = codegen::emit_cuda(k, executors::cuda_device_info(0));
    runtime::CudaModule m(runtime::compile_cuda_cached(src.source, k.name, 90), 0);
    const runtime::CUfunction f = m.function(src.entry_vec);
    std::vector<void*> ptrs = k.buffers.size() == 2 ? std::vector<void*>{a.ptr(), o.ptr()}
                                                    : std::vector<void*>{a.ptr(), b.ptr(), c.ptr(), o.ptr()};
    std::vector<void*> params;
    for (auto& p : ptrs) params.push_back(&p);
    const double bytes = (k.buffers.size() * 4.0) * n;
    for (unsigned blocks : {132u * 8, 132u * 128, static_cast<unsigned>(src.launch_vec.work / 512),
                            static_cast<unsigned>(src.launch_vec.work / 256)}) {
      const unsigned grid[3] = {blocks, 1, 1}, block[3] = {256, 1, 1};
      const double ms = time_ms([&] { runtime::CudaModule::launch(f, grid, block, 0, nullptr, params.data()); }, 20);
      std::printf("[bandwidth]   %-12s grid %7u: %.3f ms, %.1f%% of copy\n", k.name.c_str(), blocks,
                  ms, 100.0 * bytes / ms / 1e6 / copy_gbs);
    }
  }
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{16384, 8192}, {65536, 4096},
                            {8192, 16384}, {4096, 32768}, {1024, 262144}, {32768, 1024},
                            {131072, 2048}}) {
    std::printf("[bandwidth] rows %lld x cols %lld\n", (long long)rows, (long long)cols);
    const double bytes = 2.0 * rows * cols * 4;
    report(softmax(rows, cols), {a.ptr(), o.ptr()}, bytes);
    report(layer_norm(rows, cols), {a.ptr(), b.ptr(), c.ptr(), o.ptr()}, bytes);
    report(rms_norm(rows, cols), {a.ptr(), b.ptr(), o.ptr()}, bytes);
  }
  std::printf("[bandwidth] bfloat16 rms_norm rows 16384 x cols 8192\n");
  report(rms_norm_rows(16384, 8192, DType::BFloat16), {a.ptr(), b.ptr(), o.ptr()},
         2.0 * 16384 * 8192 * 2);
  report(row_mean(16384, 8192), {a.ptr(), o.ptr()}, 16384.0 * 8192 * 4);
  report(column_max(4096, 65536), {a.ptr(), o.ptr()}, 4096.0 * 65536 * 4);
}

// kr_cuda.cuh: the device helpers every generated CUDA kernel starts with (the CUDA emitter
// pastes this text in front of its kernels, so NVRTC gets no include path and no CUDA header).
//
// The names match the CPU backend's kr_cpu.h: the kernel IR's expressions (kir::Let) call them
// and both backends must agree on their meaning, which is eager PyTorch's:
//   - math uses CUDA's accurate functions (expf, erff, tanhf, ...), never the __expf-style
//     intrinsics; kernels are compiled without -use_fast_math.
//   - kr_maximum / kr_minimum propagate NaN (torch.maximum, amax); kr_round is half to even;
//     kr_remainder and kr_floor_divide are Python's floor-mod / floor-div on floats (ATen's
//     div_floor_floating); kr_sign(NaN) is 0 like torch.sign.
//   - float16 / bfloat16 live in buffers as uint16_t bits and compute in float: kr_h2f / kr_f2h
//     and kr_bf2f / kr_f2bf convert, rounding to nearest even as c10 does on a GPU: on sm_80+
//     the hardware's cvt (c10 calls __float2bfloat16 there), which makes every NaN the canonical
//     0x7FFF as eager CUDA PyTorch does; before sm_80 c10's software rounding (NaN -> 0x7FC0).
// Reductions: kr_identity / kr_combine by op (KR_SUM, ...), warp and block all-reduces that
// leave the result in every participating thread.
#ifndef KERAUNOS_KR_CUDA_CUH
#define KERAUNOS_KR_CUDA_CUH

// <cstdint> is not reachable without include paths; these match LP64 Linux (int64_t is long,
// as on the host), so integer overloads resolve as they do in kr_cpu.h.
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;

#define KR_DEVICE __device__ __forceinline__

// ---------------------------------------------------------------------------------------------
// Constants
KR_DEVICE float kr_inf_f() { return __int_as_float(0x7f800000); }
KR_DEVICE float kr_nan_f() { return __int_as_float(0x7fc00000); }
KR_DEVICE double kr_inf_d() { return __longlong_as_double(0x7ff0000000000000LL); }
KR_DEVICE double kr_nan_d() { return __longlong_as_double(0x7ff8000000000000LL); }

// ---------------------------------------------------------------------------------------------
// 16-bit floats held as uint16_t bits.
KR_DEVICE float kr_h2f(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
KR_DEVICE uint16_t kr_f2h(float f) { // round to nearest even, NaN stays NaN
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
KR_DEVICE uint16_t kr_f2h(double d) { // one rounding, straight from double
  uint16_t h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d));
  return h;
}
KR_DEVICE float kr_bf2f(uint16_t b) { return __uint_as_float(static_cast<unsigned>(b) << 16); }
#if __CUDA_ARCH__ >= 800
KR_DEVICE uint16_t kr_f2bf(float f) { // one F2FP instruction; NaN -> 0x7FFF
  uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}
#else
KR_DEVICE uint16_t kr_f2bf(float f) { // c10's software rounding before sm_80, NaN -> 0x7FC0
  if (f != f) return 0x7FC0;
  const unsigned u = __float_as_uint(f);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
#endif
KR_DEVICE uint16_t kr_f2bf(double d) { return kr_f2bf(static_cast<float>(d)); }
// Two values rounded as kr_f2bf does, packed: `lo` in the low half (the lower address).
KR_DEVICE unsigned kr_f2bf2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<unsigned>(kr_f2bf(lo)) | (static_cast<unsigned>(kr_f2bf(hi)) << 16);
#endif
}


// ---------------------------------------------------------------------------------------------
// Unary math, float and double.
#define KR_UNARY(name, ff, df)                                                                   \
  KR_DEVICE float name(float x) { return ff(x); }                                                \
  KR_DEVICE double name(double x) { return df(x); }
KR_UNARY(kr_exp, expf, exp)
KR_UNARY(kr_exp2, exp2f, exp2)
KR_UNARY(kr_log, logf, log)
KR_UNARY(kr_log2, log2f, log2)
KR_UNARY(kr_log1p, log1pf, log1p)
KR_UNARY(kr_expm1, expm1f, expm1)
KR_UNARY(kr_sin, sinf, sin)
KR_UNARY(kr_cos, cosf, cos)
KR_UNARY(kr_tan, tanf, tan)
KR_UNARY(kr_tanh, tanhf, tanh)
KR_UNARY(kr_sqrt, sqrtf, sqrt)
KR_UNARY(kr_rsqrt, rsqrtf, rsqrt)
KR_UNARY(kr_erf, erff, erf)
KR_UNARY(kr_floor, floorf, floor)
KR_UNARY(kr_ceil, ceilf, ceil)
KR_UNARY(kr_round, rintf, rint) // rint: half to even in the default rounding mode
KR_UNARY(kr_trunc, truncf, trunc)
#undef KR_UNARY

KR_DEVICE float kr_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
KR_DEVICE double kr_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
KR_DEVICE float kr_reciprocal(float x) { return 1.0f / x; }
KR_DEVICE double kr_reciprocal(double x) { return 1.0 / x; }

KR_DEVICE float kr_abs(float x) { return fabsf(x); }
KR_DEVICE double kr_abs(double x) { return fabs(x); }
template <class T> KR_DEVICE T kr_abs(T x) { return x < T(0) ? T(-x) : x; }
KR_DEVICE bool kr_abs(bool x) { return x; }

// (0 < x) - (x < 0): NaN -> 0, -0.0 -> 0, as torch.sign.
template <class T> KR_DEVICE T kr_sign(T x) { return T((T(0) < x) - (x < T(0))); }
KR_DEVICE bool kr_sign(bool x) { return x; }

KR_DEVICE bool kr_isnan(float x) { return x != x; }
KR_DEVICE bool kr_isnan(double x) { return x != x; }
template <class T> KR_DEVICE bool kr_isnan(T) { return false; }
KR_DEVICE bool kr_isinf(float x) { return fabsf(x) == kr_inf_f(); }
KR_DEVICE bool kr_isinf(double x) { return fabs(x) == kr_inf_d(); }
template <class T> KR_DEVICE bool kr_isinf(T) { return false; }

// ---------------------------------------------------------------------------------------------
// Binary math.
KR_DEVICE float kr_pow(float a, float b) { return powf(a, b); }
KR_DEVICE double kr_pow(double a, double b) { return pow(a, b); }

// NaN-propagating like torch.maximum / torch.minimum (and amax / amin).
KR_DEVICE float kr_maximum(float a, float b) { return (a != a || b != b) ? kr_nan_f() : fmaxf(a, b); }
KR_DEVICE double kr_maximum(double a, double b) { return (a != a || b != b) ? kr_nan_d() : fmax(a, b); }
KR_DEVICE float kr_minimum(float a, float b) { return (a != a || b != b) ? kr_nan_f() : fminf(a, b); }
KR_DEVICE double kr_minimum(double a, double b) { return (a != a || b != b) ? kr_nan_d() : fmin(a, b); }
template <class T> KR_DEVICE T kr_maximum(T a, T b) { return a < b ? b : a; }
template <class T> KR_DEVICE T kr_minimum(T a, T b) { return b < a ? b : a; }

// argmax / argmin as a max / min of int64 keys, as kr_cpu.h defines them: the warp, block and
// cluster all-reduces combine (value, position) pairs by an integer max / min, which keeps the
// first position of the extreme value (the first NaN if any) however the threads split a row.
KR_DEVICE int64_t kr_arg_order(float x) {
  const int i = __float_as_int(x == 0.0f ? 0.0f : x);
  return i < 0 ? (i ^ 0x7fffffff) : i;
}
template <class T> KR_DEVICE int64_t kr_arg_order(T x) { return static_cast<int64_t>(x); }
KR_DEVICE int64_t kr_arg_key(int64_t order, int64_t low) { return order * 4294967296L + low; }
template <class T> KR_DEVICE int64_t kr_argmax_key(T x, int64_t i) {
  return kr_arg_key(x != x ? 2147483647L : kr_arg_order(x), 4294967295L - i);
}
template <class T> KR_DEVICE int64_t kr_argmin_key(T x, int64_t i) {
  return kr_arg_key(x != x ? -2147483647L - 1 : kr_arg_order(x), i);
}
KR_DEVICE int64_t kr_argmax_index(int64_t key) { return 4294967295L - (key & 4294967295L); }
KR_DEVICE int64_t kr_argmin_index(int64_t key) { return key & 4294967295L; }

// A gather's index (codegen/lower.cpp, KernelGen::gathered): one outside [0, n) ends the kernel
// with an error, as eager's device-side assert does, instead of reading out of bounds.
KR_DEVICE int64_t kr_check_index(int64_t i, int64_t n) {
  if ((uint64_t)i >= (uint64_t)n) __trap();
  return i;
}

KR_DEVICE float kr_fmod(float a, float b) { return fmodf(a, b); }
KR_DEVICE double kr_fmod(double a, double b) { return fmod(a, b); }

// Python's a % b on floats: the result takes the sign of b.
template <class T> KR_DEVICE T kr_remainder_fp(T a, T b) {
  T mod = fmod(a, b);
  if (mod != T(0) && ((b < T(0)) != (mod < T(0)))) mod += b;
  return mod;
}
KR_DEVICE float kr_remainder(float a, float b) { return kr_remainder_fp(a, b); }
KR_DEVICE double kr_remainder(double a, double b) { return kr_remainder_fp(a, b); }

// ATen's div_floor_floating.
template <class T> KR_DEVICE T kr_floor_divide_fp(T a, T b) {
  if (b == T(0)) return a / b;
  const T mod = fmod(a, b);
  T div = (a - mod) / b;
  if (mod != T(0) && ((b < T(0)) != (mod < T(0)))) div -= T(1);
  if (div != T(0)) {
    T floordiv = floor(div);
    if (div - floordiv > T(0.5)) floordiv += T(1);
    return floordiv;
  }
  return copysign(T(0), a / b);
}
KR_DEVICE float kr_floor_divide(float a, float b) { return kr_floor_divide_fp(a, b); }
KR_DEVICE double kr_floor_divide(double a, double b) { return kr_floor_divide_fp(a, b); }

// ---------------------------------------------------------------------------------------------
// Reductions. The op numbers follow kir::ReduceOp.
#define KR_SUM 0
#define KR_PROD 1
#define KR_MAX 2
#define KR_MIN 3

template <class T> KR_DEVICE T kr_lowest();
template <class T> KR_DEVICE T kr_highest();
#define KR_LIMITS(T, lo, hi)                                                                     \
  template <> KR_DEVICE T kr_lowest<T>() { return lo; }                                          \
  template <> KR_DEVICE T kr_highest<T>() { return hi; }
KR_LIMITS(float, -kr_inf_f(), kr_inf_f())
KR_LIMITS(double, -kr_inf_d(), kr_inf_d())
KR_LIMITS(bool, false, true)
KR_LIMITS(uint8_t, 0, 255)
KR_LIMITS(int8_t, -128, 127)
KR_LIMITS(int16_t, -32768, 32767)
KR_LIMITS(int32_t, -2147483647 - 1, 2147483647)
KR_LIMITS(int64_t, -9223372036854775807L - 1, 9223372036854775807L)
#undef KR_LIMITS

template <int OP, class T> KR_DEVICE T kr_identity() {
  if constexpr (OP == KR_SUM) return T(0);
  else if constexpr (OP == KR_PROD) return T(1);
  else if constexpr (OP == KR_MAX) return kr_lowest<T>();
  else return kr_highest<T>();
}

template <int OP, class T> KR_DEVICE T kr_combine(T a, T b) {
  if constexpr (OP == KR_SUM) return a + b;
  else if constexpr (OP == KR_PROD) return a * b;
  else if constexpr (OP == KR_MAX) return kr_maximum(a, b);
  else return kr_minimum(a, b);
}

// Warp shuffles for every accumulator type (narrow integers and bool travel as int).
KR_DEVICE float kr_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
KR_DEVICE double kr_shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
KR_DEVICE long kr_shfl_xor(long v, int m) {
  return static_cast<long>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), m));
}
KR_DEVICE unsigned long kr_shfl_xor(unsigned long v, int m) {
  return static_cast<unsigned long>(
      __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(v), m));
}
template <class T> KR_DEVICE T kr_shfl_xor(T v, int m) {
  return static_cast<T>(__shfl_xor_sync(0xffffffffu, static_cast<int>(v), m));
}

// All-reduce over aligned groups of WIDTH lanes (a power of two <= 32) of a fully active warp.
// The xor butterfly gives every lane the same bits (each step combines the same two values).
template <int OP, int WIDTH, class T> KR_DEVICE T kr_warp_allreduce(T v) {
#pragma unroll
  for (int m = WIDTH / 2; m >= 1; m /= 2) v = kr_combine<OP, T>(v, kr_shfl_xor(v, m));
  return v;
}

// Shuffles up (from lane - d) and from a given lane, for the scan's accumulator types.
KR_DEVICE float kr_shfl_up(float v, unsigned d) { return __shfl_up_sync(0xffffffffu, v, d); }
KR_DEVICE double kr_shfl_up(double v, unsigned d) { return __shfl_up_sync(0xffffffffu, v, d); }
KR_DEVICE long kr_shfl_up(long v, unsigned d) {
  return static_cast<long>(__shfl_up_sync(0xffffffffu, static_cast<long long>(v), d));
}
template <class T> KR_DEVICE T kr_shfl_up(T v, unsigned d) {
  return static_cast<T>(__shfl_up_sync(0xffffffffu, static_cast<int>(v), d));
}
KR_DEVICE float kr_shfl_idx(float v, int l) { return __shfl_sync(0xffffffffu, v, l); }
KR_DEVICE double kr_shfl_idx(double v, int l) { return __shfl_sync(0xffffffffu, v, l); }
KR_DEVICE long kr_shfl_idx(long v, int l) {
  return static_cast<long>(__shfl_sync(0xffffffffu, static_cast<long long>(v), l));
}
template <class T> KR_DEVICE T kr_shfl_idx(T v, int l) {
  return static_cast<T>(__shfl_sync(0xffffffffu, static_cast<int>(v), l));
}

// Inclusive prefix sum over a 1-d block of NT threads (a multiple of 32, NT <= 1024), in thread
// order; `total` gets the sum of all NT values in every thread. `smem` holds 32 values of T.
// Every thread of the block must call it. It starts with a barrier, so back-to-back calls may
// share `smem`. (The block scan schedule of cumsum, cuda_scan.cpp.)
template <int NT, class T> KR_DEVICE T kr_block_inclusive_scan(T v, T* smem, T& total) {
  static_assert(NT % 32 == 0 && NT <= 1024, "whole warps, at most 1024 threads");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (unsigned d = 1; d < 32; d *= 2) {
    const T n = kr_shfl_up(v, d);
    if (lane >= (int)d) v += n;
  }
  if constexpr (NT == 32) {
    total = kr_shfl_idx(v, 31);
  } else {
    constexpr int kWarps = NT / 32;
    __syncthreads();
    if (lane == 31) smem[warp] = v;
    __syncthreads();
    // Every warp scans the warps' sums itself: no third barrier.
    T w = lane < kWarps ? smem[lane] : T(0);
#pragma unroll
    for (unsigned d = 1; d < kWarps; d *= 2) {
      const T n = kr_shfl_up(w, d);
      if (lane >= (int)d) w += n;
    }
    total = kr_shfl_idx(w, kWarps - 1);
    const T before = kr_shfl_idx(w, warp > 0 ? warp - 1 : 0);
    if (warp > 0) v += before;
  }
  return v;
}

// All-reduce over a 1-d block of NT threads (a power of two, NT <= 1024); every thread gets the
// result. `smem` holds 32 values of T (256 bytes cover every accumulator type). Every thread of
// the block must call it. It starts with a barrier, so back-to-back calls may share `smem`.
template <int OP, int NT, class T> KR_DEVICE T kr_block_allreduce(T v, void* smem) {
  constexpr int kWarp = NT < 32 ? NT : 32;
  v = kr_warp_allreduce<OP, kWarp, T>(v);
  if constexpr (NT > 32) {
    constexpr int kWarps = NT / 32;
    T* partial = static_cast<T*>(smem);
    const int lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    // Every warp reduces all partials itself: the result reaches every thread without
    // another barrier.
    v = kr_warp_allreduce<OP, kWarps, T>(partial[lane & (kWarps - 1)]);
  }
  return v;
}

// All-reduce over the threadIdx.y of a 32 x NY block (the column schedule: threadIdx.x is a
// point, threadIdx.y a part of its reduction); every thread of a column gets the result, the
// parts combined in threadIdx.y order. `smem` holds 32 * NY values of T. Every thread of the
// block must call it. It starts with a barrier, so back-to-back calls may share `smem`.
template <int OP, int NY, class T> KR_DEVICE T kr_column_allreduce(T v, T* smem) {
  __syncthreads();
  smem[threadIdx.y * 32 + threadIdx.x] = v;
  __syncthreads();
  T r = smem[threadIdx.x];
#pragma unroll
  for (int j = 1; j < NY; ++j) r = kr_combine<OP, T>(r, smem[j * 32 + threadIdx.x]);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Thread-block clusters (sm_90+; kernels declared with __cluster_dims__).
#if __CUDA_ARCH__ >= 900
KR_DEVICE unsigned kr_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Every thread of every block of the cluster: writes before it are visible to all after it.
KR_DEVICE void kr_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
               :
               :
               : "memory");
}
// The address of `p` (this block's shared memory) in block `rank` of the cluster.
template <class T> KR_DEVICE const T* kr_map_rank(const T* p, unsigned rank) {
  unsigned long long r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(p), "r"(rank));
  return reinterpret_cast<const T*>(r);
}
// All-reduce of a value every thread of each block already holds (kr_block_allreduce's result)
// over the C blocks of the cluster (C <= 16). `slots`: two shared words per block, used
// alternately (`phase` flips): a block may write the next slot while a slower one still reads
// the previous, never the same one, since a cluster barrier separates them. Lane l of every warp
// reads block l % C's value (one remote read per lane, not C per thread) and the warp combines
// them with the xor butterfly over C lanes: the same values in the same tree in every warp of
// every block, so every block gets the same bits. The kernel ends with kr_cluster_sync() so
// that no block leaves while its slots are read.
template <int OP, int C, class T> KR_DEVICE T kr_cluster_allreduce(T v, long long* slots,
                                                                   int& phase) {
  static_assert(sizeof(T) <= sizeof(long long), "accumulators are at most 8 bytes");
  static_assert(C >= 2 && C <= 16 && (C & (C - 1)) == 0, "clusters of 2..16 blocks");
  T* slot = reinterpret_cast<T*>(slots + phase);
  phase ^= 1;
  if (threadIdx.x == 0) *slot = v;
  kr_cluster_sync();
  const T r = *kr_map_rank(slot, (threadIdx.x & 31) % C);
  return kr_warp_allreduce<OP, C, T>(r);
}

// The column schedule over a cluster of C blocks along y (each block sums its share of every
// column's rows): each block's 32 column partials (kr_column_allreduce's results) go to a
// shared row of slots; after a cluster barrier every thread combines its column's C partials
// from the blocks of the cluster in rank order, the same order in every block, so every block
// gets the same bits. Two rows of slots alternate (`phase`), as in kr_cluster_allreduce; the
// kernel ends with kr_cluster_sync() so that no block leaves while its slots are read.
template <int OP, int C, class T> KR_DEVICE T kr_cluster_column_allreduce(T v, long long* slots,
                                                                          int& phase) {
  static_assert(sizeof(T) <= sizeof(long long), "accumulators are at most 8 bytes");
  static_assert(C >= 2 && C <= 16, "clusters of 2..16 blocks");
  T* slot = reinterpret_cast<T*>(slots + phase * 32) + threadIdx.x;
  phase ^= 1;
  if (threadIdx.y == 0) *slot = v;
  kr_cluster_sync();
  T r = *kr_map_rank(slot, 0);
#pragma unroll
  for (int c = 1; c < C; ++c) r = kr_combine<OP, T>(r, *kr_map_rank(slot, c));
  return r;
}

// The cluster all-reduce without block or cluster barriers (the kernel sets it up with
// kr_cluster_reduce_init). Every warp reduces its threads' values; lane c < C sends the warp's
// value to block c's buffer with st.async, which completes the bytes on that block's mbarrier;
// each block's threads wait for its NT / 32 * C values and every warp combines them in the same
// positions and order, so every block gets the same bits. Two buffers and barriers alternate
// by round: a block can be at most one round ahead of another (a round completes only when
// every warp of every block sent its value, which each does after reading the previous round),
// so a round never writes into a buffer that is still being read. `round` counts the calls.
// The kernel ends with kr_cluster_sync() so that no block leaves while values are in flight.
KR_DEVICE unsigned kr_smem_addr(const void* p) {
  unsigned long long a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return static_cast<unsigned>(a);
}
KR_DEVICE void kr_cluster_reduce_init(unsigned long long* bars) {
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" : : "r"(kr_smem_addr(bars)) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" : : "r"(kr_smem_addr(bars + 1))
                 : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
  }
  kr_cluster_sync(); // no block sends before every block's barriers exist
}
template <int NT, int C, class T, class R>
KR_DEVICE T kr_cluster_allreduce_with(T v, const R& red, long long* bufs,
                                      unsigned long long* bars, unsigned& round) {
  static_assert(sizeof(T) <= sizeof(long long), "accumulators are at most 8 bytes");
  static_assert(NT >= 32 && C >= 2 && C <= 16, "whole warps, clusters of 2..16 blocks");
  constexpr int N = NT / 32 * C; // values per round (a power of two)
  constexpr int W = N < 32 ? N : 32;
  const unsigned slot = round & 1u, parity = (round >> 1) & 1u;
  ++round;
  v = red.warp(v);
  long long* buf = bufs + slot * N;
  const unsigned bar = kr_smem_addr(bars + slot);
  const unsigned lane = threadIdx.x & 31u;
  if (threadIdx.x == 0) {
    unsigned long long state;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;"
                 : "=l"(state)
                 : "r"(bar), "r"(static_cast<unsigned>(N * sizeof(long long)))
                 : "memory");
    (void)state;
  }
  if (lane < C) {
    union {
      T t;
      long long b;
    } bits;
    bits.b = 0;
    bits.t = v;
    const unsigned at = kr_smem_addr(buf + (threadIdx.x >> 5) * C + kr_cluster_rank());
    unsigned rat, rbar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rat) : "r"(at), "r"(lane));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rbar) : "r"(bar), "r"(lane));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                 : : "r"(rat), "l"(bits.b), "r"(rbar) : "memory");
  }
  // Acquire at cluster scope: the other blocks' st.async bytes complete with a release at
  // cluster scope, and the one-round-ahead argument above rests on that ordering.
  unsigned done = 0;
  do {
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
  auto at = [&](unsigned i) {
    union {
      T t;
      long long b;
    } u;
    u.b = buf[i];
    return u.t;
  };
  return red.template all<W, N>(at, lane);
}

// How a cluster all-reduce combines: R::warp(v) all-reduces a full warp's values; R::all<W, N>
// combines the N warps' results (at(i)), lane l taking l, l + W, ... and W lanes finishing.
// kr_fold_reducer builds `all` from R::fold(r, x, j) (adds a warp's result x to r, which holds j
// warps' results) and R::lanes<W>(v, j) (all-reduces groups of W lanes holding j results each).
template <class R> struct kr_fold_reducer {
  template <int W, int N, class At> KR_DEVICE auto all(At at, unsigned lane) const {
    const R& red = static_cast<const R&>(*this);
    auto r = at(lane & (W - 1));
#pragma unroll
    for (unsigned i = (lane & (W - 1)) + W, j = 1; i < N; i += W, ++j) r = red.fold(r, at(i), j);
    return red.template lanes<W>(r, N / W);
  }
};
template <int OP, class T> struct kr_op_reducer : kr_fold_reducer<kr_op_reducer<OP, T>> {
  KR_DEVICE T warp(T v) const { return kr_warp_allreduce<OP, 32, T>(v); }
  KR_DEVICE T fold(T r, T x, int) const { return kr_combine<OP, T>(r, x); }
  template <int W> KR_DEVICE T lanes(T v, int) const { return kr_warp_allreduce<OP, W, T>(v); }
};
template <int OP, int NT, int C, class T>
KR_DEVICE T kr_cluster_allreduce_async(T v, long long* bufs, unsigned long long* bars,
                                       unsigned& round) {
  return kr_cluster_allreduce_with<NT, C>(v, kr_op_reducer<OP, T>{}, bufs, bars, round);
}

// A variance in one all-reduce round: the sum s of a partition's values and the sum q of their
// squared deviations from the partition's mean s / n. Partitions of n and m values merge as
// (Chan, Golub, LeVeque): s = s1 + s2, q = q1 + q2 + (s2 / m - s1 / n)^2 * n m / (n + m); the
// merge is symmetric to the bit, so the xor butterfly still gives every lane the same bits.
// Every thread's partition holds `n` values (`kr_moments_reducer::n`).
template <class T> struct kr_moments {
  T s, q;
};
template <class T> KR_DEVICE kr_moments<T> kr_merge_moments(kr_moments<T> a, kr_moments<T> b,
                                                             T n, T m) {
  const T d = b.s / m - a.s / n;
  return {a.s + b.s, a.q + b.q + d * d * (n * m / (n + m))};
}
template <int WIDTH, class T> KR_DEVICE kr_moments<T> kr_warp_moments(kr_moments<T> v, T n) {
#pragma unroll
  for (int m = WIDTH / 2; m >= 1; m /= 2, n *= 2)
    v = kr_merge_moments<T>(v, {kr_shfl_xor(v.s, m), kr_shfl_xor(v.q, m)}, n, n);
  return v;
}
template <class T> struct kr_moments_reducer : kr_fold_reducer<kr_moments_reducer<T>> {
  T n; // values per thread
  KR_DEVICE kr_moments<T> warp(kr_moments<T> v) const { return kr_warp_moments<32, T>(v, n); }
  KR_DEVICE kr_moments<T> fold(kr_moments<T> r, kr_moments<T> x, int j) const {
    return kr_merge_moments<T>(r, x, T(j) * 32 * n, T(32) * n);
  }
  template <int W> KR_DEVICE kr_moments<T> lanes(kr_moments<T> v, int j) const {
    return kr_warp_moments<W, T>(v, T(j) * 32 * n);
  }
};
// The cluster's (sum, squared deviations from the mean) from each thread's, over `n` values.
template <int NT, int C, class T>
KR_DEVICE kr_moments<T> kr_cluster_moments_async(kr_moments<T> v, T n, long long* bufs,
                                                 unsigned long long* bars, unsigned& round) {
  return kr_cluster_allreduce_with<NT, C>(v, kr_moments_reducer<T>{{}, n}, bufs, bars, round);
}

// Softmax's max and sum of exponentials in one all-reduce round: a partition's max m and the sum
// s of exp(x - m) over its values. Partitions combine in two steps, so that no exp waits on
// another: the max M of their maxes, then the sum of s_i exp(m_i - M) (a factor of 1 where
// m_i == M: an all -inf partition keeps 0, not NaN). Any counts.
template <class T> struct kr_max_expsum {
  T m, s;
};
template <class T> KR_DEVICE T kr_expsum_scaled(kr_max_expsum<T> v, T m) {
  return v.m == m ? v.s : v.s * kr_exp(v.m - m);
}
template <class T> struct kr_expsum_reducer {
  KR_DEVICE kr_max_expsum<T> warp(kr_max_expsum<T> v) const {
    const T m = kr_warp_allreduce<KR_MAX, 32, T>(v.m);
    return {m, kr_warp_allreduce<KR_SUM, 32, T>(kr_expsum_scaled(v, m))};
  }
  template <int W, int N, class At>
  KR_DEVICE kr_max_expsum<T> all(At at, unsigned lane) const {
    constexpr int K = N / W; // results per lane
    kr_max_expsum<T> r[K];
#pragma unroll
    for (int i = 0; i < K; ++i) r[i] = at((lane & (W - 1)) + i * W);
    T m = r[0].m;
#pragma unroll
    for (int i = 1; i < K; ++i) m = kr_maximum(m, r[i].m);
    m = kr_warp_allreduce<KR_MAX, W, T>(m);
    T s = kr_expsum_scaled(r[0], m);
#pragma unroll
    for (int i = 1; i < K; ++i) s += kr_expsum_scaled(r[i], m);
    return {m, kr_warp_allreduce<KR_SUM, W, T>(s)};
  }
};
template <int NT, int C, class T>
KR_DEVICE kr_max_expsum<T> kr_cluster_expsum_async(kr_max_expsum<T> v, long long* bufs,
                                                   unsigned long long* bars, unsigned& round) {
  return kr_cluster_allreduce_with<NT, C>(v, kr_expsum_reducer<T>{}, bufs, bars, round);
}

// Asynchronous copies global -> shared (sm_80+): BYTES (4, 8 or 16) from `g` to `s`, this
// thread's; kr_cp_async_wait_all() makes this thread's copies complete and visible to it.
template <int BYTES> KR_DEVICE void kr_cp_async(void* s, const void* g) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
  unsigned long long sa;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(sa) : "l"(s));
  if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "l"(sa), "l"(g) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" : : "l"(sa), "l"(g), "n"(BYTES)
                 : "memory");
}
KR_DEVICE void kr_cp_async_commit() { asm volatile("cp.async.commit_group;" : : : "memory"); }
KR_DEVICE void kr_cp_async_wait_all() { asm volatile("cp.async.wait_all;" : : : "memory"); }
#endif

// ---------------------------------------------------------------------------------------------
// Vectorized access: N elements of T in one aligned load/store (16 bytes -> one 128-bit
// instruction). The caller guarantees the address is a multiple of sizeof(T) * N.
template <class T, int N> struct alignas(sizeof(T) * N) kr_vec {
  T v[N];
};
template <class T, int N> KR_DEVICE kr_vec<T, N> kr_load_vec(const T* p) {
  return *reinterpret_cast<const kr_vec<T, N>*>(p);
}
template <class T, int N> KR_DEVICE void kr_store_vec(T* p, const kr_vec<T, N>& v) {
  *reinterpret_cast<kr_vec<T, N>*>(p) = v;
}
// The same for 16-byte vectors, with cache hints, for buffers that no other pointer of the
// kernel writes: H = 1, a line read once (L1::evict_first); H = 2, a line read again by later
// rows (L1::evict_last). Plain loads before sm_70 or PTX 7.4 (NVRTC 11.4). kr_store_vec_cs
// streams (st.global.cs).
template <int H, class T, int N> KR_DEVICE kr_vec<T, N> kr_load_vec_hint(const T* p) {
  static_assert(H == 1 || H == 2, "kr_load_vec_hint: H is 1 (evict first) or 2 (evict last)");
  static_assert(sizeof(kr_vec<T, N>) == 16, "kr_load_vec_hint: 16-byte vectors");
#if __CUDA_ARCH__ >= 700 && (__CUDACC_VER_MAJOR__ > 11 || __CUDACC_VER_MINOR__ >= 4)
  kr_vec<unsigned, 4> r;
  if constexpr (H == 1)
    asm("ld.global.nc.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.v[0]), "=r"(r.v[1]), "=r"(r.v[2]), "=r"(r.v[3]) : "l"(p));
  else
    asm("ld.global.nc.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.v[0]), "=r"(r.v[1]), "=r"(r.v[2]), "=r"(r.v[3]) : "l"(p));
  return *reinterpret_cast<const kr_vec<T, N>*>(&r);
#else
  return kr_load_vec<T, N>(p);
#endif
}
template <class T, int N> KR_DEVICE void kr_store_vec_cs(T* p, const kr_vec<T, N>& v) {
  static_assert(sizeof(kr_vec<T, N>) == 16, "kr_store_vec_cs: 16-byte vectors");
  const kr_vec<unsigned, 4> u = *reinterpret_cast<const kr_vec<unsigned, 4>*>(&v);
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
               : : "l"(p), "r"(u.v[0]), "r"(u.v[1]), "r"(u.v[2]), "r"(u.v[3]) : "memory");
}
// Register row caches of float16 / bfloat16 rows keep the stored bits two values to a 32-bit
// word (value i in the low half of word i / 2 when i is even, else the high half).
template <int N> KR_DEVICE void kr_put_words(unsigned* w, const kr_vec<uint16_t, N>& v) {
  const kr_vec<unsigned, N / 2> u = *reinterpret_cast<const kr_vec<unsigned, N / 2>*>(&v);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) w[i] = u.v[i];
}
KR_DEVICE uint16_t kr_word_half(unsigned w, int hi) {
  return hi ? static_cast<uint16_t>(w >> 16) : static_cast<uint16_t>(w & 0xffffu);
}
// N float lanes rounded to bfloat16 two at a time, packed for one N * 2-byte store.
template <int N> KR_DEVICE kr_vec<unsigned, N / 2> kr_pack_bf16(const float (&f)[N]) {
  kr_vec<unsigned, N / 2> r;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) r.v[i] = kr_f2bf2(f[2 * i], f[2 * i + 1]);
  return r;
}

// An index kept in bounds (kir::ExprKind::Clamp: a cat's part read where it may not hold the
// element; the value read is then not used).
KR_DEVICE int64_t kr_clamp_index(int64_t i, int64_t lo, int64_t hi) {
  return i < lo ? lo : i > hi ? hi : i;
}

// ---- random draws (codegen/lower.cpp, KernelGen::uniform) -------------------------------------
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the generator of torch's CUDA draws and of cuRAND): the block at counter (offset's low
// and high words, stream, 0) under key (seed's low and high words). A draw is a pure function
// of (seed, offset, stream): an element recomputed in another kernel of the same region draws
// the same number. `offset` is the element's position in its tensor (row-major), `stream`
// tells the region's random tensors apart, the seed comes from torch's generator (prim_seed).
struct kr_u32x4 {
  uint32_t x, y, z, w;
};
KR_DEVICE kr_u32x4 kr_philox(int64_t seed, int64_t offset, int64_t stream) {
  uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32);
  uint32_t c2 = (uint32_t)stream, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t n0 = __umulhi(0xCD9E8D57u, c2) ^ c1 ^ k0, n2 = __umulhi(0xD2511F53u, c0) ^ c3 ^ k1;
    c1 = 0xCD9E8D57u * c2;
    c3 = 0xD2511F53u * c0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  kr_u32x4 out = {c0, c1, c2, c3};
  return out;
}
// Uniform on [0, 1) with `bits` random bits (24 for float32, 11 for float16, 8 for bfloat16:
// every value is exact in the result's dtype, so none rounds up to 1).
// One Philox block gives four 32-bit words: element `offset` of a stream takes word offset % 4
// of block offset / 4 (two words, block offset / 2, where it needs 64 bits), so the elements
// a thread computes side by side share one block (the compiler merges the equal calls).
KR_DEVICE uint32_t kr_philox_word(kr_u32x4 r, int64_t i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}
KR_DEVICE float kr_philox_uniform(int64_t seed, int64_t offset, int64_t stream, int64_t bits) {
  uint32_t x = kr_philox_word(kr_philox(seed, offset >> 2, stream), offset & 3);
  return (float)(x >> (32 - bits)) * (1.0f / (float)(1u << bits));
}
KR_DEVICE double kr_philox_uniform64(int64_t seed, int64_t offset, int64_t stream) {
  kr_u32x4 r = kr_philox(seed, offset >> 1, stream);
  uint32_t hi = (offset & 1) ? r.z : r.x, lo = (offset & 1) ? r.w : r.y;
  return (double)(((uint64_t)hi << 21) | (lo >> 11)) * 0x1p-53;
}
// Standard normal by Box-Muller: u1 in (0, 1] (its log is finite), u2 in [0, 1).
KR_DEVICE float kr_philox_normal(int64_t seed, int64_t offset, int64_t stream) {
  kr_u32x4 r = kr_philox(seed, offset >> 1, stream);
  uint32_t a = (offset & 1) ? r.z : r.x, b = (offset & 1) ? r.w : r.y;
  float u1 = (float)((a >> 8) + 1u) * 0x1p-24f;
  float u2 = (float)(b >> 8) * 0x1p-24f;
  return kr_sqrt(-2.0f * kr_log(u1)) * kr_cos(6.28318530717958648f * u2);
}
KR_DEVICE double kr_philox_normal64(int64_t seed, int64_t offset, int64_t stream) {
  kr_u32x4 r = kr_philox(seed, offset, stream);
  double u1 = (double)((((uint64_t)r.x << 21) | (r.y >> 11)) + 1u) * 0x1p-53;
  double u2 = (double)(((uint64_t)r.z << 21) | (r.w >> 11)) * 0x1p-53;
  return kr_sqrt(-2.0 * kr_log(u1)) * kr_cos(6.28318530717958647692 * u2);
}

#undef KR_DEVICE
#endif // KERAUNOS_KR_CUDA_CUH

// kr_cpu.h: the helper library every generated CPU kernel starts with (embedded at build time,
// codegen/embedded.h). Kernels are built with -O3 -march=native -ffp-contract=off and without
// -ffast-math, so glibc's scalar expf/logf/... would keep `out[i] = f(in[i])` loops scalar.
// The float32 transcendentals here are therefore branch-free (range reduction, polynomials,
// bit manipulation through memcpy, special values by selects) so that GCC vectorizes them;
// they are within a few ulp of the correctly rounded result. float64 versions call <cmath>.
// Rounding, sign, min/max, fmod, remainder, floor_divide and the 16-bit float conversions are
// bitwise what eager PyTorch computes on the CPU.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// std::fma vectorizes to one instruction where the target has FMA; elsewhere it would be a
// library call, so the polynomials fall back to a multiply and an add.
#if defined(__FMA__) || defined(__FMA4__) || defined(__aarch64__)
#define KR_FMAF(a, b, c) std::fma((a), (b), (c))
#else
#define KR_FMAF(a, b, c) ((a) * (b) + (c))
#endif

// ---- bits and constants -----------------------------------------------------------------------

static inline uint32_t kr_fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
static inline float kr_bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
static inline uint64_t kr_dbits(double f) {
  uint64_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
static inline double kr_bitsd(uint64_t u) {
  double f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// c ? a : b. GCC turns selects into branches and then sinks the computation of a value that
// one branch does not use into the other; under -ftrapping-math (the default) such a
// conditional, possibly trapping operation keeps the loop scalar (log, sin, tan). Kernels built
// with -fno-trapping-math (which changes no result) vectorize all of them. Bit-mask blends do
// not help: GCC folds them back into selects.
static inline float kr_self(bool c, float a, float b) { return c ? a : b; }
static inline double kr_seld(bool c, double a, double b) { return c ? a : b; }
static inline float kr_inf_f() { return std::numeric_limits<float>::infinity(); }
static inline float kr_nan_f() { return std::numeric_limits<float>::quiet_NaN(); }
static inline double kr_inf_d() { return std::numeric_limits<double>::infinity(); }
static inline double kr_nan_d() { return std::numeric_limits<double>::quiet_NaN(); }

// 2^n for integer n in [-126, 127], built from the exponent field.
static inline float kr_pow2i(int32_t n) { return kr_bitsf(static_cast<uint32_t>(n + 127) << 23); }

// ---- exp family (float) -------------------------------------------------------------------------

// exp(r) - 1 for |r| <= ~0.35 (Taylor to r^7; error < 0.3 ulp of the result).
static inline float kr_expm1_poly(float r) {
  float p = 1.98412698e-4f;
  p = KR_FMAF(p, r, 1.38888889e-3f);
  p = KR_FMAF(p, r, 8.33333333e-3f);
  p = KR_FMAF(p, r, 4.16666667e-2f);
  p = KR_FMAF(p, r, 1.66666667e-1f);
  p = KR_FMAF(p, r, 0.5f);
  return KR_FMAF(p * r, r, r);
}

// x = n*ln2 + r with |r| <= ~ln2/2; n is an integer returned both as float and int. x must be
// clamped to |x| < 2^21 by the caller (the rounding constant then keeps n in the mantissa).
static inline float kr_reduce_ln2(float x, float* nf, int32_t* ni) {
  const float kShift = 12582912.0f; // 1.5 * 2^23: adding it rounds to an integer
  float t = x * 1.44269504088896341f + kShift;
  *ni = static_cast<int32_t>(kr_fbits(t) - kr_fbits(kShift));
  float n = t - kShift;
  *nf = n;
  // Cody-Waite: n * 0.693359375 is exact for |n| < 2^15.
  return (x - n * 0.693359375f) - n * -2.12194440e-4f;
}

static inline float kr_exp(float x) {
  // Outside [-104, 89] the result is 0 or inf anyway; NaN passes the clamp (comparisons fail).
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  float nf;
  int32_t n;
  float r = kr_reduce_ln2(xc, &nf, &n);
  float p = kr_expm1_poly(r) + 1.0f;
  // n in [-150, 128]: two factors keep each power of two normal; one final rounding.
  int32_t n1 = n >> 1;
  return (p * kr_pow2i(n1)) * kr_pow2i(n - n1);
}
static inline double kr_exp(double x) { return std::exp(x); }

static inline float kr_exp2(float x) {
  float xc = x < -151.0f ? -151.0f : x;
  xc = xc > 129.0f ? 129.0f : xc;
  const float kShift = 12582912.0f;
  float t = xc + kShift;
  int32_t n = static_cast<int32_t>(kr_fbits(t) - kr_fbits(kShift));
  float r = (xc - (t - kShift)) * 0.693147180559945309f; // exact difference, |r| <= ln2/2
  float p = kr_expm1_poly(r) + 1.0f;
  int32_t n1 = n >> 1;
  return (p * kr_pow2i(n1)) * kr_pow2i(n - n1);
}
static inline double kr_exp2(double x) { return std::exp2(x); }

static inline float kr_expm1(float x) {
  // Below -25 the result rounds to -1; above 89 it is inf.
  float xc = x < -25.0f ? -25.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  float nf;
  int32_t n;
  float r = kr_reduce_ln2(xc, &nf, &n); // n in [-36, 128]; n == 0 gives r == x exactly
  float p = kr_expm1_poly(r);
  // 2^n * (p + 1) - 1 = 2 * (h*p + (h - 0.5)) with h = 2^(n-1) (normal for all n here).
  float h = kr_pow2i(n - 1);
  float y = (h * p + (h - 0.5f)) * 2.0f;
  return kr_self(x == 0.0f, x, y); // keeps -0
}
static inline double kr_expm1(double x) { return std::expm1(x); }

// ---- log family (float) -------------------------------------------------------------------------

// For finite x > 0: x = 2^e * (1 + f) with 1 + f in [sqrt(1/2), sqrt(2)); returns log1p(f)'s
// polynomial part so that log(x) = e*ln2 + f + tail.
static inline float kr_log_core(float x, float* ef, float* fout) {
  // Subnormals are scaled into the normal range first.
  bool sub = x < 1.17549435e-38f;
  float xs = x * (sub ? 8388608.0f : 1.0f); // 2^23; a select of constants, not of products
  uint32_t u = kr_fbits(xs);
  // Bias the split so the mantissa lands in [sqrt(1/2), sqrt(2)): 0x3f3504f3 = sqrt(1/2).
  uint32_t v = u - 0x3f3504f3u;
  int32_t e = static_cast<int32_t>(v) >> 23;
  float m = kr_bitsf((v & 0x007fffffu) + 0x3f3504f3u);
  *ef = static_cast<float>(e) - (sub ? 23.0f : 0.0f);
  float f = m - 1.0f;
  *fout = f;
  float z = f * f;
  // Cephes logf polynomial: log(1+f) = f - f^2/2 + f^3 * P(f).
  float p = 7.0376836292e-2f;
  p = KR_FMAF(p, f, -1.1514610310e-1f);
  p = KR_FMAF(p, f, 1.1676998740e-1f);
  p = KR_FMAF(p, f, -1.2420140846e-1f);
  p = KR_FMAF(p, f, 1.4249322787e-1f);
  p = KR_FMAF(p, f, -1.6668057665e-1f);
  p = KR_FMAF(p, f, 2.0000714765e-1f);
  p = KR_FMAF(p, f, -2.4999993993e-1f);
  p = KR_FMAF(p, f, 3.3333331174e-1f);
  return p * f * z - 0.5f * z; // log(1+f) - f
}

// Special values of log-like functions: log(+0) = -inf, log(<0) = NaN, log(+inf) = inf.
static inline float kr_log_special(float x, float y) {
  y = kr_self(x == kr_inf_f(), x, y);
  y = kr_self(x == 0.0f, -kr_inf_f(), y);
  y = kr_self(x < 0.0f, kr_nan_f(), y);
  return kr_self(x != x, x, y);
}

static inline float kr_log(float x) {
  float e, f;
  float t = kr_log_core(x, &e, &f);
  float y = (e * -2.12194440e-4f + t) + f;
  y = e * 0.693359375f + y;
  return kr_log_special(x, y);
}
static inline double kr_log(double x) { return std::log(x); }

static inline float kr_log2(float x) {
  float e, f;
  float t = kr_log_core(x, &e, &f);
  // log2(1+f) = (f + t) * log2(e), split so that f * log2(e) carries the low bits.
  const float kL = 1.44269504088896341f;
  float y = (t * kL + f * 4.4269504088896341e-1f) + f;
  y = y + e; // exact powers of two give e exactly
  return kr_log_special(x, y);
}
static inline double kr_log2(double x) { return std::log2(x); }

static inline float kr_log1p(float x) {
  float u = 1.0f + x;
  // log1p(x) = log(u) + (x - (u - 1)) / u: the correction restores what rounding u lost.
  float c = (x - (u - 1.0f)) / u;
  float e, f;
  float t = kr_log_core(u, &e, &f);
  float y = (e * -2.12194440e-4f + (t + c)) + f;
  y = e * 0.693359375f + y;
  y = kr_log_special(u, y);
  y = kr_self(x == kr_inf_f(), x, y);
  return kr_self(x == 0.0f, x, y); // keeps -0
}
static inline double kr_log1p(double x) { return std::log1p(x); }

// ---- trigonometric (float, evaluated in double) -------------------------------------------------

// x * 2/pi reduced mod 4, for every finite float x: 2/pi is split into seven 24-bit pieces so each
// product with x (24 bits) is exact in double. Each product is reduced exactly, in units of 4
// (the pieces are stored divided by 4, so the reduction is one rounding and one subtraction),
// before the sum. Branch-free and exact enough (absolute error ~1e-15) for |x| up to FLT_MAX.
static inline double kr_mod4_2overpi(float x) {
  const double kC[7] = {0xa2f983p-26,  0x6e4e44p-50,  0x1529fcp-74, 0x2757d1p-98,
                         0xf534ddp-122, 0xc0db62p-146, 0x95993cp-170};
  double xd = x, s = 0.0;
  for (int k = 0; k < 6; ++k) {
    double t = xd * kC[k];
    s += t - std::nearbyint(t);
  }
  // The last product is below 2^-18 for every float: nothing to reduce.
  s += xd * kC[6];
  return 4.0 * s;
}

// sin and cos of r in [-pi/4, pi/4] (double evaluation, float-accurate).
static inline double kr_sin_poly(double r) {
  double z = r * r;
  double p = 2.7557319223985893e-6;
  p = p * z - 1.9841269841269841e-4;
  p = p * z + 8.3333333333333333e-3;
  p = p * z - 1.6666666666666667e-1;
  return r + r * z * p;
}
static inline double kr_cos_poly(double r) {
  double z = r * r;
  double p = -2.7557319223985891e-7;
  p = p * z + 2.4801587301587302e-5;
  p = p * z - 1.3888888888888889e-3;
  p = p * z + 4.1666666666666667e-2;
  p = p * z - 0.5;
  return 1.0 + z * p;
}

// Quadrant q (0..3) and reduced argument r in [-pi/4, pi/4] of x.
static inline double kr_reduce_pio2(float x, int32_t* q) {
  double s = kr_mod4_2overpi(x);
  double n = std::nearbyint(s);
  double m = n >= 0 ? n : n + 16.0; // n in [-14, 14]; NaN (x inf or NaN) becomes 0
  *q = static_cast<int32_t>(m == m ? m : 0.0) & 3;
  return (s - n) * 1.5707963267948966;
}

// Where the kernel compiler links glibc's vector math library (the CPU compiler's probe adds
// -DKR_HAVE_MVEC=1 -lmvec; GCC only, whose `simd` attribute names the vector variants), sin,
// cos, tan and erf call it: GCC vectorizes each call into its SIMD variant (_ZGVdN8v_sinf on
// AVX2, _ZGVeN16v_sinf on AVX-512; at most 4 ulp, about 2 measured), 1.6-3.7x faster than the
// helpers below (benchmarks/bench_cpu_math.py). Arguments past about 1e5 take its scalar path.
#if defined(KR_HAVE_MVEC) && defined(__GNUC__) && !defined(__clang__)
#define KR_MVEC 1
extern "C" {
__attribute__((simd("notinbranch"))) float sinf(float) noexcept;
__attribute__((simd("notinbranch"))) float cosf(float) noexcept;
__attribute__((simd("notinbranch"))) float tanf(float) noexcept;
__attribute__((simd("notinbranch"))) float erff(float) noexcept;
}
static inline float kr_sin(float x) { return sinf(x); }
static inline float kr_cos(float x) { return cosf(x); }
static inline float kr_tan(float x) { return tanf(x); }
#else
static inline float kr_sin(float x) {
  int32_t q;
  double r = kr_reduce_pio2(x, &q);
  // Both polynomials are evaluated: an operation in one arm of a select only would be a
  // conditional (possibly trapping) operation, which keeps GCC from vectorizing the loop.
  double s = kr_sin_poly(r), c = kr_cos_poly(r);
  double v = kr_seld(q & 1, c, s);
  v = kr_seld(q & 2, -v, v);
  float y = static_cast<float>(v);
  return kr_self(std::fabs(x) < 2.44140625e-4f, x, y); // sin(x) rounds to x there; keeps -0
}

static inline float kr_cos(float x) {
  int32_t q;
  double r = kr_reduce_pio2(x, &q);
  double s = kr_sin_poly(r), c = kr_cos_poly(r);
  double v = kr_seld(q & 1, s, c);
  v = kr_seld((q + 1) & 2, -v, v);
  return static_cast<float>(v);
}

static inline float kr_tan(float x) {
  int32_t q;
  double r = kr_reduce_pio2(x, &q);
  double s = kr_sin_poly(r), c = kr_cos_poly(r);
  double v = kr_seld(q & 1, -c, s) / kr_seld(q & 1, s, c);
  float y = static_cast<float>(v);
  return kr_self(std::fabs(x) < 2.44140625e-4f, x, y);
}
#endif
static inline double kr_sin(double x) { return std::sin(x); }
static inline double kr_cos(double x) { return std::cos(x); }
static inline double kr_tan(double x) { return std::tan(x); }

// ---- tanh, sigmoid, erf (float) -----------------------------------------------------------------

static inline float kr_tanh(float x) {
  float ax = std::fabs(x);
  // Small |x|: odd polynomial (Cephes tanhf); larger: 1 - 2 / (exp(2|x|) + 1), which saturates
  // to 1 by itself (exp overflows to inf).
  float z = ax * ax;
  float p = -5.70498872745e-3f;
  p = KR_FMAF(p, z, 2.06390887954e-2f);
  p = KR_FMAF(p, z, -5.37397155531e-2f);
  p = KR_FMAF(p, z, 1.33314422036e-1f);
  p = KR_FMAF(p, z, -3.33332819422e-1f);
  float small = KR_FMAF(p * z, ax, ax);
  float big = 1.0f - 2.0f / (kr_exp(ax + ax) + 1.0f);
  float y = ax < 0.625f ? small : big;
  return std::copysign(y, x);
}
static inline double kr_tanh(double x) { return std::tanh(x); }

// 1 / (1 + exp(-x)) for x >= 0; exp(x) / (1 + exp(x)) below, which stays accurate where the
// result is tiny (eager's float32 kernel returns 0 below about -88.7; both are within tolerance).
static inline float kr_sigmoid(float x) {
  float e = kr_exp(-std::fabs(x));
  float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : e * r;
}
static inline double kr_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

#ifdef KR_MVEC
static inline float kr_erf(float x) { return erff(x); }
#else
static inline float kr_erf(float x) {
  float ax = std::fabs(x);
  // |x| < 1: erf(x) = x * P(x^2) (Chebyshev fit, relative error ~1e-9).
  float z = x * x;
  float a = 7.875875062685488e-05f;
  a = KR_FMAF(a, z, -8.01686428716587e-4f);
  a = KR_FMAF(a, z, 5.189087423433974e-3f);
  a = KR_FMAF(a, z, -2.6854212010626412e-2f);
  a = KR_FMAF(a, z, 1.1283594715160218e-1f);
  a = KR_FMAF(a, z, -3.7612626666720334e-1f);
  a = KR_FMAF(a, z, 1.1283791658483509f);
  float small = x * a;
  // 1 <= |x| < 3.92: erfc(x) = exp(-x^2 + g(x)), g = log(erfcx) fitted in t = x - 2.5 (absolute
  // error ~1e-8); erf = 1 - erfc. Beyond 3.92, erf rounds to +-1.
  float xc = ax > 3.92f ? 3.92f : ax;
  float t = xc - 2.5f;
  float g = 1.6704327477376766e-06f;
  g = KR_FMAF(g, t, -1.3279140360763403e-05f);
  g = KR_FMAF(g, t, 7.717127634974766e-05f);
  g = KR_FMAF(g, t, -4.2023838452032863e-4f);
  g = KR_FMAF(g, t, 2.1654349935406945e-3f);
  g = KR_FMAF(g, t, -1.0858437221674877e-2f);
  g = KR_FMAF(g, t, 5.610625230947429e-2f);
  g = KR_FMAF(g, t, -3.526806969678907e-1f);
  g = KR_FMAF(g, t, -1.5568152705670073f);
  float big = 1.0f - kr_exp(g - xc * xc);
  big = ax > 3.92f ? 1.0f : big;
  float y = ax < 1.0f ? small : std::copysign(big, x);
  return x != x ? x : y;
}
#endif
static inline double kr_erf(double x) { return std::erf(x); }

// ---- sqrt and friends ---------------------------------------------------------------------------

// sqrt vectorizes only under -fno-math-errno (otherwise GCC keeps a call for errno's sake).
static inline float kr_sqrt(float x) { return std::sqrt(x); }
static inline double kr_sqrt(double x) { return std::sqrt(x); }
static inline float kr_rsqrt(float x) { return 1.0f / kr_sqrt(x); }
static inline double kr_rsqrt(double x) { return 1.0 / kr_sqrt(x); }
static inline float kr_reciprocal(float x) { return 1.0f / x; }
static inline double kr_reciprocal(double x) { return 1.0 / x; }

// ---- rounding -----------------------------------------------------------------------------------

// std::floor/ceil/trunc vectorize only under -fno-trapping-math; nearbyint (round to nearest
// even in the default rounding mode) vectorizes always, and floor/ceil/trunc follow from it
// exactly. copysign keeps -0 (ceil(-0.5) == -0).
static inline float kr_round(float x) { return std::nearbyint(x); }
static inline double kr_round(double x) { return std::nearbyint(x); }
template <typename T> static inline T kr_floor_fp(T x) {
  T r = std::nearbyint(x);
  return std::copysign(r - (r > x ? T(1) : T(0)), x);
}
template <typename T> static inline T kr_ceil_fp(T x) {
  T r = std::nearbyint(x);
  return std::copysign(r + (r < x ? T(1) : T(0)), x);
}
static inline float kr_floor(float x) { return kr_floor_fp(x); }
static inline double kr_floor(double x) { return kr_floor_fp(x); }
static inline float kr_ceil(float x) { return kr_ceil_fp(x); }
static inline double kr_ceil(double x) { return kr_ceil_fp(x); }
static inline float kr_trunc(float x) { return std::copysign(kr_floor_fp(std::fabs(x)), x); }
static inline double kr_trunc(double x) { return std::copysign(kr_floor_fp(std::fabs(x)), x); }

// ---- sign, abs, classification ------------------------------------------------------------------

// torch.sign: (0 < x) - (x < 0); NaN gives 0 and -0 gives +0, like eager.
template <typename T> static inline T kr_sign(T x) {
  return static_cast<T>(static_cast<T>(T(0) < x) - static_cast<T>(x < T(0)));
}
static inline bool kr_sign(bool x) { return x; }

// Integer abs wraps like eager (abs(INT_MIN) == INT_MIN): negation in unsigned arithmetic.
static inline int8_t kr_abs(int8_t x) { return static_cast<int8_t>(x < 0 ? -x : x); }
static inline int16_t kr_abs(int16_t x) { return static_cast<int16_t>(x < 0 ? -x : x); }
static inline int32_t kr_abs(int32_t x) {
  return static_cast<int32_t>(x < 0 ? 0u - static_cast<uint32_t>(x) : static_cast<uint32_t>(x));
}
static inline int64_t kr_abs(int64_t x) {
  return static_cast<int64_t>(x < 0 ? 0ull - static_cast<uint64_t>(x) : static_cast<uint64_t>(x));
}
static inline uint8_t kr_abs(uint8_t x) { return x; }
static inline bool kr_abs(bool x) { return x; }
static inline float kr_abs(float x) { return std::fabs(x); }
static inline double kr_abs(double x) { return std::fabs(x); }

static inline bool kr_isnan(float x) { return x != x; }
static inline bool kr_isnan(double x) { return x != x; }
template <typename T> static inline bool kr_isnan(T) { return false; }
static inline bool kr_isinf(float x) { return std::fabs(x) == kr_inf_f(); }
static inline bool kr_isinf(double x) { return std::fabs(x) == kr_inf_d(); }
template <typename T> static inline bool kr_isinf(T) { return false; }

// ---- binary -------------------------------------------------------------------------------------

// pow for floats, branch-free so that loops vectorize (std::pow is a library call per element):
// |a|^b = 2^(b * log2|a|) evaluated in double (log2 to ~2^-37 relative, exp2 to ~2^-32), then
// one rounding to float (within 0.51 ulp measured); C's special cases (which eager's follow)
// by selects.
static inline double kr_log2_pos(double x) { // x > 0, finite, normal
  uint64_t u = kr_dbits(x);
  double m = kr_bitsd((u & 0xfffffffffffffULL) | 0x3ff0000000000000ULL); // [1, 2)
  bool big = m > 1.4142135623730951;
  m = kr_seld(big, m * 0.5, m);
  // The biased exponent as a double by the 2^52 trick (bits 0x433.. | k are 2^52 + k): no
  // int64 -> double conversion, which AVX2 lacks (GCC then leaves the whole loop scalar).
  double ef = kr_bitsd(0x4330000000000000ULL | (u >> 52)) - (4503599627370496.0 + 1023.0);
  ef = kr_seld(big, ef + 1.0, ef);
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716.
  double s = (m - 1.0) / (m + 1.0), z = s * s;
  double p = 1.0 / 11;
  p = p * z + 1.0 / 9;
  p = p * z + 1.0 / 7;
  p = p * z + 1.0 / 5;
  p = p * z + 1.0 / 3;
  p = p * z + 1.0;
  return ef + (2.0 * 1.4426950408889634) * s * p;
}
static inline double kr_exp2_d(double t) { // t in [-300, 300]
  const double kShift = 6755399441055744.0; // 1.5 * 2^52
  double tt = t + kShift;
  int64_t n = static_cast<int64_t>(kr_dbits(tt) - kr_dbits(kShift));
  double r = (t - (tt - kShift)) * 0.6931471805599453; // |r| <= ln2 / 2
  double p = 1.0 / 362880;
  p = p * r + 1.0 / 40320;
  p = p * r + 1.0 / 5040;
  p = p * r + 1.0 / 720;
  p = p * r + 1.0 / 120;
  p = p * r + 1.0 / 24;
  p = p * r + 1.0 / 6;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  return p * kr_bitsd(static_cast<uint64_t>(n + 1023) << 52);
}
static inline float kr_pow(float a, float b) {
  // No bool locals: GCC keeps a bool in byte lanes and then finds no vector width for the
  // loop's floats (the whole loop stays scalar); the flags are float selects instead.
  float ax = std::fabs(a), ab = std::fabs(b), tb = std::trunc(b);
  // Odd integers are below 2^24 (larger floats are even).
  int32_t bi = static_cast<int32_t>(kr_self(ab < 16777216.0f, ab, 0.0f));
  float odd = kr_self(tb == b && (bi & 1) != 0, 1.0f, 0.0f);
  double ad = kr_seld(ax > 0.0f && ax < kr_inf_f(), static_cast<double>(ax), 1.0);
  double t = static_cast<double>(b) * kr_log2_pos(ad);
  t = kr_seld(t < -300.0, -300.0, kr_seld(t > 300.0, 300.0, t)); // NaN: b is NaN, handled below
  float y = static_cast<float>(kr_exp2_d(t == t ? t : 0.0));
  // |a| = 0 or inf, or |b| = inf: 0, inf or 1 by which side of 1 |a| is and the sign of b.
  float edge = kr_self((ax < 1.0f) == (b > 0.0f), 0.0f, kr_inf_f());
  edge = kr_self(ax == 1.0f, 1.0f, edge);
  y = kr_self(ax == 0.0f || ax == kr_inf_f() || ab == kr_inf_f(), edge, y);
  // A negative base: a sign for odd integer exponents, NaN for non-integer ones.
  y = kr_self(odd != 0.0f, std::copysign(y, a), y); // y >= 0 here
  y = kr_self(a < 0.0f && ax < kr_inf_f() && tb != b && ab < kr_inf_f(), kr_nan_f(), y);
  y = kr_self(a != a || b != b, kr_nan_f(), y);
  return kr_self(b == 0.0f || a == 1.0f, 1.0f, y);
}
static inline double kr_pow(double a, double b) { return std::pow(a, b); }

// torch.maximum / minimum: NaN if either is NaN; otherwise (a > b ? a : b), the vector
// instruction's choice (which of two zeros comes back is not specified by torch either).
static inline float kr_maximum(float a, float b) {
  float m = a > b ? a : b;
  return (a != a || b != b) ? a + b : m;
}
static inline double kr_maximum(double a, double b) {
  double m = a > b ? a : b;
  return (a != a || b != b) ? a + b : m;
}
static inline float kr_minimum(float a, float b) {
  float m = a < b ? a : b;
  return (a != a || b != b) ? a + b : m;
}
static inline double kr_minimum(double a, double b) {
  double m = a < b ? a : b;
  return (a != a || b != b) ? a + b : m;
}
template <typename T> static inline T kr_maximum(T a, T b) { return a > b ? a : b; }
template <typename T> static inline T kr_minimum(T a, T b) { return a < b ? a : b; }

// argmax / argmin as a max / min of int64 keys (lower.cpp, KernelGen::reduce_here): a value
// of at most 32 bits in the high word, ordered as the values are (floats by their bits, +-0
// made one, NaN above every value for argmax and below for argmin), and in the low word the
// position, inverted for argmax, so that among equal values the first wins. The (value,
// position) pair then combines by an integer max / min: associative and commutative, so
// vectorized and threaded partial results merge to eager's answer (first index of the extreme,
// the first NaN if any). Positions below 2^31 (Accept::IndexReduction).
static inline int64_t kr_arg_order(float x) {
  const int32_t i = static_cast<int32_t>(kr_fbits(x == 0.0f ? 0.0f : x));
  return i < 0 ? (i ^ 0x7fffffff) : i;
}
template <typename T> static inline int64_t kr_arg_order(T x) { return static_cast<int64_t>(x); }
static inline int64_t kr_arg_key(int64_t order, int64_t low) {
  return order * 4294967296LL + low;
}
template <typename T> static inline int64_t kr_argmax_key(T x, int64_t i) {
  return kr_arg_key(x != x ? 2147483647LL : kr_arg_order(x), 4294967295LL - i);
}
template <typename T> static inline int64_t kr_argmin_key(T x, int64_t i) {
  return kr_arg_key(x != x ? -2147483647LL - 1 : kr_arg_order(x), i);
}
static inline int64_t kr_argmax_index(int64_t key) { return 4294967295LL - (key & 4294967295LL); }
static inline int64_t kr_argmin_index(int64_t key) { return key & 4294967295LL; }

static inline float kr_fmod(float a, float b) { return std::fmod(a, b); }
static inline double kr_fmod(double a, double b) { return std::fmod(a, b); }

// torch.remainder: Python's modulo (the result takes the divisor's sign).
template <typename T> static inline T kr_remainder_fp(T a, T b) {
  T r = std::fmod(a, b);
  return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r;
}
static inline float kr_remainder(float a, float b) { return kr_remainder_fp(a, b); }
static inline double kr_remainder(double a, double b) { return kr_remainder_fp(a, b); }

// torch.floor_divide on floats: c10::div_floor_floating (CPython's float floordiv).
template <typename T> static inline T kr_floor_divide_fp(T a, T b) {
  if (b == T(0)) return a / b;
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if ((mod != T(0)) && (b < T(0)) != (mod < T(0))) div -= T(1);
  T floordiv;
  if (div != T(0)) {
    floordiv = std::floor(div);
    if (div - floordiv > T(0.5)) floordiv += T(1);
  } else {
    floordiv = std::copysign(T(0), a / b);
  }
  return floordiv;
}
static inline float kr_floor_divide(float a, float b) { return kr_floor_divide_fp(a, b); }
static inline double kr_floor_divide(double a, double b) { return kr_floor_divide_fp(a, b); }

// Float to int32/int64 as eager's CPU kernels convert (x86's truncating conversions): NaN and
// values outside the integer's range give its lowest value; C++ leaves those undefined.
template <typename I, typename F> static inline I kr_f2i(F x) {
  constexpr F lim = F(uint64_t{1} << (8 * sizeof(I) - 1)); // 2^31 or 2^63, exact
  return (x != x || x >= lim || x < -lim) ? std::numeric_limits<I>::min() : static_cast<I>(x);
}
static inline int32_t kr_f2i32(float x) { return kr_f2i<int32_t>(x); }
static inline int32_t kr_f2i32(double x) { return kr_f2i<int32_t>(x); }
static inline int64_t kr_f2i64(float x) { return kr_f2i<int64_t>(x); }
static inline int64_t kr_f2i64(double x) { return kr_f2i<int64_t>(x); }

// ---- 16-bit floats held as uint16_t bits --------------------------------------------------------

// IEEE binary16 -> float: exact. Subnormal halves are renormalized by a float subtraction.
static inline float kr_h2f(uint16_t h) {
  uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13; // exponent and mantissa, float place
  uint32_t exp = em & 0x0f800000u;
  uint32_t normal = em + ((127u - 15u) << 23);
  uint32_t infnan = em + ((255u - 31u) << 23);
  float sub = kr_bitsf(em + (113u << 23)) - kr_bitsf(113u << 23); // (em as 2^-14 * 0.m)
  uint32_t bits = exp == 0x0f800000u ? infnan : normal;
  bits = exp == 0 ? kr_fbits(sub) : bits;
  return kr_bitsf(bits | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// float -> IEEE binary16, round to nearest even; overflow gives inf, NaN gives a quiet NaN.
static inline uint16_t kr_f2h(float f) {
  uint32_t u = kr_fbits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  // Subnormal or zero result (|f| < 2^-14): in 0.5 + |f| the float's ulp is 2^-24, the half's
  // subnormal step, so the addition rounds to nearest even and the low bits are the result.
  float s = kr_bitsf(a) + 0.5f;
  uint32_t sub = kr_fbits(s) - kr_fbits(0.5f);
  // Normal result: rebias the exponent, round to nearest even on bit 13.
  uint32_t norm = (a + ((15u - 127u) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  uint32_t r = a < (113u << 23) ? sub : norm;
  r = a >= (143u << 23) ? 0x7c00u : r;   // |f| >= 65536 (and anything rounding past 65504)
  r = a > 0x7f800000u ? 0x7e00u : r;     // NaN
  return static_cast<uint16_t>(r | sign);
}

static inline float kr_bf2f(uint16_t h) { return kr_bitsf(static_cast<uint32_t>(h) << 16); }

// float -> bfloat16 like c10::BFloat16's round_to_nearest_even (NaN -> 0x7fc0).
static inline uint16_t kr_f2bf(float f) {
  uint32_t u = kr_fbits(f);
  uint32_t r = (u + (((u >> 16) & 1u) + 0x7fffu)) >> 16;
  return static_cast<uint16_t>(f != f ? 0x7fc0u : r);
}

// An index kept in bounds (kir::ExprKind::Clamp: a cat's part read where it may not hold the
// element; the value read is then not used).
static inline int64_t kr_clamp_index(int64_t i, int64_t lo, int64_t hi) {
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
static inline kr_u32x4 kr_philox(int64_t seed, int64_t offset, int64_t stream) {
  uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32);
  uint32_t c2 = (uint32_t)stream, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
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
static inline uint32_t kr_philox_word(kr_u32x4 r, int64_t i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}
static inline float kr_philox_uniform(int64_t seed, int64_t offset, int64_t stream, int64_t bits) {
  uint32_t x = kr_philox_word(kr_philox(seed, offset >> 2, stream), offset & 3);
  return (float)(x >> (32 - bits)) * (1.0f / (float)(1u << bits));
}
static inline double kr_philox_uniform64(int64_t seed, int64_t offset, int64_t stream) {
  kr_u32x4 r = kr_philox(seed, offset >> 1, stream);
  uint32_t hi = (offset & 1) ? r.z : r.x, lo = (offset & 1) ? r.w : r.y;
  return (double)(((uint64_t)hi << 21) | (lo >> 11)) * 0x1p-53;
}
// Standard normal by Box-Muller: u1 in (0, 1] (its log is finite), u2 in [0, 1).
static inline float kr_philox_normal(int64_t seed, int64_t offset, int64_t stream) {
  kr_u32x4 r = kr_philox(seed, offset >> 1, stream);
  uint32_t a = (offset & 1) ? r.z : r.x, b = (offset & 1) ? r.w : r.y;
  float u1 = (float)((a >> 8) + 1u) * 0x1p-24f;
  float u2 = (float)(b >> 8) * 0x1p-24f;
  return kr_sqrt(-2.0f * kr_log(u1)) * kr_cos(6.28318530717958648f * u2);
}
static inline double kr_philox_normal64(int64_t seed, int64_t offset, int64_t stream) {
  kr_u32x4 r = kr_philox(seed, offset, stream);
  double u1 = (double)((((uint64_t)r.x << 21) | (r.y >> 11)) + 1u) * 0x1p-53;
  double u2 = (double)(((uint64_t)r.z << 21) | (r.w >> 11)) * 0x1p-53;
  return kr_sqrt(-2.0 * kr_log(u1)) * kr_cos(6.28318530717958647692 * u2);
}

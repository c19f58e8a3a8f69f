"""kr_cpu.h's float32 helpers: time per 2^24 elements (one thread) against a scalar <cmath>
loop compiled with the same flags and against eager torch, and the largest error in ulp
against float64 torch rounded to float32. Run: PYTHONPATH=python python benchmarks/bench_cpu_math.py
(KERAUNOS_CXXFLAGS adds kernel flags, e.g. "-fno-trapping-math -fno-math-errno")."""

import time

import torch

from keraunos import _C

FUNCS = {  # name: (ours, scalar <cmath>, torch)
    "exp": ("kr_exp", "std::exp", torch.exp),
    "exp2": ("kr_exp2", "std::exp2", torch.exp2),
    "expm1": ("kr_expm1", "std::expm1", torch.expm1),
    "log": ("kr_log", "std::log", torch.log),
    "log2": ("kr_log2", "std::log2", torch.log2),
    "log1p": ("kr_log1p", "std::log1p", torch.log1p),
    "sin": ("kr_sin", "std::sin", torch.sin),
    "cos": ("kr_cos", "std::cos", torch.cos),
    "tan": ("kr_tan", "std::tan", torch.tan),
    "tanh": ("kr_tanh", "std::tanh", torch.tanh),
    "sigmoid": ("kr_sigmoid", "1.0f / (1.0f + std::exp(-x[i])) + 0 *", torch.sigmoid),
    "erf": ("kr_erf", "std::erf", torch.erf),
    "sqrt": ("kr_sqrt", "std::sqrt", torch.sqrt),
    "floor": ("kr_floor", "std::floor", torch.floor),
    "round": ("kr_round", "std::nearbyint", torch.round),
}
DOMAIN = {"log": (1e-30, 1e30), "log2": (1e-30, 1e30), "log1p": (-0.999, 1e6), "sqrt": (0, 1e6)}


def kernel(sym, fn):
    return f"""
extern "C" void {sym}(void** p, const int64_t* a) {{
  const float* x = static_cast<const float*>(p[0]);
  float* y = static_cast<float*>(p[1]);
  for (int64_t i = 0; i < a[0]; ++i) y[i] = {fn}(x[i]);
}}"""


def best_ms(f, reps=5):
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def ulps(ours, ref64):
    ref = ref64.float()
    fin = torch.isfinite(ref) & torch.isfinite(ours)
    a, b = ours[fin].double(), ref64[fin]
    # ulp of the float32 result at the reference's magnitude (subnormal floor 2^-149)
    e = torch.frexp(b.abs().clamp_min(2.0**-126).float())[1].double()
    return ((a - b).abs() / torch.pow(2.0, e - 24)).max().item()


def main():
    torch.set_num_threads(1)
    src = [_C._embedded_file("kr_cpu.h")]
    for name, (ours, scalar, _) in FUNCS.items():
        src += [kernel(f"ours_{name}", ours), kernel(f"scalar_{name}", scalar)]
    lib = _C.cpu_compile("\n".join(src))
    n = 1 << 24
    print(f"{'fn':8} {'ours ms':>8} {'scalar':>8} {'torch':>8} {'max ulp':>8}")
    for name, (_, _, tfn) in FUNCS.items():
        lo, hi = DOMAIN.get(name, (-10.0, 10.0))
        x = torch.rand(n) * (hi - lo) + lo
        y = torch.empty_like(x)
        call = lambda s: lib.call(s, [x.data_ptr(), y.data_ptr()], [n])  # noqa: B023
        t_ours = best_ms(lambda: call(f"ours_{name}"))  # noqa: B023
        t_scalar = best_ms(lambda: call(f"scalar_{name}"))  # noqa: B023
        t_torch = best_ms(lambda: tfn(x, out=y) if name != "sigmoid" else torch.sigmoid(x))  # noqa: B023
        # accuracy over wide ranges: every 64th float32 bit pattern
        w = torch.arange(0, 2**32, 64, dtype=torch.int64).to(torch.int32).view(torch.float32)
        w = w[torch.isfinite(w)]
        yw = torch.empty_like(w)
        lib.call(f"ours_{name}", [w.data_ptr(), yw.data_ptr()], [w.numel()])
        u = ulps(yw, tfn(w.double()))
        print(f"{name:8} {t_ours:8.2f} {t_scalar:8.2f} {t_torch:8.2f} {u:8.2f}")


if __name__ == "__main__":
    main()

"""Where a whole layer's time goes: benchmarks/gpu.py's llama_layer under torch.profiler for
eager, torch.compile and keraunos.jit (both fusion types), each kernel's device time per call,
the sum of kernel time per call against the elapsed time per call (a gap means the host or the
launch queue is the limit), and the floor: the layer's matmuls and SDPA alone (eager).

  python scripts/dev/profile_layer.py [--iters 20] [--top 14] [--quick] [--device cpu]

(On the CPU every profiled op counts as a kernel: a smoke test.)
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_util as bu  # noqa: E402
import gpu  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import keraunos  # noqa: E402


def matmuls_and_attention(x, ln1, wq, wk, wv, wo, ln2, wg, wu, wd, cos, sin):
    """The layer's matmuls and SDPA on the same shapes, nothing else (the floor every competitor
    shares: all of them call cuBLAS and the same attention kernel)."""
    b, s, h = x.shape
    d = cos.shape[-1]
    nh = wq.shape[0] // d
    q = F.linear(x, wq).view(b, s, nh, d).transpose(1, 2)
    F.linear(x, wk)
    F.linear(x, wv)
    a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    o = F.linear(a.transpose(1, 2).reshape(b, s, h), wo)
    F.linear(o, wu)
    return F.linear(F.linear(o, wg), wd)


def profile(run, args, iters, dev):
    for _ in range(5):
        run(*args)
    bu.sync(dev)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        elapsed_us = bu.time_calls(run, args, iters, dev) * 1e6
    per_kernel = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA or dev.type == "cpu":
            k = per_kernel[ev.name]
            k[0] += ev.device_time_total
            k[1] += 1
    return elapsed_us, {n: (t / iters, c / iters) for n, (t, c) in per_kernel.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke test)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    case = gpu.llama_case(a.quick, torch.bfloat16)
    dev = torch.device(a.device)
    args = case.inputs(dev)
    runs = [
        ("eager", bu.llama_layer),
        ("torch.compile", torch.compile(bu.llama_layer, dynamic=False)),
        ("keraunos dataflow", keraunos.jit(bu.llama_layer, fusion_type="dataflow")),
        ("keraunos consecutive", keraunos.jit(bu.llama_layer)),
        ("floor: matmuls + sdpa (eager)", matmuls_and_attention),
    ]
    for name, run in runs:
        elapsed, kernels = profile(run, args, a.iters, dev)
        print_kernels(name, elapsed, kernels, a.top, "call")


def print_kernels(name, elapsed, kernels, top, unit):
    """One competitor's profile: elapsed and kernel time per `unit`, the `top` kernels."""
    busy = sum(t for t, _ in kernels.values())
    launches = sum(c for _, c in kernels.values())
    print(
        f"\n## {name}: {elapsed:.1f} µs per {unit} elapsed, {busy:.1f} µs of kernels, "
        f"{launches:.0f} kernels per {unit}"
    )
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    for n, (t, c) in ranked[:top]:
        print(f"  {t:8.1f} µs  ×{c:g}  {n[:110]}")
    rest = sum(t for _, (t, _) in ranked[top:])
    if rest:
        print(f"  {rest:8.1f} µs  (the other {len(ranked) - top} kernels)")


if __name__ == "__main__":
    main()

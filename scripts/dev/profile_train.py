"""Where a training step's time goes: benchmarks/train.py's llama (or mlp) case (forward,
loss, backward) under torch.profiler for eager, torch.compile and keraunos.jit: each kernel's device
time per step, the sum of kernel time per step against the elapsed time per step, and for
keraunos the tensors its forward saves for the backward (their bytes) and both programs'
sources (written to --dump).

  python scripts/dev/profile_train.py [--iters 10] [--top 16] [--quick] [--device cpu]
                                      [--dump train_programs.txt] [--case llama|mlp]
"""

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_util as bu  # noqa: E402
import torch  # noqa: E402
import train  # noqa: E402
from profile_layer import print_kernels  # noqa: E402

import keraunos  # noqa: E402


def step(run, params, args):
    loss = run(*args)
    loss.backward()
    for p in params:
        p.grad = None


def profile(run, params, args, iters, dev):
    for _ in range(3):
        step(run, params, args)
    bu.sync(dev)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(iters):
            step(run, params, args)
        bu.sync(dev)
        elapsed_us = (time.perf_counter() - t0) / iters * 1e6
    per_kernel = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA or (
            dev.type == "cpu" and ev.cpu_parent is None
        ):
            k = per_kernel[ev.name]
            k[0] += ev.device_time_total if dev.type == "cuda" else ev.cpu_time_total
            k[1] += 1
    return elapsed_us, {n: (t / iters, c / iters) for n, (t, c) in per_kernel.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke test)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dump", default=None, help="write keraunos' traces here")
    ap.add_argument("--case", default="llama", choices=["llama", "mlp"])
    ap.add_argument("--fusion-type", default=None, help="keraunos.jit's fusion_type")
    a = ap.parse_args()
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    fn, params, args, label = getattr(train, f"{a.case}_case")(dev, dtype, a.quick)
    jf = keraunos.jit(fn, fusion_type=a.fusion_type)
    runs = [("eager", fn), ("torch.compile", torch.compile(fn, dynamic=False)), ("keraunos", jf)]
    print(f"# training step, {a.case} case ({label}), {dev.type}, {dtype}")
    for name, run in runs:
        elapsed, kernels = profile(run, params, args, a.iters, dev)
        print_kernels(name, elapsed, kernels, a.top, "step")
    loss = jf(*args)
    saved = loss.grad_fn.saved_tensors if loss.grad_fn is not None else ()
    total = sum(t.numel() * t.element_size() for t in saved if t is not None)
    print(f"\n## keraunos saves {len(saved)} tensors, {total / 2**20:.1f} MiB:")
    for t in sorted(
        (t for t in saved if t is not None), key=lambda t: -t.numel() * t.element_size()
    )[:12]:
        print(f"  {t.numel() * t.element_size() / 2**20:8.1f} MiB  {t.dtype} {list(t.shape)}")
    loss.backward()
    if a.dump:
        with open(a.dump, "w") as f:
            for tr in keraunos.last_traces(jf):
                f.write(str(tr) + "\n")


if __name__ == "__main__":
    main()

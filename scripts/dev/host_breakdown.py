"""Where the host time of a one-fusion call goes (GPU machine): times each step the call makes
(the whole jitted call, the kernel object alone, torch.empty_strided, the stream query,
data_ptr/stride) against one eager op, N calls each, no synchronization between calls.

    python scripts/dev/host_breakdown.py [--calls 5000]
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_util as bu  # noqa: E402

import keraunos  # noqa: E402


def per_call(f, calls):
    for _ in range(200):
        f()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    n = ap.parse_args().calls
    x = torch.randn(16, device="cuda")
    jf = keraunos.jit(bu.chain10)
    jf(x)
    kernels = keraunos.last_traces(jf)[-1].kernels
    k = kernels[0]
    st = torch._C._cuda_getCurrentRawStream
    rows = {
        "eager x.sin()": lambda: x.sin(),
        "eager chain10 (10 ops)": lambda: bu.chain10(x),
        "keraunos jf(x) (chain10)": lambda: jf(x),
        "fused kernel object k(x)": lambda: k(x),
        "torch.empty_strided((16,), (1,), cuda)": lambda: torch.empty_strided(
            (16,), (1,), dtype=torch.float32, device=x.device
        ),
        "torch._C._cuda_getCurrentRawStream(0)": lambda: st(0),
        "x.data_ptr()": lambda: x.data_ptr(),
        "x.stride()": lambda: x.stride(),
    }
    print(f"kernels: {len(kernels)}; {n} calls per round, best of 5 rounds")
    for name, f in rows.items():
        print(f"{name:45s} {per_call(f, n):8.2f} µs")


if __name__ == "__main__":
    main()

"""Per-call host overhead: a cached jitted 1-op and 10-op function on small CPU tensors,
side by side with eager and torch.compile (Inductor) in one run. Prints medians and ratios.

    python benchmarks/overhead.py [--rounds 15] [--calls 2000]
"""

import argparse
import platform
import statistics
import time

import torch

import keraunos


def one_op(x):
    return x.sin()


def ten_ops(x):
    y = x.sin()
    y = y * 2
    y = y + 1
    y = y.exp()
    y = y - x
    y = y.abs()
    y = y.sqrt()
    y = y / 3
    y = y.tanh()
    return y.neg()


def per_call_us(fn, x, calls):
    t = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - t) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(16)
    print(
        f"# overhead: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"x = randn(16) float32 on CPU, {args.rounds} rounds x {args.calls} calls, medians"
    )
    print(
        f"{'function':10} {'eager us':>9} {'keraunos us':>12} {'compile us':>11} "
        f"{'keraunos/compile':>17} {'keraunos/eager':>15}"
    )
    for fn in (one_op, ten_ops):
        runners = {
            "eager": fn,
            "keraunos": keraunos.jit(fn),
            "compile": torch.compile(fn),
        }
        for r in runners.values():  # compile and warm up
            for _ in range(50):
                r(x)
        samples = {k: [] for k in runners}
        for _ in range(args.rounds):  # interleaved, so drift hits all alike
            for k, r in runners.items():
                samples[k].append(per_call_us(r, x, args.calls))
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(
            f"{fn.__name__:10} {med['eager']:9.2f} {med['keraunos']:12.2f} {med['compile']:11.2f} "
            f"{med['keraunos'] / med['compile']:17.3f} {med['keraunos'] / med['eager']:15.3f}"
        )


if __name__ == "__main__":
    main()

"""keraunos demo: jit a few functions, compare them with eager PyTorch, print the traces.

Runs on the GPU when there is one (pass --device cpu to force the CPU)."""

import argparse

import torch

import keraunos


def banner(title):
    print("\n" + "=" * 78 + f"\n{title}\n" + "=" * 78)


_FINAL = ("torch executor", "fusion executors")


def show(jf, stages=("acquire", *_FINAL), kernel=False):
    """Prints the acquired trace and the final program (or every stage); with `kernel`, the
    generated source of the program's first kernel too."""
    traces = keraunos.last_traces(jf)
    for t in traces:
        if t.stage in stages or "all" in stages:
            print(t)
    kernels = getattr(traces[-1], "kernels", [])
    if kernel and kernels:
        k = kernels[0]
        print(f"# generated source of kernel {k.name} ({len(kernels)} kernel(s) in the program):")
        print(k.source)


def bug_report_1():
    # From a peer compiler's bug report: a mutation of an intermediate nothing reads.
    torch.randn(4, device=DEVICE).sin_()


def bug_report_2(x):
    # ...and a mutation through a view of an input.
    x.view(-1).sin_()


def mlp(x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(x @ w1.t() + b1)
    return torch.nn.functional.linear(h, w2, b2).relu()


def attention(x, wq, wk, wv, ln_w, ln_b):
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), ln_w, ln_b)
    q, k, v = h @ wq, h @ wk, h @ wv
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    return x + torch.softmax(scores, dim=-1) @ v


def upsample_block(x):
    y = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
    return torch.nn.functional.silu(y) * 0.5 + y


def main():
    global DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--all-stages", action="store_true", help="print every stage's trace")
    args = ap.parse_args()
    DEVICE = args.device
    stages = ("all",) if args.all_stages else ("acquire", *_FINAL)
    print(f"keraunos {keraunos.__version__} on {DEVICE} (torch {torch.__version__})")

    banner("1. torch.randn(4).sin_(): no observable effect")
    for fusion_type in ("consecutive", "dataflow"):
        jf = keraunos.jit(bug_report_1, fusion_type=fusion_type)
        print(f"fusion_type={fusion_type}: returns {jf()!r}")
    show(jf, stages)

    banner("2. x.view(-1).sin_(): changes x like eager")
    x = torch.randn(2, 3, device=DEVICE)
    expected = x.clone().sin()
    for fusion_type in ("consecutive", "dataflow"):
        y = x.clone()
        jf = keraunos.jit(bug_report_2, fusion_type=fusion_type)
        jf(y)
        print(f"fusion_type={fusion_type}: x matches eager: {torch.equal(y, expected)}")
    show(jf, stages)

    banner("3. an MLP")
    g = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    inputs = (mk(8, 64), mk(128, 64), mk(128), mk(32, 128), mk(32))
    jf = keraunos.jit(mlp)
    out = jf(*inputs)
    print("max |jit - eager| =", (out - mlp(*inputs)).abs().max().item())
    show(jf, stages, kernel=True)

    banner("4. an attention block")
    inputs = (mk(2, 16, 32), mk(32, 32), mk(32, 32), mk(32, 32), mk(32), mk(32))
    jf = keraunos.jit(attention)
    out = jf(*inputs)
    print("max |jit - eager| =", (out - attention(*inputs)).abs().max().item())
    show(jf, stages)
    for _ in range(3):
        jf(*inputs)
    print("compile stats:", keraunos.compile_stats(jf))

    banner("5. a call keraunos has no op for runs through torch, kernels fuse around it")
    jf = keraunos.jit(upsample_block)
    x = mk(1, 4, 8, 8)
    out = jf(x)
    print("max |jit - eager| =", (out - upsample_block(x)).abs().max().item())
    show(jf, ("torch executor", "fusion executors"))


DEVICE = "cpu"
if __name__ == "__main__":
    main()

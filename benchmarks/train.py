"""Training steps side by side: eager, torch.compile and keraunos.jit, in one run. A step is the
forward, the loss and the backward (gradients of every parameter); the optimizer is left out
(it runs the same torch code in every competitor). Prints time per step, peak extra memory
during the step (CUDA), the ratios keraunos/eager and keraunos/torch.compile (lower is
better), and checks the loss and every gradient against eager's. Ends with a markdown table
for RESULTS.md.

    python benchmarks/train.py [--device cpu|cuda] [--dtype float32|bfloat16] [--cases llama,mlp]
                               [--rounds 5] [--round-s 0.5] [--quick]
                               [--fusion-type consecutive|dataflow]

Cases:
  llama  a LLaMA-style decoder block (bench_util.llama_layer: RMSNorm, q/k/v projections,
         rotary embeddings, grouped-query SDPA, SwiGLU MLP, residuals), then a vocabulary
         projection and cross-entropy against random targets;
  mlp    Linear -> GELU -> Linear, residual, LayerNorm, then a mean-squared error.
Sizes: CUDA batch 4 x seq 1024 x hidden 2048 (16 heads of 128, 4 kv heads, MLP 5632, vocab
32000); CPU batch 2 x seq 128 x hidden 256 (4 heads of 64, 2 kv heads, MLP 688, vocab 2048).
--quick: tiny sizes, a smoke test.
"""

import argparse
import statistics
import sys
import time

import bench_util as bu
import torch
import torch.nn.functional as F

import keraunos


def llama_sizes(device, quick):
    if quick:
        return dict(b=1, s=16, h=64, d=16, nkv=2, ffn=96, vocab=128)
    if device.type == "cuda":
        return dict(b=4, s=1024, h=2048, d=128, nkv=4, ffn=5632, vocab=32000)
    return dict(b=2, s=128, h=256, d=64, nkv=2, ffn=688, vocab=2048)


def llama_case(device, dtype, quick):
    z = llama_sizes(device, quick)
    b, s, h, d, nkv, ffn, vocab = (z[k] for k in ("b", "s", "h", "d", "nkv", "ffn", "vocab"))
    g = torch.Generator().manual_seed(0)

    def p(*shape, scale=None):
        t = torch.randn(*shape, generator=g) * (scale if scale is not None else shape[-1] ** -0.5)
        return t.to(device, dtype).requires_grad_()

    params = [
        p(h, scale=1.0).detach().fill_(1.0).requires_grad_(),  # ln1
        p(h, h),  # wq
        p(nkv * d, h),  # wk
        p(nkv * d, h),  # wv
        p(h, h),  # wo
        p(h, scale=1.0).detach().fill_(1.0).requires_grad_(),  # ln2
        p(ffn, h),  # wg
        p(ffn, h),  # wu
        p(h, ffn),  # wd
        p(vocab, h),  # head
    ]
    pos = torch.arange(s, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.cat([pos[:, None] * inv[None], pos[:, None] * inv[None]], -1)
    cos, sin = ang.cos().to(device, dtype), ang.sin().to(device, dtype)
    x = (torch.randn(b, s, h, generator=g)).to(device, dtype)
    target = torch.randint(0, vocab, (b * s,), generator=g).to(device)

    def loss_fn(x, ln1, wq, wk, wv, wo, ln2, wg, wu, wd, head, cos, sin, target):
        y = bu.llama_layer(x, ln1, wq, wk, wv, wo, ln2, wg, wu, wd, cos, sin)
        logits = F.linear(y, head).view(-1, head.shape[0])
        return F.cross_entropy(logits.float(), target)

    return loss_fn, params, [x, *params, cos, sin, target], f"b{b} s{s} h{h} vocab{vocab}"


def mlp_case(device, dtype, quick):
    n, h, ffn = (
        (64, 32, 64)
        if quick
        else ((8192, 2048, 8192) if device.type == "cuda" else (2048, 512, 2048))
    )
    g = torch.Generator().manual_seed(0)

    def p(*shape):
        return (
            (torch.randn(*shape, generator=g) * shape[-1] ** -0.5)
            .to(device, dtype)
            .requires_grad_()
        )

    params = [p(ffn, h), p(ffn), p(h, ffn), p(h), p(h), p(h)]
    x = torch.randn(n, h, generator=g).to(device, dtype)
    y = torch.randn(n, h, generator=g).to(device, dtype)

    def loss_fn(x, w1, b1, w2, b2, lw, lb, y):
        z = x + F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
        z = F.layer_norm(z, (z.shape[-1],), lw, lb)
        return F.mse_loss(z.float(), y.float())

    return loss_fn, params, [x, *params, y], f"{n}x{h}, ffn {ffn}"


CASES = {"llama": llama_case, "mlp": mlp_case}


def runner(kind, fn, fusion_type=None):
    if kind == "eager":
        return fn
    if kind == "compile":
        return torch.compile(fn, dynamic=False)
    return keraunos.jit(fn, fusion_type=fusion_type)


def step(run, params, args):
    for t in params:
        t.grad = None
    loss = run(*args)
    loss.backward()
    return loss


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def bench(name, device, dtype, rounds, round_s, quick, fusion_type=None):
    fn, params, args, label = CASES[name](device, dtype, quick)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    ref_loss = step(fn, params, args).detach()
    ref_grads = [t.grad.detach().clone() for t in params]
    res = {"case": name, "label": label, "competitors": {}}
    runs = {}
    for kind in ("eager", "compile", "keraunos"):
        r = res["competitors"][kind] = {}
        try:
            run = runner(kind, fn, fusion_type)
            loss = step(run, params, args)
            bu.sync(device)
            if kind != "eager":
                errs = [rel_err(loss.detach(), ref_loss)] + [
                    rel_err(t.grad, g) for t, g in zip(params, ref_grads)
                ]
                r["check"] = (
                    "ok" if max(errs) <= tol else f"MISMATCH: max relative error {max(errs):.3g}"
                )
            if kind == "keraunos":
                st = keraunos.compile_stats(run)
                r["note"] = (
                    "compiled forward + backward"
                    if st["grad_fallback"] is None
                    else ("through torch: " + st["grad_fallback"][:120])
                ) + (f" ({fusion_type} fusion)" if fusion_type else "")
            step(run, params, args)
            bu.sync(device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                base = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
                step(run, params, args)
                bu.sync(device)
                r["peak_extra_gib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**30
            t = time.perf_counter()
            step(run, params, args)
            bu.sync(device)
            once = time.perf_counter() - t
            r["iters"] = max(1, min(1000, int(round_s / max(once, 1e-9))))
            runs[kind] = run
        except Exception as e:
            r["error"] = bu._err(e)
            print(f"  {kind}: {r['error']}", file=sys.stderr)
    samples = {k: [] for k in runs}
    for _ in range(rounds):
        for k, run in runs.items():
            bu.sync(device)
            t = time.perf_counter()
            for _ in range(res["competitors"][k]["iters"]):
                step(run, params, args)
            bu.sync(device)
            samples[k].append((time.perf_counter() - t) / res["competitors"][k]["iters"])
    for k, v in samples.items():
        res["competitors"][k]["median_s"] = statistics.median(v)
        res["competitors"][k]["spread"] = (max(v) - min(v)) / statistics.median(v)
    med = {k: res["competitors"][k].get("median_s") for k in res["competitors"]}
    if med.get("keraunos"):
        for base in ("eager", "compile"):
            if med.get(base):
                res[f"keraunos/{base}"] = med["keraunos"] / med[base]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)"
    )
    ap.add_argument("--cases", default="llama,mlp")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--round-s", type=float, default=0.5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--fusion-type", default=None, help="keraunos.jit's fusion_type (default: the jit's)"
    )
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    m = bu.meta(device)
    print(f"# Training step: {bu.header(m)}, {str(dtype).replace('torch.', '')}", flush=True)
    results = []
    for name in args.cases.split(","):
        print(f"## {name}", flush=True)
        results.append(
            bench(name, device, dtype, args.rounds, args.round_s, args.quick, args.fusion_type)
        )
    print()
    print(
        "| case | eager ms | torch.compile ms | keraunos ms | keraunos/eager | keraunos/compile "
        "| peak extra GiB (eager / compile / keraunos) | check (compile, keraunos) | keraunos |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(table_row(r))


def table_row(r):
    c = r["competitors"]

    def ms(k):
        v = c.get(k, {}).get("median_s")
        return f"{v * 1e3:.2f}" if v else c.get(k, {}).get("error", "-")

    def gib(k):
        v = c.get(k, {}).get("peak_extra_gib")
        return f"{v:.2f}" if v is not None else "-"

    def ratio(k):
        return f"{r[k]:.3f}" if k in r else "-"

    return (
        f"| {r['case']} ({r['label']}) | {ms('eager')} | {ms('compile')} | {ms('keraunos')} "
        f"| {ratio('keraunos/eager')} | {ratio('keraunos/compile')} "
        f"| {gib('eager')} / {gib('compile')} / {gib('keraunos')} "
        f"| {c.get('compile', {}).get('check', '-')}, {c.get('keraunos', {}).get('check', '-')} "
        f"| {c.get('keraunos', {}).get('note', '-')} |"
    )


if __name__ == "__main__":
    main()

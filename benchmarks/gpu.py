"""CUDA kernels side by side: eager, torch.compile (Inductor, Triton) and keraunos.jit, in one
run. Device time by CUDA events (median over rounds, each round many back-to-back calls),
effective bandwidth in TB/s and its ratio to the copy bandwidth measured in the same run (the
ceiling: DESIGN.md §4 asks ≥ 0.97 of it for fused elementwise, ≥ 0.88 for softmax / LayerNorm
/ RMSNorm), the ratios keraunos/torch.compile and keraunos/eager (lower is better), host
overhead per call of a tiny one-fusion function, and cold / warm compile times in fresh
subprocesses. Ends with markdown tables for RESULTS.md.

    python benchmarks/gpu.py [--cases gelu,softmax,...] [--rounds 15] [--quick]
                             [--round-s 0.025] [--calls 2000] [--no-compile-time]
                             [--json out.json]

Cases (float32 unless said):
  copy         y.copy_(x) on 2^28 elements: the bandwidth ceiling, eager only, always run,
  gelu         F.gelu(x) * y + z on 2^28 elements,
  chain10      the 10-op chain of overhead.py (sin, *2, +1, exp, -x, abs, sqrt, /3, tanh, neg)
               on 2^28 elements,
  softmax      torch.softmax(x, -1) on (16384, 8192) and (512, 262144),
  layer_norm   F.layer_norm on (16384, 8192) and (512, 262144),
  rms_norm     HF's LlamaRMSNorm on bfloat16 (16384, 8192) (float32 statistics, cast back),
  rms_norm_fn  F.rms_norm on the same bfloat16 tensors and on bfloat16 (512, 262144),
  overhead     host µs per call of chain10 on 16 elements: --calls calls, no synchronization
               between them, the clock stopped before the final synchronize.
--quick uses 2^20 elements, (256, 2048) / (8, 65536) rows and 200 calls: a smoke test.
"""

import argparse
import os
import statistics
import sys

import bench_util as bu
import torch


def cases(quick):
    n = 2**20 if quick else 2**28
    rows, cols = (256, 2048) if quick else (16384, 8192)
    long_rows, long_cols = (8, 65536) if quick else (512, 262144)
    b, seq = (1, 64) if quick else (4, 2048)
    ce_rows, ce_vocabs = (64, (32768,)) if quick else (4096, (32768, 131072))
    f32, bf16 = torch.float32, torch.bfloat16

    def copy_bytes(inputs, out):  # read x, write y
        return inputs[0].nbytes + inputs[1].nbytes

    return [
        bu.Case("copy", bu.copy, [(n,)] * 2, f32, competitors=("eager",), nbytes=copy_bytes),
        bu.Case("gelu", bu.gelu, [(n,)] * 3, f32),
        bu.Case("chain10", bu.chain10, [(n,)], f32),
        bu.Case("softmax", bu.softmax, [(rows, cols)], f32, label=f"softmax {rows}×{cols}"),
        bu.Case(
            "softmax",
            bu.softmax,
            [(long_rows, long_cols)],
            f32,
            label=f"softmax {long_rows}×{long_cols}",
        ),
        bu.Case("layer_norm", bu.layer_norm, [(rows, cols), (cols,), (cols,)], f32),
        bu.Case(
            "layer_norm",
            bu.layer_norm,
            [(long_rows, long_cols), (long_cols,), (long_cols,)],
            f32,
            label=f"layer_norm {long_rows}×{long_cols}",
        ),
        bu.Case("rms_norm", bu.rms_norm, [(rows, cols), (cols,)], bf16),
        bu.Case("rms_norm_fn", bu.rms_norm_fn, [(rows, cols), (cols,)], bf16),
        bu.Case(
            "rms_norm_fn",
            bu.rms_norm_fn,
            [(long_rows, long_cols), (long_cols,)],
            bf16,
            label=f"F.rms_norm {long_rows}×{long_cols}",
        ),
        bu.Case(
            "rotary",
            bu.rotary,
            [(b, 32, seq, 128), (b, 8, seq, 128), (seq, 128), (seq, 128)],
            bf16,
            label=f"rotary q,k {b}×32/8×{seq}×128",
        ),
        bu.Case(
            "dropout_residual",
            bu.dropout_residual,
            [(b * seq, 4096)] * 2,
            bf16,
            check=bu.check_dropout_residual,
            label=f"dropout_residual {b * seq}×4096",
        ),
        *(
            bu.Case(
                "cross_entropy",
                bu.cross_entropy,
                [(ce_rows, v), (ce_rows,)],
                dt,
                ints={1: v},
                label=f"cross_entropy {ce_rows}×{v // 1024}k {str(dt)[6:]}",
            )
            for v in ce_vocabs
            for dt in (f32, bf16)
        ),
        llama_case(quick, bf16),
        bu.Case("overhead", bu.chain10, [(16,)], f32, extra={"overhead": True}),
    ]


def llama_case(quick, dtype):
    """A LLaMA-style decoder layer's forward (bench_util.llama_layer): hidden 2048, 16 heads of
    128 with 4 key/value heads, SwiGLU 5632, batch 4 × 1024 tokens (quick: tiny). keraunos
    fuses along data edges (fusion_type="dataflow"): the SwiGLU product joins the silu across
    the up projection's matmul."""
    b, s, h, nh, nkv, d, i = (
        (1, 64, 256, 4, 2, 64, 512) if quick else (4, 1024, 2048, 16, 4, 128, 5632)
    )
    shapes = [(b, s, h), (h,), (nh * d, h), (nkv * d, h), (nkv * d, h), (h, h), (h,)]
    shapes += [(i, h), (i, h), (h, i), (s, d), (s, d)]
    scales = {2: h**-0.5, 3: h**-0.5, 4: h**-0.5, 5: h**-0.5, 7: h**-0.5, 8: h**-0.5, 9: i**-0.5}
    return bu.Case(
        "llama_layer",
        bu.llama_layer,
        shapes,
        dtype,
        scales=scales,
        check=bu.check_close,
        nbytes=lambda inputs, out: sum(t.nbytes for t in inputs) + out.nbytes,
        jit_options={"fusion_type": "dataflow"},
        label=f"llama_layer {b}×{s}×{h} (jit dataflow)",
    )


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = ", ".join(dict.fromkeys(c.name for c in cases(True)))
    ap.add_argument("--cases", help="comma-separated subset of: " + names)
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds (median reported)")
    ap.add_argument("--round-s", type=float, default=0.025, help="target seconds per round")
    ap.add_argument("--calls", type=int, default=None, help="calls per overhead round (2000)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    ap.add_argument("--no-compile-time", action="store_true", help="skip the subprocess compiles")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument(
        "--device",
        default="cuda",
        help="cuda (default) or cuda:N; 'cpu' only tests the script itself (times mean nothing)",
    )
    bu.add_child_args(ap)
    return ap.parse_args()


def require_cuda():
    if not torch.cuda.is_available():
        sys.exit(
            "benchmarks/gpu.py needs a CUDA GPU: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}). "
            "Run it on a GPU machine; benchmarks/cpu.py is the CPU counterpart."
        )


def bench_overhead(case, device, rounds, calls):
    x = case.inputs(device)
    res = {"case": case.name, "label": case.label, "shapes": case.describe(), "calls": calls}
    runners = {}
    for kind in bu.COMPETITORS:
        try:
            run = bu.make_runner(kind, case.fn, case.jit_options)
            for _ in range(50):  # compile and warm up
                run(*x)
            bu.sync(device)
            runners[kind] = run
        except Exception as e:
            res[kind] = {"error": bu._err(e)}
            print(f"  {bu.NAMES[kind]}: {res[kind]['error']}")
    samples = {k: [] for k in runners}
    for _ in range(rounds):
        for k, run in runners.items():
            samples[k].append(bu.host_overhead_us(run, x, calls, device))
    for k, v in samples.items():
        res[k] = {"median_us": statistics.median(v), "min_us": min(v)}
    med = {k: res.get(k, {}).get("median_us") for k in bu.COMPETITORS}
    if med["keraunos"] is not None:
        for base in ("eager", "compile"):
            if med[base] is not None:
                res[f"keraunos/{base}"] = med["keraunos"] / med[base]
    return res


def main():
    args = parse()
    device = torch.device(args.device)
    if device.type == "cuda":
        require_cuda()
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # events and launches go to this device
    all_cases = cases(args.quick)
    if args._child:
        return bu.run_child(args, all_cases, device)

    selected = bu.select(all_cases, args.cases)
    if not any(c.name == "copy" for c in selected):  # the ceiling every case is compared to
        selected = [all_cases[0], *selected]
    calls = args.calls or (200 if args.quick else 2000)
    m = bu.meta(device)
    print(f"# gpu: {bu.header(m)}")
    results, overhead = [], None
    for c in selected:
        print(f"{c.label}: {c.describe()}", flush=True)
        torch._dynamo.reset()
        if c.extra.get("overhead"):
            overhead = bench_overhead(c, device, args.rounds, calls)
            print(
                "  "
                + "  ".join(
                    f"{bu.NAMES[k]} {overhead[k]['median_us']:.2f} µs"
                    for k in bu.COMPETITORS
                    if "median_us" in overhead.get(k, {})
                ),
                flush=True,
            )
            continue
        r = bu.bench_case(c, device, args.rounds, args.round_s)
        results.append(r)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(
            "  "
            + "  ".join(
                f"{bu.NAMES[k]} {v['median_s'] * 1e6:.1f} µs ({v['bandwidth'] / 1e12:.3f} TB/s)"
                for k, v in r["competitors"].items()
                if "median_s" in v
            ),
            flush=True,
        )
    copy_bw = results[0]["competitors"]["eager"].get("bandwidth")
    for r in results:
        for v in r["competitors"].values():
            if copy_bw and "bandwidth" in v:
                v["of_copy"] = v["bandwidth"] / copy_bw

    ctimes = []
    if not args.no_compile_time:
        child_args = ["--device", args.device] + (["--quick"] if args.quick else [])
        for c in selected:
            if c.name in ("copy", "overhead"):
                continue
            print(f"compile time, {c.label} (4 fresh processes)...", flush=True)
            ctimes.append(bu.compile_times(os.path.abspath(__file__), c, child_args))

    report(m, results, overhead, ctimes)
    if args.json:
        bu.write_json(
            args.json,
            {"meta": m, "results": results, "overhead": overhead, "compile": ctimes},
        )


def report(m, results, overhead, ctimes):
    head = [
        "case",
        "inputs",
        "MB moved",
        "eager µs",
        "torch.compile µs",
        "keraunos µs",
        "eager TB/s (× copy)",
        "torch.compile TB/s (× copy)",
        "keraunos TB/s (× copy)",
        "keraunos / torch.compile",
        "keraunos / eager",
        "keraunos check",
    ]
    rows, notes = [], []
    for r in results:
        cs = r["competitors"]

        def us(k, cs=cs):
            v = cs.get(k)
            if v is None:
                return "–"
            return "error" if "error" in v else bu.fmt(v["median_s"] * 1e6, ".1f")

        def bw(k, cs=cs):
            v = cs.get(k, {})
            if "bandwidth" not in v:
                return "–"
            return f"{v['bandwidth'] / 1e12:.3f} ({bu.fmt(v.get('of_copy'), '.2f')})"

        for k in ("compile", "keraunos"):
            v = cs.get(k, {})
            if "error" in v:
                notes.append(f"{r['label']}, {bu.NAMES[k]}: {v['error']}")
            elif v.get("check", "ok") != "ok":
                notes.append(f"{r['label']}, {bu.NAMES[k]} vs eager: {v['check']}")
        chk = cs.get("keraunos", {}).get("check", "–")
        rows.append(
            [
                r["label"],
                r["shapes"],
                f"{r['bytes'] / 1e6:.0f}",
                us("eager"),
                us("compile"),
                us("keraunos"),
                bw("eager"),
                bw("compile"),
                bw("keraunos"),
                bu.fmt(r.get("keraunos/compile")),
                bu.fmt(r.get("keraunos/eager")),
                "ok" if chk == "ok" else chk.split(":")[0],
            ]
        )
    print()
    print(bu.header(m))
    print()
    print(bu.table(head, rows))
    print()
    print(
        "Device time by CUDA events, medians over rounds; bandwidth counts every input read "
        "once and the output written once, '× copy' is its ratio to y.copy_(x)'s bandwidth in "
        "this run. Ratios are keraunos's time over the other's: lower is better."
    )
    for n in notes:
        print(f"- {n}")
    if overhead:
        print()
        o = overhead

        def cell(k):
            v = o.get(k, {})
            return "error" if "error" in v else bu.fmt(v.get("median_us"), ".2f")

        print(
            bu.table(
                [
                    "host overhead",
                    "eager µs",
                    "torch.compile µs",
                    "keraunos µs",
                    "keraunos / torch.compile",
                    "keraunos / eager",
                ],
                [
                    [
                        f"chain10 on {o['shapes']}, {o['calls']} calls",
                        cell("eager"),
                        cell("compile"),
                        cell("keraunos"),
                        bu.fmt(o.get("keraunos/compile")),
                        bu.fmt(o.get("keraunos/eager")),
                    ]
                ],
            )
        )
        print()
        print(
            "Host time per call, no synchronization between calls (DESIGN.md §4: keraunos "
            "≤ 10 µs and ≤ 0.25× torch.compile)."
        )
    if ctimes:
        print()
        print(bu.table(bu.COMPILE_HEAD, bu.compile_rows(ctimes)))
        print()
        print(bu.COMPILE_NOTE)


if __name__ == "__main__":
    main()

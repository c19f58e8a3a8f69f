"""CPU kernels side by side: eager, torch.compile (Inductor's C++ backend) and keraunos.jit, in
one run, on memory-sized elementwise chains and row reductions. Prints time per call,
effective bandwidth (bytes read + written once / time) and the ratios keraunos/eager and
keraunos/torch.compile (lower is better), checks keraunos's output against eager, then measures
cold and warm compile times in fresh subprocesses. Ends with markdown tables for RESULTS.md.

    python benchmarks/cpu.py [--cases chain10,gelu,...] [--rounds 7] [--threads N] [--quick]
                             [--round-s 0.25] [--no-compile-time] [--json out.json]

Cases (float32 unless said):
  chain10     the 10-op chain of overhead.py (sin, *2, +1, exp, -x, abs, sqrt, /3, tanh, neg)
              on 2^24 elements,
  gelu        F.gelu(x) * y + z on 2^24 elements,
  softmax     torch.softmax(x, -1) on (4096, 4096),
  layer_norm  F.layer_norm(x, (4096,), w, b) on (4096, 4096),
  rms_norm    HF's LlamaRMSNorm on bfloat16 (4096, 4096): statistics in float32, cast back,
  rms_norm_fn F.rms_norm on the same bfloat16 tensors,
  sin5, cos5, tan5, exp5, log5, tanh5, erf5, sigmoid5, pow5
              one transcendental alone in a chain of five on 2^24 elements (each step keeps
              the values in the function's domain and the chain well conditioned: sin(x) * 1.5,
              tan(x * 0.25), exp(x * -0.5),
              log(|x| + 1), pow(|x| + 0.5, 1.3), ...).
--quick uses 2^16 elements and (256, 512) rows: a smoke test, not a measurement.

Threads: --threads (default: every usable core) sets torch.set_num_threads and, by
re-executing the script once, OMP_NUM_THREADS, so OpenMP runtimes loaded later (generated
kernels' and Inductor's) get the same count.
"""

import argparse
import os
import sys

import bench_util as bu
import torch

# One transcendental in a chain of five: name -> one step.
STEPS = {
    "sin": lambda x: torch.sin(x) * 1.5,
    "cos": lambda x: torch.cos(x) * 1.5,
    "tan": lambda x: torch.tan(x * 0.25),
    "exp": lambda x: torch.exp(x * -0.5),
    "log": lambda x: torch.log(x.abs() + 1),
    "tanh": lambda x: torch.tanh(x) * 1.5,
    "erf": lambda x: torch.erf(x) * 1.5,
    "sigmoid": lambda x: torch.sigmoid(x) * 1.5,
    "pow": lambda x: torch.pow(x.abs() + 0.5, 1.3),
}


def _chain5(step):
    def chain5(x):
        for _ in range(5):
            x = step(x)
        return x

    return chain5


def cases(quick):
    n = 2**16 if quick else 2**24
    rows, cols = (256, 512) if quick else (4096, 4096)
    b, seq = (1, 64) if quick else (4, 1024)
    ce_rows = 64 if quick else 1024
    f32, bf16 = torch.float32, torch.bfloat16
    return [
        bu.Case("chain10", bu.chain10, [(n,)], f32),
        bu.Case("gelu", bu.gelu, [(n,)] * 3, f32),
        bu.Case("softmax", bu.softmax, [(rows, cols)], f32),
        bu.Case("layer_norm", bu.layer_norm, [(rows, cols), (cols,), (cols,)], f32),
        bu.Case("rms_norm", bu.rms_norm, [(rows, cols), (cols,)], bf16),
        bu.Case("rms_norm_fn", bu.rms_norm_fn, [(rows, cols), (cols,)], bf16),
        *(bu.Case(f"{name}5", _chain5(step), [(n,)], f32) for name, step in STEPS.items()),
        bu.Case(
            "rotary",
            bu.rotary,
            [(b, 8, seq, 64), (b, 2, seq, 64), (seq, 64), (seq, 64)],
            f32,
            label=f"rotary q,k {b}×8/2×{seq}×64",
        ),
        bu.Case(
            "dropout_residual",
            bu.dropout_residual,
            [(n,), (n,)],
            f32,
            check=bu.check_dropout_residual,
        ),
        bu.Case(
            "cross_entropy",
            bu.cross_entropy,
            [(ce_rows, 32768), (ce_rows,)],
            f32,
            ints={1: 32768},
            label=f"cross_entropy {ce_rows}×32k",
        ),
    ]


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cases", help="comma-separated subset of: " + ", ".join(c.name for c in cases(True))
    )
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (median reported)")
    ap.add_argument("--round-s", type=float, default=0.25, help="target seconds per round")
    ap.add_argument("--threads", type=int, default=None, help="default: all usable cores")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    ap.add_argument("--no-compile-time", action="store_true", help="skip the subprocess compiles")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bu.add_child_args(ap)
    return ap.parse_args()


def main():
    args = parse()
    threads = args.threads or bu.usable_cores()
    if os.environ.get("OMP_NUM_THREADS") != str(threads):
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    all_cases = cases(args.quick)
    if args._child:
        return bu.run_child(args, all_cases, device)

    selected = bu.select(all_cases, args.cases)
    m = bu.meta(device, threads)
    print(f"# cpu: {bu.header(m)}")
    results = []
    for c in selected:
        print(f"{c.label}: {c.describe()}", flush=True)
        torch._dynamo.reset()
        r = bu.bench_case(c, device, args.rounds, args.round_s)
        results.append(r)
        line = "  " + "  ".join(
            f"{bu.NAMES[k]} {v['median_s'] * 1e3:.3f} ms ({v['bandwidth'] / 1e9:.1f} GB/s)"
            for k, v in r["competitors"].items()
            if "median_s" in v
        )
        ratios = "  ".join(
            f"{k} {r[k]:.3f}" for k in ("keraunos/eager", "keraunos/compile") if k in r
        )
        print(line + ("  |  " + ratios if ratios else ""), flush=True)

    ctimes = []
    if not args.no_compile_time:
        child_args = ["--threads", str(threads)] + (["--quick"] if args.quick else [])
        for c in selected:
            print(f"compile time, {c.label} (4 fresh processes)...", flush=True)
            ctimes.append(bu.compile_times(os.path.abspath(__file__), c, child_args))

    report(m, results, ctimes)
    if args.json:
        bu.write_json(args.json, {"meta": m, "results": results, "compile": ctimes})


def report(m, results, ctimes):
    head = [
        "case",
        "inputs",
        "MB moved",
        "eager ms",
        "torch.compile ms",
        "keraunos ms",
        "eager GB/s",
        "torch.compile GB/s",
        "keraunos GB/s",
        "keraunos / eager",
        "keraunos / torch.compile",
        "keraunos check",
    ]
    rows, notes = [], []
    for r in results:
        cs = r["competitors"]

        def ms(k, cs=cs):
            v = cs.get(k, {})
            if "error" in v or "median_s" not in v:
                return "error" if "error" in v else "–"
            return bu.fmt(v["median_s"] * 1e3)

        def gbs(k, cs=cs):
            v = cs.get(k, {})
            return bu.fmt(v["bandwidth"] / 1e9, ".1f") if "bandwidth" in v else "–"

        chk = cs.get("keraunos", {}).get("check", "–")
        for k in ("compile", "keraunos"):
            v = cs.get(k, {})
            if "error" in v:
                notes.append(f"{r['label']}, {bu.NAMES[k]}: {v['error']}")
            elif v.get("check", "ok") != "ok":
                notes.append(f"{r['label']}, {bu.NAMES[k]} vs eager: {v['check']}")
        rows.append(
            [
                r["label"],
                r["shapes"],
                f"{r['bytes'] / 1e6:.1f}",
                ms("eager"),
                ms("compile"),
                ms("keraunos"),
                gbs("eager"),
                gbs("compile"),
                gbs("keraunos"),
                bu.fmt(r.get("keraunos/eager")),
                bu.fmt(r.get("keraunos/compile")),
                "ok" if chk == "ok" else chk.split(":")[0],
            ]
        )
    print()
    print(bu.header(m))
    print()
    print(bu.table(head, rows))
    print()
    print(
        "Medians over rounds; bandwidth counts every input read once and the output written "
        "once. Ratios are keraunos's time over the other's: lower is better, < 1 means "
        "keraunos is faster."
    )
    for n in notes:
        print(f"- {n}")
    if ctimes:
        print()
        print(bu.table(bu.COMPILE_HEAD, bu.compile_rows(ctimes)))
        print()
        print(bu.COMPILE_NOTE)


if __name__ == "__main__":
    main()

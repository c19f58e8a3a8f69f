"""PyTorch's OpInfo database against eager: every op of `op_db` (float32, CPU), SAMPLES
samples each, the op and its in-place variant, with consecutive fusion and generated kernels
and with dataflow fusion run through torch (scripts/opinfo_sweep.py is the same sweep from
the command line, by default with 4 samples and kernels for both fusion types). Refusals are allowed; wrong results and internal errors are not,
except the known ones below (strict: an op listed here that passes fails the test, so that
the list shrinks as they are fixed)."""

import os
import time

from xfail_check import check_known_failures, load_script

SAMPLES = int(os.environ.get("KERAUNOS_OPINFO_SAMPLES", "4"))
# (fusion type, generated kernels)
CONFIGS = [("consecutive", True), ("dataflow", False)]

# op name -> why it fails today (a file outside the mapping table and the op library).
XFAIL: dict[str, str] = {}


def test_opinfo_against_eager(monkeypatch, capsys):
    # tests/python check CUDA code generation through NVRTC; here it would add an NVRTC
    # compilation to each of the sweep's ~1000 kernels.
    monkeypatch.setenv("KERAUNOS_CHECK_CUDA_CODEGEN", "0")
    sweep = load_script("opinfo_sweep")
    ops = sweep.op_db()
    t0 = time.perf_counter()
    results, timing = [], []
    for ft, fu in CONFIGS:
        t1 = time.perf_counter()
        results.append(sweep.sweep(ops, samples=SAMPLES, fusion_types=(ft,), fusion_settings=(fu,)))
        timing.append(
            f"{ft} {'with' if fu else 'without'} kernels {time.perf_counter() - t1:.0f} s"
        )
    result = {
        "cases": [c for r in results for c in r["cases"]],
        "skipped": {k: v for r in results for k, v in r["skipped"].items()},
        "ops": {},
    }
    for r in results:
        for name, o in r["ops"].items():
            prev = result["ops"].get(name)
            if prev is None or sweep._RANK[o["status"]] > sweep._RANK[prev["status"]]:
                result["ops"][name] = o
    with capsys.disabled():  # the totals belong in the CI log
        sweep.report(result)
        print(f"time: {time.perf_counter() - t0:.0f} s ({', '.join(timing)})")

    check_known_failures(result, XFAIL, "wrong results")

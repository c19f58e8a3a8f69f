"""PyTorch's OpInfo database against eager: every op of `op_db` (float32, CPU), SAMPLES
samples each, the op and its in-place variant, with consecutive fusion and generated kernels
and with dataflow fusion run through torch (scripts/opinfo_sweep.py is the same sweep from
the command line, by default with 4 samples and kernels for both fusion types). Refusals are allowed; wrong results and internal errors are not,
except the known ones below (strict: an op listed here that passes fails the test, so that
the list shrinks as they are fixed)."""

import importlib.util
import os
import pathlib
import time

import pytest

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "opinfo_sweep.py"
SAMPLES = int(os.environ.get("KERAUNOS_OPINFO_SAMPLES", "4"))
# (fusion type, generated kernels)
CONFIGS = [("consecutive", True), ("dataflow", False)]

# op name -> why it fails today (a file outside the mapping table and the op library).
XFAIL: dict[str, str] = {}


def _sweep_module():
    spec = importlib.util.spec_from_file_location("opinfo_sweep", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_opinfo_against_eager(monkeypatch, capsys):
    # tests/python check CUDA code generation through NVRTC; here it would add an NVRTC
    # compilation to each of the sweep's ~1000 kernels.
    monkeypatch.setenv("KERAUNOS_CHECK_CUDA_CODEGEN", "0")
    sweep = _sweep_module()
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

    failing = {
        name: o["first"]
        for name, o in result["ops"].items()
        if o["status"] in ("internal", "wrong")
    }
    new = {k: v for k, v in failing.items() if k not in XFAIL}
    fixed = sorted(k for k in XFAIL if k in result["ops"] and k not in failing)
    msg = []
    if new:
        msg.append(
            "new wrong results or internal errors:\n"
            + "\n".join(f"  {k}: {v}" for k, v in sorted(new.items()))
        )
    if fixed:
        msg.append(f"listed in XFAIL but passing now (remove them): {fixed}")
    if msg:
        pytest.fail("\n".join(msg))

"""OpInfo gradient sweep: every differentiable op of PyTorch's OpInfo database (`op_db`),
float64 on the CPU, through keraunos.jit with inputs that require grad, against eager autograd
and torch.autograd.gradcheck.

For each op that supports autograd in float64 on the CPU, up to --samples of its own
`sample_inputs(requires_grad=True)` (the samples PyTorch's test_ops_gradients checks). A case
is one (op, fusion type, sample); it is classified as

- pass: the compiled forward + backward pair ran (compile_stats' grad_fallback is None), its
  outputs and which of them require grad equal eager's, the gradients of every input that
  requires grad (of a fixed random weighting of the outputs) equal eager's, and
  torch.autograd.gradcheck (fast mode) passes on the compiled function wherever it passes on
  eager's (a sample at a non-differentiable point fails both: its gradcheck is not counted);
- torch: autograd recorded the program through torch (compile_stats' grad_fallback says why:
  e.g. a write autograd must see); values and gradients still equal eager's;
- refused: keraunos raises NotImplementedError("keraunos: ...") where eager does not;
- internal: keraunos raises where eager does not (another exception), or the case ran past
  --timeout;
- wrong: values, gradients, which outputs require grad, or gradcheck differ.

An op's status is its worst case's class (wrong > internal > refused > torch > pass).

    python scripts/opinfo_grad_sweep.py [--samples 2] [--fusion-types consecutive,dataflow]
        [--ops sin,mul] [--verbose] [--details] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import itertools
import json
import os
import pathlib
import sys
import time
import traceback
import warnings

import torch
import torch.utils._pytree as pytree

import keraunos
from keraunos.testing import clone_args, differences

_sweep_path = pathlib.Path(__file__).resolve().parent / "opinfo_sweep.py"
_spec = importlib.util.spec_from_file_location("opinfo_sweep", _sweep_path)
fwd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fwd)

CLASSES = ("pass", "torch", "refused", "internal", "wrong")
_RANK = {c: i for i, c in enumerate(CLASSES)}

# float64: values and gradients (test_grad.py's tolerances).
ATOL, RTOL = 1e-5, 1e-4


def differentiable(op) -> bool:
    return op.supports_autograd and torch.float64 in op.supported_backward_dtypes("cpu")


def grad_samples(op, n):
    """Up to n usable float64 samples whose tensors require grad."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = op.sample_inputs("cpu", torch.float64, requires_grad=True)
        for s in itertools.islice(gen, 4 * n + 8):
            leaves = pytree.tree_leaves((s.input, s.args, s.kwargs))
            if fwd._usable(s) is None and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in leaves
            ):
                out.append(s)
            if len(out) >= n:
                break
    return out


def _tensor_outputs(out):
    return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))


def _weighted_grads(outs, ins):
    g = torch.Generator().manual_seed(0)
    loss = None
    for o in outs:
        if o.requires_grad:
            w = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
            term = (o * w).sum()
            loss = term if loss is None else loss + term
    req = [t for t in ins if t.requires_grad]
    if loss is None or not req:
        return None
    return list(torch.autograd.grad(loss, req, allow_unused=True))


def _gradcheck(f, inputs) -> str | None:
    """None when gradcheck (fast mode) passes, else its message's first line."""
    try:
        ok = torch.autograd.gradcheck(
            f,
            inputs,
            eps=1e-6,
            atol=ATOL,
            rtol=1e-3,
            fast_mode=True,
            check_undefined_grad=False,
            raise_exception=True,
        )
    except Exception as e:  # GradcheckError, or the function's own error
        return f"{type(e).__name__}: {fwd._short(str(e).strip().splitlines()[0], 200)}"
    return None if ok else "gradcheck returned False"


def run_case(fn, tensors, *, fusion_type, timeout=60, gradcheck=True):
    """(class, detail) of one sample through keraunos.jit against eager."""
    eager_args = clone_args(tensors)
    jit_args = clone_args(tensors)
    try:
        with fwd._alarm(timeout):
            expected = _tensor_outputs(fn(*eager_args))
            g_e = _weighted_grads(expected, eager_args)
    except fwd.CaseTimeout as e:
        return "skip", f"eager {e}"
    except Exception as e:
        return "skip", f"eager raises {type(e).__name__}"
    if g_e is None:
        return "skip", "no differentiable output"
    jf = keraunos.jit(fn, fusion_type=fusion_type)
    try:
        with fwd._alarm(timeout):
            actual = _tensor_outputs(jf(*jit_args))
            stats = keraunos.compile_stats(jf)
            g_k = _weighted_grads(actual, jit_args)
    except fwd.CaseTimeout as e:
        return "internal", f"timeout: keraunos {e}"
    except Exception as e:
        if fwd._is_refusal(e):
            return "refused", fwd.refusal_reason(str(e))
        where = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])
        return "internal", f"keraunos raised {type(e).__name__}: {fwd._short(e, 300)}\n{where}"
    flags_k = [t.requires_grad for t in actual]
    flags_e = [t.requires_grad for t in expected]
    if flags_k != flags_e:
        return "wrong", f"outputs' requires_grad {flags_k} vs eager {flags_e}"
    detached = lambda ts: [t.detach() for t in ts]  # noqa: E731
    diff = differences(detached(actual), detached(expected), "output", ATOL, RTOL)
    if g_k is None:
        diff = diff or "keraunos' outputs have no gradient"
    for i, (k, e) in enumerate(zip(g_k or [], g_e)):
        if diff:
            break
        if (k is None) != (e is None):
            diff = f"gradient of input {i}: {'None' if k is None else 'a tensor'} vs eager {'None' if e is None else 'a tensor'}"
        elif e is not None:
            diff = differences(k, e, f"gradient of input {i}", ATOL, RTOL)
    if diff:
        return "wrong", fwd._short(diff, 600)
    reason = stats["grad_fallback"]
    if reason is not None:
        return "torch", fwd.refusal_reason(reason)
    if gradcheck:
        inputs = tuple(clone_args(tensors))
        try:
            with fwd._alarm(timeout):
                mine = _gradcheck(lambda *ts: _tensor_outputs(jf(*ts)), inputs)
                if mine is not None and _gradcheck(lambda *ts: _tensor_outputs(fn(*ts)), inputs):
                    mine = None  # eager's gradcheck fails here too (a non-differentiable point)
        except fwd.CaseTimeout as e:
            return "internal", f"timeout: gradcheck {e}"
        if mine is not None:
            return "wrong", f"gradcheck: {mine}"
    return "pass", ""


def sweep(
    ops,
    *,
    samples=2,
    fusion_types=("consecutive",),
    timeout=60,
    gradcheck=True,
    verbose=False,
    log=print,
):
    cases, op_results, skipped = [], {}, {}
    for op in ops:
        name = fwd.op_name(op)
        if not differentiable(op):
            skipped[name] = "no float64 autograd on the CPU"
            continue
        t0 = time.perf_counter()
        try:
            sample_list = grad_samples(op, samples)
        except Exception as e:
            skipped[name] = f"sample_inputs raised {type(e).__name__}: {fwd._short(e, 100)}"
            continue
        op_cases = []
        for si, sample in enumerate(sample_list):
            tensors, rebuild = fwd.split(sample)
            func, post = fwd.as_called(op.op), sample.output_process_fn_grad

            def fn(*ts, _f=func, _rebuild=rebuild, _post=post):
                inp, args, kwargs = _rebuild(ts)
                return _post(_f(inp, *args, **kwargs))

            for ft in fusion_types:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        cls, detail = run_case(
                            fn, tensors, fusion_type=ft, timeout=timeout, gradcheck=gradcheck
                        )
                    except Exception as e:  # the harness itself
                        cls, detail = (
                            "internal",
                            f"harness: {type(e).__name__}: {fwd._short(e, 300)}",
                        )
                if cls == "skip":
                    continue
                op_cases.append(
                    {
                        "op": name,
                        "fusion_type": ft,
                        "sample": si,
                        "sample_repr": fwd._short(repr(sample), 400),
                        "class": cls,
                        "detail": detail,
                    }
                )
        cases.extend(op_cases)
        if not op_cases:
            skipped[name] = "no sample ran"
            continue
        status = max((c["class"] for c in op_cases), key=_RANK.__getitem__)
        first = next(c for c in op_cases if c["class"] == status)
        op_results[name] = {
            "status": status,
            "cases": len(op_cases),
            "by_class": dict(collections.Counter(c["class"] for c in op_cases)),
            "first": None
            if status == "pass"
            else f"{first['fusion_type']} s{first['sample']}: "
            + fwd._short(first["detail"].splitlines()[0] if first["detail"] else "", 200),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        if verbose:
            r = op_results[name]
            extra = f"  [{r['first']}]" if r["first"] else ""
            log(f"{status:9s} {name:45s} {r['seconds']:6.1f}s{extra}")
    return {"cases": cases, "ops": op_results, "skipped": skipped}


def report(result, log=print, top=12):
    ops = result["ops"]
    n = len(ops)
    by = collections.Counter(r["status"] for r in ops.values())
    log("")
    log(f"differentiable ops run: {n} (skipped: {len(result['skipped'])})")
    log(f"  compiled, gradients and gradcheck pass: {by['pass']:4d} / {n}")
    log(f"  autograd through torch (grad_fallback): {by['torch']:4d}")
    log(f"  refused:                                {by['refused']:4d}")
    log(f"  internal errors:                        {by['internal']:4d}")
    log(f"  wrong gradients or values:              {by['wrong']:4d}")
    cc = collections.Counter(c["class"] for c in result["cases"])
    log(f"cases: {sum(cc.values())}: " + ", ".join(f"{k} {cc.get(k, 0)}" for k in CLASSES))
    for cls in ("torch", "refused"):
        reasons = collections.Counter(
            fwd._reason_key(c["detail"]) for c in result["cases"] if c["class"] == cls
        )
        if reasons:
            log(f"top {cls} reasons (by case):")
            for reason, k in reasons.most_common(top):
                log(f"  {k:4d}  {reason}")
    for status in ("internal", "wrong"):
        names = sorted(k for k, r in ops.items() if r["status"] == status)
        if names:
            log(f"{status}: " + ", ".join(names))
    return dict(by)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    p.add_argument(
        "--fusion-types",
        default="consecutive",
        help="comma-separated: consecutive, dataflow (default consecutive)",
    )
    p.add_argument("--ops", default="", help="comma-separated op names (name or name.variant)")
    p.add_argument("--timeout", type=int, default=60, help="seconds per case (0: none)")
    p.add_argument("--no-gradcheck", action="store_true", help="compare with eager only")
    p.add_argument("--verbose", "-v", action="store_true", help="a status line per op")
    p.add_argument("--details", action="store_true", help="print every failing case")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("KERAUNOS_CHECK_CUDA_CODEGEN", "0")
    ops = fwd.op_db()
    if a.ops:
        want = set(a.ops.split(","))
        ops = [op for op in ops if op.name in want or fwd.op_name(op) in want]
    t0 = time.perf_counter()
    result = sweep(
        ops,
        samples=a.samples,
        fusion_types=tuple(x for x in a.fusion_types.split(",") if x),
        timeout=a.timeout,
        gradcheck=not a.no_gradcheck,
        verbose=a.verbose,
    )
    if a.details:
        for c in result["cases"]:
            if c["class"] in ("internal", "wrong"):
                print(
                    f"--- {c['op']} {c['fusion_type']} sample {c['sample']}: {c['class']}\n"
                    f"{c['sample_repr']}\n{c['detail']}"
                )
    by = report(result)
    elapsed = time.perf_counter() - t0
    print(f"time: {elapsed:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "args": vars(a),
                    "seconds": round(elapsed, 1),
                    "by_status": by,
                    "ops": result["ops"],
                    "skipped": result["skipped"],
                    "cases": result["cases"],
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

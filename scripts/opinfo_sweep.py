"""OpInfo sweep: every op of PyTorch's OpInfo database (`op_db`), float32 on the CPU, through
keraunos.jit against eager.

For each op, up to --samples sample inputs, the op itself and its in-place variant (if any),
for each fusion type and fusion setting asked for. A case is one (op, variant, fusion type,
fusion, sample); it is classified as

- pass: outputs agree (values with tolerance, NaN-equal, dtypes and shapes), and so do the
  inputs' contents afterwards; or eager raises and keraunos raises the same exception type;
- refused: keraunos raises NotImplementedError("keraunos: ...") (the reason is recorded);
- internal: keraunos raises where eager does not, or raises another exception type than
  eager's, or an error mentioning its Proxy, or the case ran past --timeout;
- wrong: values, dtypes, shapes or the inputs' contents differ, or eager raised and keraunos
  did not.

An op's status is its worst case's class (wrong > internal > refused > pass). Samples that
eager cannot take at all here (complex, sparse or other non-strided tensors, non-CPU devices)
are skipped, and so are ops that do not support float32 on the CPU.

    python scripts/opinfo_sweep.py [--samples 4] [--fusion-types consecutive,dataflow]
        [--fusion | --no-fusion] [--ops add,mul] [--verbose] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import re
import signal
import sys
import time
import traceback
import warnings

import torch
import torch.utils._pytree as pytree

import keraunos
from keraunos.testing import _fp64_judgement, alias_pattern, clone_args, differences, eager_random

CLASSES = ("pass", "refused", "internal", "wrong")
_RANK = {"pass": 0, "refused": 1, "internal": 2, "wrong": 3}

# torch.testing.assert_close's float32 defaults, for every float result.
ATOL, RTOL = 1e-5, 1.3e-6

# Ops whose results' values are undefined (uninitialized memory): only dtypes, shapes and the
# inputs afterwards are compared.
UNDEFINED_VALUES = {
    "empty",
    "empty_like",
    "empty_permuted",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
}


class CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds):
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise CaseTimeout(f"ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def op_db():
    # Importing the database builds thousands of OpInfos; its warnings are not ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    return db


def op_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _plain_tensor(t) -> bool:
    return (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.is_complex()
        and not t.is_quantized
        and not getattr(t, "is_nested", False)
    )


def _usable(sample) -> str | None:
    """Why a sample is skipped, or None."""
    for leaf in pytree.tree_leaves((sample.input, sample.args, sample.kwargs)):
        if isinstance(leaf, torch.Tensor) and not _plain_tensor(leaf):
            return "non-strided, complex or non-CPU tensor"
        if isinstance(leaf, complex):
            return "complex scalar"
        if isinstance(leaf, (torch.device, str)) and str(leaf).startswith(("cuda", "meta")):
            return "non-CPU device"
    return None


def samples_of(op, n):
    """Up to n usable samples of op (float32, CPU, no grad)."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = op.sample_inputs("cpu", torch.float32, requires_grad=False)
        for s in itertools.islice(gen, 4 * n + 8):
            if _usable(s) is None:
                out.append(s)
            if len(out) >= n:
                break
    return out


def split(sample):
    """The sample's tensors (the jitted function's arguments) and a function rebuilding
    (input, args, kwargs) from them; everything else stays a constant of the function."""
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    tensors = [leaves[i] for i in slots]

    def rebuild(ts):
        ls = list(leaves)
        for i, t in zip(slots, ts):
            ls[i] = t
        return pytree.tree_unflatten(ls, spec)

    return tensors, rebuild


def _short(text: str, n=160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def refusal_reason(msg: str) -> str:
    """A refusal's text without its location, shortened: the histogram's key."""
    msg = msg.split("\n", 1)[0]
    msg = re.sub(r"^keraunos:\s*", "", msg)
    msg = re.sub(r"\s*\(at [^)]*\)", "", msg)
    return _short(msg, 300)


def _is_refusal(e) -> bool:
    """A refusal by the frontend ("keraunos: ..."), or by the core's op table (the
    NotImplementedError the trace builder raises; `record` marks it final)."""
    return isinstance(e, NotImplementedError) and (
        str(e).startswith("keraunos:") or getattr(e, "_kr_final", False)
    )


def _mentions_proxy(e) -> bool:
    return "Proxy" in str(e) or "Proxy" in type(e).__name__


def _metadata(out):
    return pytree.tree_map(
        lambda t: (
            ("tensor", t.dtype, tuple(t.shape), t.device) if isinstance(t, torch.Tensor) else t
        ),
        out,
    )


def run_case(
    fn, tensors, *, fusion_type, fusion, seed=0, timeout=60, values=True, check_alias=False
):
    """Runs fn(*tensors) eagerly and through keraunos.jit on fresh copies; returns
    (class, detail)."""
    eager_args = clone_args(tensors)
    jit_args = clone_args(tensors)
    torch.manual_seed(seed)
    try:
        with _alarm(timeout):
            expected = fn(*eager_args)
        eager_error = None
    except CaseTimeout as e:
        return "skip", f"eager {e}"
    except Exception as e:
        eager_error = e
    torch.manual_seed(seed)
    try:
        # Random ops are compared with eager's numbers: their draws come from torch here
        # (tests/python/test_random_kernels.py checks the kernels' own draws).
        with _alarm(timeout), eager_random():
            jf = keraunos.jit(fn, fusion_type=fusion_type, fusion=fusion)
            actual = jf(*jit_args)
    except CaseTimeout as e:
        return "internal", f"timeout: keraunos {e}"
    except Exception as e:
        what = f"{type(e).__name__}: {_short(e, 300)}"
        if _is_refusal(e):
            reason = refusal_reason(str(e))
            if eager_error is not None:  # (the histogram's key drops what follows a ';')
                reason += f"; eager raises {type(eager_error).__name__} here"
            return "refused", reason
        if eager_error is not None and isinstance(e, type(eager_error)) and not _mentions_proxy(e):
            return "pass", f"both raise {type(eager_error).__name__}"
        where = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:])
        if eager_error is not None:
            return "internal", (
                f"keraunos raised {what}; eager raised {type(eager_error).__name__}: "
                f"{_short(eager_error, 200)}\n{where}"
            )
        return "internal", f"keraunos raised {what}\n{where}"
    if eager_error is not None:
        return "wrong", (
            f"eager raised {type(eager_error).__name__}: {_short(eager_error, 200)}; "
            "keraunos did not"
        )
    if not values:
        actual, expected = _metadata(actual), _metadata(expected)
    diff = differences(actual, expected, "output", ATOL, RTOL) or differences(
        jit_args, eager_args, "input after the call", ATOL, RTOL
    )
    if diff and "values differ" in diff:
        # As accurate as eager against a float64 reference (chains that amplify an ulp)?
        ref = _fp64_judgement(fn, tensors, {}, seed, (actual, jit_args), (expected, eager_args))
        if ref is None:
            return "pass", "within float64-reference tolerance"
        diff = f"{diff}\n{ref}"
    if diff:
        return "wrong", _short(diff, 600)
    if check_alias:
        a, e = alias_pattern(jit_args, actual), alias_pattern(eager_args, expected)
        if a != e:
            return "wrong", f"aliasing: {a} vs eager {e}"
    return "pass", ""


def as_called(func):
    """An unbound torch.Tensor method (`torch.Tensor.add_`) called as user code calls it,
    `x.add_(...)`: a Proxy is not a torch.Tensor, so the descriptor itself refuses it."""
    name = getattr(func, "__name__", None)
    if name and getattr(torch.Tensor, name, None) is func:

        def method(inp, *args, **kwargs):
            return getattr(inp, name)(*args, **kwargs)

        return method
    return func


def variants(op):
    out = [("op", as_called(op.op))]
    if op.inplace_variant is not None:
        out.append(("inplace", as_called(op.inplace_variant)))
    return out


def sweep(
    ops,
    *,
    samples=4,
    fusion_types=("consecutive", "dataflow"),
    fusion_settings=(True,),
    timeout=60,
    check_alias=False,
    verbose=False,
    log=print,
):
    """Runs the sweep; returns {"cases": [...], "ops": {name: {...}}, "skipped": {...}}."""
    cases = []
    op_results = {}
    skipped = {}
    for op in ops:
        name = op_name(op)
        if torch.float32 not in op.supported_dtypes("cpu"):
            skipped[name] = "no float32 on the CPU"
            continue
        t0 = time.perf_counter()
        try:
            sample_list = samples_of(op, samples)
        except Exception as e:
            skipped[name] = f"sample_inputs raised {type(e).__name__}: {_short(e, 100)}"
            continue
        if not sample_list:
            skipped[name] = "no usable samples"
            continue
        op_cases = []
        for si, sample in enumerate(sample_list):
            tensors, rebuild = split(sample)
            for vname, func in variants(op):

                def fn(*ts, _f=func, _rebuild=rebuild):
                    inp, args, kwargs = _rebuild(ts)
                    return _f(inp, *args, **kwargs)

                for ft in fusion_types:
                    for fu in fusion_settings:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            try:
                                cls, detail = run_case(
                                    fn,
                                    tensors,
                                    fusion_type=ft,
                                    fusion=fu,
                                    timeout=timeout,
                                    values=op.name not in UNDEFINED_VALUES,
                                    check_alias=check_alias,
                                )
                            except Exception as e:  # the harness itself
                                cls, detail = (
                                    "internal",
                                    f"harness: {type(e).__name__}: {_short(e, 300)}",
                                )
                        if cls == "skip":
                            continue
                        op_cases.append(
                            {
                                "op": name,
                                "variant": vname,
                                "fusion_type": ft,
                                "fusion": fu,
                                "sample": si,
                                "sample_repr": _short(repr(sample), 400),
                                "class": cls,
                                "detail": detail,
                            }
                        )
        cases.extend(op_cases)
        if not op_cases:
            skipped[name] = "no sample ran"
            continue
        status = max((c["class"] for c in op_cases), key=_RANK.__getitem__)
        first = next((c for c in op_cases if c["class"] == status), None)
        op_results[name] = {
            "status": status,
            "cases": len(op_cases),
            "by_class": dict(collections.Counter(c["class"] for c in op_cases)),
            "first": None if status == "pass" else _first_line(first),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        if verbose:
            r = op_results[name]
            extra = f"  [{r['first']}]" if r["first"] else ""
            log(f"{status:9s} {name:45s} {r['seconds']:6.1f}s{extra}")
    return {"cases": cases, "ops": op_results, "skipped": skipped}


def _first_line(case) -> str:
    where = f"{case['variant']} {case['fusion_type']}{'' if case['fusion'] else ' nofusion'} s{case['sample']}"
    return f"{where}: {_short(case['detail'].splitlines()[0] if case['detail'] else '', 200)}"


def totals(result) -> dict:
    ops = result["ops"]
    by_status = collections.Counter(r["status"] for r in ops.values())
    reasons = collections.Counter()
    for c in result["cases"]:
        if c["class"] == "refused":
            reasons[c["detail"]] += 1
    op_reasons = collections.Counter()
    for name, r in ops.items():
        if r["status"] == "refused":
            rs = {
                c["detail"] for c in result["cases"] if c["op"] == name and c["class"] == "refused"
            }
            for x in rs:
                op_reasons[_reason_key(x)] += 1
    return {
        "ops": len(ops),
        "ops_by_status": {k: by_status.get(k, 0) for k in CLASSES},
        "cases_by_class": {k: sum(1 for c in result["cases"] if c["class"] == k) for k in CLASSES},
        "skipped_ops": len(result["skipped"]),
        "refusal_reasons_by_op": op_reasons.most_common(),
        "refusal_reasons_by_case": reasons.most_common(),
    }


def _reason_key(reason: str) -> str:
    """Groups refusals that differ only in the callable's name or numbers."""
    key = re.sub(r"^[\w.]+(\(out=\.\.\.\))?\s", "<call>\\1 ", reason)
    key = re.sub(r"\(aten\.[\w.]+\)", "(aten...)", key)
    key = re.sub(r"\[[^\]]*\]", "[..]", key)
    key = re.sub(r"\b\d+\b", "N", key)
    key = re.sub(r"torch\.(float|int|uint|bool|complex|bfloat)\w*", "<dtype>", key)
    return _short(key.split(";")[0], 110)


def report(result, log=print, top=15):
    t = totals(result)
    n = t["ops"]
    s = t["ops_by_status"]
    log("")
    log(f"ops run: {n} (skipped: {t['skipped_ops']})")
    log(f"  passing:          {s['pass']:4d} / {n}")
    log(f"  refused:          {s['refused']:4d}")
    log(f"  internal errors:  {s['internal']:4d}")
    log(f"  wrong results:    {s['wrong']:4d}")
    c = t["cases_by_class"]
    log(
        f"cases: {sum(c.values())}: pass {c['pass']}, refused {c['refused']}, "
        f"internal {c['internal']}, wrong {c['wrong']}"
    )
    if t["refusal_reasons_by_op"]:
        log(f"top refusal reasons (ops whose worst class is refused, by reason; top {top}):")
        for reason, k in t["refusal_reasons_by_op"][:top]:
            log(f"  {k:4d}  {reason}")
    for status in ("internal", "wrong"):
        names = sorted(k for k, r in result["ops"].items() if r["status"] == status)
        if names:
            log(f"{status}: " + ", ".join(names))
    return t


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=4, help="samples per op (default 4)")
    p.add_argument(
        "--fusion-types",
        default="consecutive,dataflow",
        help="comma-separated: consecutive, dataflow (default both)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fusion", dest="fusion", action="store_true", default=True)
    g.add_argument("--no-fusion", dest="fusion", action="store_false")
    g.add_argument("--both-fusion", action="store_true", help="fusion on and off")
    p.add_argument(
        "--ops", default="", help="comma-separated op names (OpInfo name or name.variant)"
    )
    p.add_argument("--timeout", type=int, default=60, help="seconds per case (0: none)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument(
        "--check-alias",
        action="store_true",
        help="also compare which outputs alias which inputs (and are the same object)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="a status line per op")
    p.add_argument("--details", action="store_true", help="print every failing case")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)

    torch.set_num_threads(a.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    fusion_types = tuple(x for x in a.fusion_types.split(",") if x)
    fusion_settings = (True, False) if a.both_fusion else (a.fusion,)
    ops = op_db()
    if a.ops:
        want = set(a.ops.split(","))
        ops = [op for op in ops if op.name in want or op_name(op) in want]
    t0 = time.perf_counter()
    result = sweep(
        ops,
        samples=a.samples,
        fusion_types=fusion_types,
        fusion_settings=fusion_settings,
        timeout=a.timeout,
        check_alias=a.check_alias,
        verbose=a.verbose,
    )
    if a.details:
        for c in result["cases"]:
            if c["class"] in ("internal", "wrong"):
                print(
                    f"--- {c['op']} {c['variant']} {c['fusion_type']} fusion={c['fusion']} "
                    f"sample {c['sample']}: {c['class']}\n{c['sample_repr']}\n{c['detail']}"
                )
    t = report(result)
    elapsed = time.perf_counter() - t0
    print(f"time: {elapsed:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "args": vars(a),
                    "seconds": round(elapsed, 1),
                    "totals": t,
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

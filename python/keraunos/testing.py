"""Comparing keraunos with eager PyTorch: used by the tests and the fuzzer."""

from __future__ import annotations

import contextlib
import traceback

import torch
import torch.utils._pytree as pytree

import keraunos


def clone_args(args):
    """Deep-copies args, preserving storage sharing between tensors (views stay views of a
    copied storage) so that eager and jit see the same aliasing pattern."""
    leaves, spec = pytree.tree_flatten(args)
    storages: dict[int, torch.UntypedStorage] = {}
    out = []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            out.append(leaf)
            continue
        st = leaf.untyped_storage()
        key = st.data_ptr() if st.nbytes() else id(leaf)
        if key not in storages:
            storages[key] = st.clone()
        t = torch.empty(0, dtype=leaf.dtype, device=leaf.device).set_(
            storages[key], leaf.storage_offset(), leaf.size(), leaf.stride()
        )
        if leaf.requires_grad:
            t.requires_grad_(True)
        out.append(t)
    return pytree.tree_unflatten(out, spec)


def alias_pattern(args, outputs):
    """For each output tensor: the input tensors and earlier outputs it shares storage with,
    and those it is the very same object as."""
    ins = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
    outs = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]

    def sid(t):
        return t.untyped_storage().data_ptr() if t.numel() else None

    pat = []
    for j, o in enumerate(outs):
        s = sid(o)
        pat.append(
            (
                tuple(i for i, t in enumerate(ins) if s is not None and sid(t) == s),
                tuple(i for i, t in enumerate(ins) if t is o),
                tuple(k for k in range(j) if s is not None and sid(outs[k]) == s),
                tuple(k for k in range(j) if outs[k] is o),
            )
        )
    return pat


def _fusion_on() -> bool:
    from .jit import _fusion_default

    return _fusion_default() and bool(keraunos._C.cpu_compiler_info()["available"])


# Fused kernels compute floating-point math with their own vectorized functions and summation
# order, so floats compare with torch.testing's default tolerances (integers and bool stay
# exact) while fusion is on.
FUSED_FLOAT_TOLERANCE = _fusion_on()


def fused_tolerance(dtype) -> dict:
    """Tolerances for comparing a fused float result with eager's: torch.testing's defaults,
    widened for float16/bfloat16 to one rounding of the result's dtype either way (a result
    computed in float32 that lands near a rounding midpoint may round the other way)."""
    if dtype == torch.float16:
        return {"rtol": 2e-3, "atol": 2e-3}
    if dtype == torch.bfloat16:
        return {"rtol": 1.6e-2, "atol": 1.6e-2}
    return {}


def differences(actual, expected, what="output", atol=0.0, rtol=0.0) -> str | None:
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if a_spec != e_spec:
        return f"{what}: structure {a_spec} vs eager {e_spec}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"{what}[{i}]: {type(a).__name__} vs an eager tensor"
            if (a.dtype, a.shape, a.device) != (e.dtype, e.shape, e.device):
                return f"{what}[{i}]: {a.dtype}{list(a.shape)} {a.device} vs eager {e.dtype}{list(e.shape)} {e.device}"
            tol = {"atol": atol, "rtol": rtol}
            if FUSED_FLOAT_TOLERANCE and a.dtype.is_floating_point and atol == rtol == 0.0:
                tol = fused_tolerance(a.dtype)
            try:
                torch.testing.assert_close(a, e, equal_nan=True, **tol)
            except AssertionError as err:
                return f"{what}[{i}]: values differ: {err}"
        elif not (a == e or (a != a and e != e)):
            return f"{what}[{i}]: {a!r} vs eager {e!r}"
    return None


def _fp64_judgement(fn, args, kwargs, seed, actual, expected) -> str | None:
    """A float result off eager's by more than the tolerances can still be as accurate as
    eager's: chains like exp(exp(x)) amplify a one-ulp difference (torch._dynamo's `same`
    makes the same call). Runs fn in float64 and accepts when keraunos's error against that
    reference is at most 3x eager's (plus 1e-5 absolute), element for element in aggregate;
    NaN and infinity positions must match eager's exactly."""

    def to64(obj):
        return pytree.tree_map(
            lambda t: (
                t.double()
                if isinstance(t, torch.Tensor)
                and t.dtype in (torch.float32, torch.float16, torch.bfloat16)
                else t
            ),
            obj,
        )

    ref_args = to64(clone_args((args, kwargs)))
    if seed is not None:
        torch.manual_seed(seed)
    try:
        ref_out = fn(*ref_args[0], **ref_args[1])
    except Exception as e:
        return f"values differ; the float64 reference raised {type(e).__name__}: {e}"
    a_leaves = pytree.tree_leaves(actual)
    e_leaves = pytree.tree_leaves(expected)
    r_leaves = pytree.tree_leaves((ref_out, ref_args))
    if not (len(a_leaves) == len(e_leaves) == len(r_leaves)):
        return "values differ (no comparable float64 reference)"
    for i, (a, e, r) in enumerate(zip(a_leaves, e_leaves, r_leaves)):
        if not isinstance(e, torch.Tensor) or not e.dtype.is_floating_point:
            continue
        if not isinstance(r, torch.Tensor) or r.shape != e.shape:
            return "values differ (no comparable float64 reference)"
        a64, e64, r64 = a.double(), e.double(), r.double()
        if not torch.equal(a64.isnan(), e64.isnan()) or not torch.equal(
            a64.isinf() & (a64 == e64), e64.isinf()
        ):
            return f"leaf {i}: NaN/inf positions differ from eager's"
        fin = torch.isfinite(e64) & torch.isfinite(r64)
        err_a = (a64 - r64)[fin].abs().max() if fin.any() else torch.tensor(0.0)
        err_e = (e64 - r64)[fin].abs().max() if fin.any() else torch.tensor(0.0)
        if err_a > 3 * err_e + 1e-5:
            return (
                f"leaf {i}: values differ: max error vs a float64 reference {err_a.item():.3g}, "
                f"eager's {err_e.item():.3g}"
            )
    return None


# What `compare` returns when keraunos refuses a program whose eager result depends on the
# order in which eager's kernel visits elements (an in-place op reading another view of the
# memory it writes).
REFUSED = "refused: order-dependent in-place overlap"


@contextlib.contextmanager
def eager_random(on=True):
    """Random draws through torch (eager's numbers) while compiling inside the block, for
    comparisons of random numbers with eager's under one seed (the kernel_random option)."""
    if not on:
        yield
        return
    before = keraunos._C.option_override("kernel_random")
    keraunos.set_option("kernel_random", False)
    try:
        yield
    finally:
        keraunos._C.set_option("kernel_random", before)  # the caller's setting, if any, again


def compare(
    fn,
    args,
    kwargs=None,
    *,
    fusion_type="consecutive",
    seed=None,
    atol=0.0,
    rtol=0.0,
    check_alias=True,
    via: str = "jit",
    info: dict | None = None,
) -> str | None:
    """Runs fn eagerly and through keraunos.jit on copies of the same arguments. None when they
    agree on outputs, the inputs' contents after the call and aliasing; else what differs.

    via="compile" runs it through torch.compile(fn, backend="keraunos") instead (keraunos.compile,
    after torch._dynamo.reset()); `info`, when given, receives keraunos.compile_stats of it
    (regions that ran eagerly, keraunos refusals that fell back to eager)."""
    if via not in ("jit", "compile"):
        raise ValueError(f"via must be 'jit' or 'compile', got {via!r}")
    kwargs = kwargs or {}
    eager_args, jit_args = clone_args((args, kwargs)), clone_args((args, kwargs))
    if seed is not None:
        torch.manual_seed(seed)
    try:
        expected = fn(*eager_args[0], **eager_args[1])
    except Exception as e:
        eager_error = e
    else:
        eager_error = None
    if seed is not None:
        torch.manual_seed(seed)
    if via == "compile":
        from torch import _dynamo

        _dynamo.reset()
        runner = keraunos.compile(fn, fusion_type=fusion_type)
    else:
        runner = keraunos.jit(fn, fusion_type=fusion_type)
    try:
        with eager_random(seed is not None):
            actual = runner(*jit_args[0], **jit_args[1])
    except Exception as e:
        if eager_error is not None and isinstance(e, type(eager_error)):
            return None
        if (
            eager_error is None
            and isinstance(e, NotImplementedError)
            and "iteration order" in str(e)
        ):
            # A documented refusal: eager's result depends on its kernel's iteration order.
            return REFUSED
        return f"keraunos raised {type(e).__name__}: {e}\n{traceback.format_exc()}"
    if info is not None and via == "compile":
        info.update(keraunos.compile_stats(runner))
    if eager_error is not None:
        return f"eager raised {type(eager_error).__name__}: {eager_error}; keraunos did not"
    values = differences(actual, expected, "output", atol, rtol) or differences(
        jit_args, eager_args, "input after the call", atol, rtol
    )
    if values and "values differ" in values and FUSED_FLOAT_TOLERANCE:
        values = _fp64_judgement(fn, args, kwargs, seed, (actual, jit_args), (expected, eager_args))
    return values or (
        None
        if not check_alias or alias_pattern(jit_args, actual) == alias_pattern(eager_args, expected)
        else f"aliasing: {alias_pattern(jit_args, actual)} vs eager {alias_pattern(eager_args, expected)}"
    )


def compare_grad(fn, args, *, fusion_type="consecutive", seed=None, info=None) -> str | None:
    """compare() for a program whose inputs require grad, then the backward: the gradients of
    every input that requires grad (of a fixed random weighting of the differentiable
    outputs) against eager's, and which outputs require grad. `info`, when given, receives
    "compiled": whether the pair of compiled programs ran (else the reason it ran through torch).
    """
    problem = compare(fn, args, fusion_type=fusion_type, seed=seed)
    if problem is not None:
        return problem
    eager_args, jit_args = clone_args(args), clone_args(args)
    if seed is not None:
        torch.manual_seed(seed)
    try:
        expected = fn(*eager_args)
    except Exception:
        return None  # compare() agreed on the error
    jf = keraunos.jit(fn, fusion_type=fusion_type)
    if seed is not None:
        torch.manual_seed(seed)
    with eager_random(seed is not None):
        actual = jf(*jit_args)
    if info is not None:
        reason = keraunos.compile_stats(jf)["grad_fallback"]
        info["compiled"] = reason is None
        info["reason"] = reason
    outs_e = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    outs_k = [t for t in pytree.tree_leaves(actual) if isinstance(t, torch.Tensor)]
    flags_e = [t.requires_grad for t in outs_e]
    flags_k = [t.requires_grad for t in outs_k]
    if flags_e != flags_k:
        return f"outputs' requires_grad {flags_k} vs eager {flags_e}"

    def grads(outs, ins):
        g = torch.Generator().manual_seed(0 if seed is None else seed)
        loss = None
        for o in outs:
            if o.requires_grad:
                w = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device, o.dtype)
                term = (o * w).sum()
                loss = term if loss is None else loss + term
        req = [
            t for t in pytree.tree_leaves(ins) if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        if loss is None or not req:
            return []
        return list(torch.autograd.grad(loss, req, allow_unused=True))

    try:
        g_e = grads(outs_e, eager_args)
    except Exception as e:
        eager_error = e
    else:
        eager_error = None
    try:
        g_k = grads(outs_k, jit_args)
    except Exception as e:
        if eager_error is not None and isinstance(e, type(eager_error)):
            return None
        return f"keraunos' backward raised {type(e).__name__}: {e}\n{traceback.format_exc()}"
    if eager_error is not None:
        return f"eager's backward raised {type(eager_error).__name__}: {eager_error}; keraunos' did not"
    for i, (k, e) in enumerate(zip(g_k, g_e)):
        if (k is None) != (e is None):
            return f"gradient of input {i}: {'None' if k is None else 'a tensor'} vs eager {'None' if e is None else 'a tensor'}"
        if e is not None:
            d = differences(k, e, f"gradient of input {i}", 1e-5, 1e-4)
            if d:
                return d
    return None


def import_torchvision():
    """Imports torchvision, or returns None when it is not installed. A torchvision whose C++
    operators cannot load (the registry's CUDA wheel next to a CPU torch) still has plain
    PyTorch models: the operator schemas its Python modules register fake kernels for are then
    defined, and it is imported again (its detection ops raise when called)."""
    import importlib.util
    import sys

    global _TV_LIB
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e) or _TV_LIB is not None:
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        _TV_LIB = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            _TV_LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import torchvision
    return torchvision


_TV_LIB = None

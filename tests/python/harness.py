"""Compare a jitted function with eager PyTorch: outputs (values, dtypes, shapes), the
contents of every input after the call, and which outputs alias which inputs and outputs."""

from __future__ import annotations

import os

import pytest
import torch
import torch.utils._pytree as pytree

import keraunos
from keraunos.testing import (  # noqa: E402
    FUSED_FLOAT_TOLERANCE,
    alias_pattern,
    clone_args,
    eager_random,
    fused_tolerance,
)  # noqa: E402

_TEST_DEVICE = os.environ.get("KERAUNOS_TEST_DEVICE", "cpu")

# For test modules about generated kernels: `pytestmark = KERNEL_TESTS` skips them without a C++
# compiler (on the CPU) and has every CPU kernel's CUDA twin generated and compiled (NVRTC,
# when present) too.
KERNEL_TESTS = [
    pytest.mark.skipif(
        _TEST_DEVICE == "cpu" and not keraunos._C.cpu_compiler_info()["available"],
        reason="kernels need a C++ compiler",
    ),
    pytest.mark.usefixtures("cuda_twins"),
]


@pytest.fixture
def eager_draws():
    """For tests that compare random numbers with eager's: draws through torch."""
    with eager_random():
        yield


@pytest.fixture
def cuda_twins(monkeypatch):
    monkeypatch.setenv("KERAUNOS_CHECK_CUDA_CODEGEN", "1")


def _to_device(obj, device):
    """Copies the tensors of obj to device, keeping which ones share storage (views stay
    views of one copied storage)."""
    copied = clone_args(obj)
    leaves, spec = pytree.tree_flatten(copied)
    storages = {}
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu":
            st = leaf.untyped_storage()
            key = st.data_ptr() if st.nbytes() else id(leaf)
            if key not in storages:
                storages[key] = st.to(device=device)
            t = torch.empty(0, dtype=leaf.dtype, device=device).set_(
                storages[key], leaf.storage_offset(), leaf.size(), leaf.stride()
            )
            t.requires_grad_(leaf.requires_grad)
            out.append(t)
        else:
            out.append(leaf)
    return pytree.tree_unflatten(out, spec)


def assert_same(actual, expected, *, exact=True, atol=None, rtol=None, what="output"):
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec, f"{what}: structure differs: {a_spec} vs {e_spec}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{what}[{i}]: expected a tensor, got {type(a)}"
            assert a.dtype == e.dtype, f"{what}[{i}]: dtype {a.dtype} vs eager {e.dtype}"
            assert a.shape == e.shape, (
                f"{what}[{i}]: shape {tuple(a.shape)} vs eager {tuple(e.shape)}"
            )
            assert a.device == e.device, f"{what}[{i}]: device {a.device} vs eager {e.device}"
            if exact and atol is None:
                # Fused kernels compute floating-point math with their own (vectorized)
                # functions and summation order: torch's default tolerances for floats,
                # exact for integers and bool.
                tol = (
                    fused_tolerance(a.dtype)
                    if a.dtype.is_floating_point and FUSED_FLOAT_TOLERANCE
                    else {"rtol": 0, "atol": 0}
                )
                torch.testing.assert_close(
                    a, e, equal_nan=True, msg=lambda m, i=i: f"{what}[{i}]: {m}", **tol
                )
            else:
                torch.testing.assert_close(
                    a,
                    e,
                    rtol=rtol,
                    atol=atol,
                    equal_nan=True,
                    msg=lambda m, i=i: f"{what}[{i}]: {m}",
                )
        else:
            assert a == e or (a != a and e != e), f"{what}[{i}]: {a!r} vs eager {e!r}"


def check(
    fn,
    *args,
    fusion_type="consecutive",
    exact=True,
    atol=None,
    rtol=None,
    seed=None,
    check_alias=True,
    check_strides=False,
    **kwargs,
):
    """Runs fn eagerly and through keraunos.jit on copies of the same arguments and asserts
    they agree. Returns the jitted function (for trace assertions).

    KERAUNOS_TEST_DEVICE=cuda moves every tensor argument to the GPU first, so the whole op
    suite runs through the CUDA fusion executor on a GPU machine."""
    if _TEST_DEVICE != "cpu":
        args, kwargs = _to_device((args, kwargs), _TEST_DEVICE)
    eager_args = clone_args((args, kwargs))
    jit_args = clone_args((args, kwargs))
    if seed is not None:
        torch.manual_seed(seed)
    jf = keraunos.jit(fn, fusion_type=fusion_type)
    try:
        expected = fn(*eager_args[0], **eager_args[1])
    except Exception as e:  # eager raises: keraunos must raise the same kind of error
        with pytest.raises(type(e)):
            jf(*jit_args[0], **jit_args[1])
        return jf
    if seed is not None:
        torch.manual_seed(seed)
    # A seeded check compares random numbers with eager's: the draws come from torch.
    with eager_random(seed is not None):
        actual = jf(*jit_args[0], **jit_args[1])
    assert_same(actual, expected, exact=exact, atol=atol, rtol=rtol)
    assert_same(jit_args, eager_args, exact=exact, atol=atol, rtol=rtol, what="input after call")
    if check_alias:
        assert alias_pattern(jit_args, actual) == alias_pattern(eager_args, expected), (
            "aliasing differs from eager"
        )
    if check_strides:
        for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected)):
            if isinstance(e, torch.Tensor):
                assert a.stride() == e.stride(), f"strides {a.stride()} vs eager {e.stride()}"
    # A second call hits the cache and must agree too.
    jit_args2 = clone_args((args, kwargs))
    eager_args2 = clone_args((args, kwargs))
    if seed is not None:
        torch.manual_seed(seed + 1)
    expected2 = fn(*eager_args2[0], **eager_args2[1])
    if seed is not None:
        torch.manual_seed(seed + 1)
    with eager_random(seed is not None):
        actual2 = jf(*jit_args2[0], **jit_args2[1])
    assert_same(actual2, expected2, exact=exact, atol=atol, rtol=rtol)
    assert keraunos.compile_stats(jf)["hits"] >= 1
    return jf


def check_prims(fn, *args, atol=1e-5, rtol=1e-5, **kwargs):
    """Runs the jitted trace's decomposition (prims only, through torch) and compares it with
    eager: checks each language op's decomposition numerically."""
    from keraunos.jit import build_program

    jf = keraunos.jit(fn)
    jit_args = clone_args((args, kwargs))
    jf(*jit_args[0], **jit_args[1])
    final = keraunos.last_traces(jf)[-2]
    _, prog = build_program(final, prims=True)
    flat_in = [
        t for t in pytree.tree_leaves(clone_args((args, kwargs))) if isinstance(t, torch.Tensor)
    ]
    eager_args = clone_args((args, kwargs))
    expected = fn(*eager_args[0], **eager_args[1])
    actual = prog(*flat_in)
    e_leaves = [t for t in pytree.tree_leaves(expected)]
    a_leaves = list(actual) if isinstance(actual, tuple) else [actual]
    assert len(a_leaves) == len(e_leaves)
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            assert a.dtype == e.dtype and a.shape == e.shape, (
                f"{a.dtype}{tuple(a.shape)} vs {e.dtype}{tuple(e.shape)}"
            )
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)


def canonical(trace) -> str:
    """A printed trace without comments, proxies renamed in order of appearance (golden tests)."""
    import re

    lines = []
    in_region = False
    for ln in str(trace).splitlines()[1:]:
        if in_region and ln.startswith("    # ") and not ln.startswith("      "):
            lines.append("    " + ln[6:].split("  #", 1)[0].rstrip())  # a region member
            continue
        code = ln.split("#", 1)[0].rstrip()
        if code.strip():
            lines.append(code)
            in_region = "ltorch.fusion(" in code
    text = "\n".join(lines)
    names = {}

    def rename(m):
        return names.setdefault(m.group(0), f"t{len(names)}")

    return re.sub(r"\bt\d+\b", rename, text) + "\n"

"""CPU kernel schedules against eager: innermost pointwise loops with chains of costly values
(transcendentals) run in stages over blocks of elements, column reductions in tiles of points
(codegen/cpu_emitter.cpp)."""

import pytest
import torch

import keraunos
from harness import _TEST_DEVICE

pytestmark = pytest.mark.skipif(
    _TEST_DEVICE != "cpu" or not keraunos._C.cpu_compiler_info()["available"],
    reason="CPU kernels",
)


def _kernel_sources(jf):
    return [k.source for k in keraunos.last_traces(jf)[-1].kernels]


def _check(fn, *args, staged=True):
    jf = keraunos.jit(fn)
    ours, ref = jf(*args), fn(*args)
    torch.testing.assert_close(ours, ref, rtol=2e-5, atol=2e-5)
    sources = _kernel_sources(jf)
    assert sources, "no kernel was generated"
    assert any("_s[256]" in s for s in sources) == staged, sources
    return ours


@pytest.mark.parametrize("n", [512, 1000, 4099, 1 << 16])
def test_chains_of_costly_ops_run_in_stages(n):
    x = torch.randn(n)

    def chain(a):
        for _ in range(3):
            a = torch.sin(a) * 1.5
        return torch.erf(a) + torch.tanh(a * 0.5).exp() - torch.sigmoid(a).log()

    _check(chain, x)


def test_stages_with_broadcasts_casts_and_several_outputs():
    x = torch.randn(64, 1031)
    w = torch.randn(1031)
    i = torch.randint(-3, 4, (64, 1031), dtype=torch.int32)

    def f(a, b, c):
        h = torch.exp(a * -0.5) * b
        g = torch.cos(h) + c
        return h, (g * 0.25).tan(), (g.abs() + 0.5).pow(1.3)

    _check(f, x, w, i)


def test_a_short_loop_or_a_single_costly_op_is_not_staged():
    _check(lambda a: a.exp().sin(), torch.randn(300), staged=False)
    _check(lambda a: a.exp() * 2 + 1, torch.randn(1 << 14), staged=False)


def test_in_place_writes_are_not_staged():
    def f(a):
        a.copy_(a.sin().exp().cos())
        return a

    x = torch.randn(1 << 12)
    ref = f(x.clone())
    jf = keraunos.jit(f)
    y = x.clone()
    torch.testing.assert_close(jf(y), ref)
    torch.testing.assert_close(y, ref)


@pytest.mark.parametrize("shape", [(300, 301), (4, 33, 130), (1000, 7)])
@pytest.mark.parametrize("op", ["gelu_sum", "amax", "int_sum"])
def test_column_reductions_run_in_tiles_of_points(shape, op):
    """A reduction over the outer dims (a bias or norm-weight gradient) reduces a tile of 128
    neighbouring points per row, each row of the tile one contiguous simd loop, instead of one
    point at a time with a row's stride; each point still combines its rows in order."""
    x = torch.randn(*shape)
    x.view(-1)[17] = float("nan")
    dims = tuple(range(x.dim() - 1))
    w = torch.randn(shape[-1])
    fns = {
        "gelu_sum": lambda a, w: (torch.nn.functional.gelu(a) * w).sum(dims),
        "amax": lambda a, w: (a * w).amax(dims),
        "int_sum": lambda a, w: (a > w).sum(dims),
    }
    f = fns[op]
    jf = keraunos.jit(f)
    torch.testing.assert_close(jf(x, w), f(x, w), rtol=2e-5, atol=2e-5, equal_nan=True)
    assert any("_b += 128" in s and "_t[128]" in s for s in _kernel_sources(jf))


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_a_reduction_over_size_one_dims_after_a_column_nest_keeps_the_plain_loop(fusion_type):
    """The grad fuzzer's seed 25003998: softmax over a size-1 dim after a column amin puts an
    accumulator of its own after the column nest; such a point loop is not tiled (it produced
    C++ that did not compile)."""

    def f(a):
        return (a * 2 - 1).amin(0, keepdim=True).softmax(0)

    x = torch.randn(4, 6)
    jf = keraunos.jit(f, fusion_type=fusion_type)
    torch.testing.assert_close(jf(x), f(x))
    xk, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    w = torch.randn(1, 6)
    (jf(xk) * w).sum().backward()
    (f(xe) * w).sum().backward()
    torch.testing.assert_close(xk.grad, xe.grad)

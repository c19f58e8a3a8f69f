"""Index reductions and scans inside generated kernels (codegen/lower.cpp): argmax / argmin as a
max / min of (value, position) keys (kr_argmax_key: the first index of the extreme value wins,
NaN counts as the extreme and the first NaN wins, as in eager), and cumsum as a Scan loop (a
running sum along its dim, in eager's accumulation type). Values against eager for several
dtypes, dims and keepdim, ties, NaNs, all-equal rows, eager's errors, fusion with producers and
consumers (both fusion types), and that no torch call computes them. With NVRTC present the CUDA
twin of every kernel is compiled too (KERNEL_TESTS); KERAUNOS_TEST_DEVICE=cuda runs the same
checks on a GPU."""

import pytest
import torch

import keraunos
from harness import _TEST_DEVICE, KERNEL_TESTS, check, cuda_twins  # noqa: F401

pytestmark = KERNEL_TESTS

FUSION_TYPES = ("consecutive", "dataflow")
_TORCH_CALLS = (
    "_prims.argmax",
    "_prims.argmin",
    "_prims.cumsum",
    "torch.argmax",
    "torch.argmin",
    "torch.cumsum",
)


def _program(jf):
    return str(keraunos.last_traces(jf)[-1]).split("def program")[1]


def _in_kernels(jf, kernels=None):
    """Asserts that kernels computed the function: no torch call for argmax/argmin/cumsum."""
    prog = _program(jf)
    for call in _TORCH_CALLS:
        assert call not in prog, prog
    ks = keraunos.last_traces(jf)[-1].kernels
    assert ks, prog
    if kernels is not None:
        assert len(ks) == kernels, prog
    return prog


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _values(shape, dtype, seed=0):
    """Values with many ties: small integers (as floats for float dtypes)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=_g(seed)).bool()
    lo = 0 if dtype == torch.uint8 else -4
    x = torch.randint(lo, 5, shape, generator=_g(seed))
    return x.to(dtype)


# ---------------------------------------------------------------- argmax / argmin

_ARG_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
]


@pytest.mark.parametrize("dtype", _ARG_DTYPES)
def test_argmax_argmin_dims_keepdim(dtype):
    x = _values((5, 7, 37), dtype)
    for fn in (
        lambda a: a.argmax(-1),
        lambda a: a.argmin(1, keepdim=True),
        lambda a: torch.argmax(a, 0, True),
        lambda a: a.argmin(dim=2),
        lambda a: a.argmax(),
        lambda a: a.argmin(keepdim=True),
    ):
        _in_kernels(check(fn, x))


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_argmax_random_floats(fusion_type):
    x = torch.randn(33, 300, generator=_g())
    jf = check(lambda a: (a.argmax(-1), a.argmin(0), a.argmax()), x, fusion_type=fusion_type)
    _in_kernels(jf)


def test_ties_take_the_first_index():
    x = torch.tensor(
        [
            [1.0, 3.0, 3.0, 0.0, 3.0],
            [2.0, 2.0, 2.0, 2.0, 2.0],  # all equal
            [-0.0, 0.0, -0.0, 0.0, -1.0],  # zeros of both signs are equal
            [float("-inf")] * 5,
            [float("inf"), 1.0, float("inf"), float("-inf"), float("-inf")],
            [-5.0, -1.0, -5.0, -1.0, -5.0],
        ]
    )
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = x.to(dtype)
        _in_kernels(check(lambda a: (a.argmax(1), a.argmin(1), a.argmax(0), a.argmin(0)), a))
    i = torch.tensor([[3, 7, 7, 1], [0, 0, 0, 0], [-128, 127, -128, 127]], dtype=torch.int32)
    _in_kernels(check(lambda a: (a.argmax(1), a.argmin(1), a.argmax(), a.argmin()), i))
    _in_kernels(check(lambda a: (a.argmax(1), a.argmin(1)), i.to(torch.int8)))
    big = torch.full((2, 6), 2**31 - 1, dtype=torch.int32)
    big[1] = -(2**31)
    _in_kernels(check(lambda a: (a.argmax(1), a.argmin(1), a.argmax(), a.argmin()), big))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nan_is_the_extreme_and_the_first_nan_wins(dtype):
    nan, inf = float("nan"), float("inf")
    x = torch.tensor(
        [
            [1.0, nan, 3.0, nan, inf],
            [nan, 0.0, nan, -inf, 2.0],
            [-inf, -inf, 1.0, 2.0, nan],
            [nan, nan, nan, nan, nan],
            [0.5, 0.25, 0.5, 0.25, 0.0],
        ]
    ).to(dtype)
    jf = check(lambda a: (a.argmax(1), a.argmin(1), a.argmax(0), a.argmin(0), a.argmax()), x)
    _in_kernels(jf)


def test_long_rows_and_tail_ties():
    # Rows long enough for the CUDA block and cluster schedules (their twins compile here): the
    # maximum is tied at the end of the row and at a position handled by another thread.
    for cols in (1000, 5000, 70000):
        x = torch.randn(4, cols, generator=_g(cols))
        x[:, cols - 1] = 10.0
        x[:, 3] = 10.0
        x[1, cols // 2] = float("nan")
        x[2, cols - 2] = float("nan")
        _in_kernels(check(lambda a: (a.argmax(1), a.argmin(1)), x))


def test_max_min_with_dim_fuse_values_and_indices():
    x = _values((6, 40), torch.float32, seed=3)
    x[2, 5] = float("nan")
    jf = check(lambda a: (torch.max(a, 1), torch.min(a, 0, keepdim=True)), x)
    _in_kernels(jf, kernels=2)
    b = _values((4, 9), torch.bool)
    _in_kernels(check(lambda a: (torch.max(a, 1), a.max(dim=0).indices), b))


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_argmax_fuses_with_producers_and_consumers(fusion_type):
    x = torch.randn(8, 50, generator=_g())
    y = torch.randn(8, 50, generator=_g(1))
    jf = check(lambda x, y: torch.argmax(x * 2 + y, dim=-1), x, y, fusion_type=fusion_type)
    _in_kernels(jf, kernels=1)
    logits = torch.randn(16, 10, generator=_g(2))
    labels = torch.randint(0, 10, (16,), generator=_g(3))
    labels[:8] = logits[:8].argmax(-1)
    jf = check(
        lambda lg, lb: (lg.argmax(-1) == lb).float().mean(),
        logits,
        labels,
        fusion_type=fusion_type,
    )
    _in_kernels(jf)
    jf = check(
        lambda lg: (lg.softmax(-1).argmax(-1), (lg - 1).argmin(-1, keepdim=True) * 2),
        logits,
        fusion_type=fusion_type,
    )
    _in_kernels(jf)


def test_argmax_errors_as_eager():
    # Empty reduced dims, empty tensors without a dim, bool tensors: eager's error types.
    check(lambda a: a.argmax(0), torch.empty(0, 3))
    check(lambda a: a.argmin(), torch.empty(0, 3))
    check(lambda a: a.argmax(1), torch.empty(2, 0))
    check(lambda a: a.argmax(), torch.tensor([True, False]))
    check(lambda a: a.argmax(2), torch.randn(2, 3))
    # Reducing a non-empty dim of a tensor with an empty other dim gives an empty result.
    check(lambda a: a.argmax(1), torch.empty(0, 3))
    # 0-d and size-1 dims.
    _in_kernels(check(lambda a: (a.argmax(), a.argmin(0, True)), torch.tensor(2.5)))
    _in_kernels(check(lambda a: (a.argmax(1), a.argmin(0)), torch.randn(1, 4, generator=_g())))


def test_wide_dtypes_stay_in_torch():
    # float64 and int64 values do not fit the 32 bits of a key: torch computes them.
    for dtype in (torch.float64, torch.int64):
        x = _values((3, 8), dtype)
        jf = check(lambda a: (a * 2).argmax(-1), x)
        assert "argmax" in _program(jf)


# ---------------------------------------------------------------- cumsum


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    ],
)
def test_cumsum_dims_and_dtypes(dtype):
    x = _values((4, 6, 9), dtype) if not dtype.is_floating_point else torch.randn(4, 6, 9).to(dtype)
    for fn in (
        lambda a: a.cumsum(-1),
        lambda a: a.cumsum(0),
        lambda a: torch.cumsum(a, 1),
    ):
        _in_kernels(check(fn, x))


def test_cumsum_dtype_argument():
    x = torch.randn(5, 20, generator=_g())
    i = torch.randint(-3, 4, (5, 20), generator=_g(1), dtype=torch.int32)
    for fn, a in (
        (lambda a: a.cumsum(1, dtype=torch.float64), x),
        (lambda a: a.cumsum(0, dtype=torch.bfloat16), x),
        (lambda a: a.cumsum(1, dtype=torch.float32), i),
        (lambda a: a.cumsum(-1, dtype=torch.int32), i),
        (lambda a: torch.cumsum(a.half(), 1, dtype=torch.float32), x),
    ):
        _in_kernels(check(fn, a))


def test_cumsum_edges():
    _in_kernels(check(lambda a: (a.cumsum(0), a.cumsum(-1)), torch.tensor(2.0)))
    _in_kernels(check(lambda a: (a.cumsum(0), a.cumsum(1)), torch.randn(1, 7, generator=_g())))
    _in_kernels(check(lambda a: a.cumsum(0) * 2, torch.randn(300, generator=_g())))
    # Empty tensors and bad dims: as eager.
    check(lambda a: a.cumsum(1), torch.empty(0, 3))
    check(lambda a: a.cumsum(2), torch.randn(2, 3))
    # Infinities and NaN run through the sum as in eager.
    x = torch.tensor([[1.0, float("inf"), -float("inf"), 2.0], [float("nan"), 1.0, 2.0, 3.0]])
    _in_kernels(check(lambda a: a.cumsum(1), x))


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_cumsum_fuses_with_producers(fusion_type):
    x = torch.randn(6, 33, generator=_g())
    y = torch.randn(6, 33, generator=_g(1))
    jf = check(lambda x, y: torch.cumsum(x * 2 + y, dim=-1), x, y, fusion_type=fusion_type)
    _in_kernels(jf, kernels=1)
    # A consumer reads the materialized scan (a second kernel); a transposed input scans along
    # an outer dim.
    jf = check(
        lambda x, y: (x.t().exp().cumsum(0) / (y.t() + 3)).sum(0),
        x,
        y,
        fusion_type=fusion_type,
    )
    _in_kernels(jf)
    jf = check(
        lambda x: (x.softmax(-1).cumsum(-1), (x > 0).cumsum(0), x.cumsum(1).argmax(1)),
        x,
        fusion_type=fusion_type,
    )
    _in_kernels(jf)


def test_cumsum_inplace():
    x = torch.randn(3, 40, generator=_g())
    _in_kernels(check(lambda a: a.cumsum_(1), x))
    _in_kernels(check(lambda a: a.mul_(2).cumsum_(0).add_(1), x))


def test_cumsum_long_rows():
    for shape, dim in (((3, 5000), 1), ((5000, 3), 0), ((70000,), 0)):
        x = torch.randn(*shape, generator=_g())
        # Partial sums reach ~sqrt(n) in size; a parallel scan (CUDA: ours and eager's, each
        # its own tree) rounds them in another order than a serial loop: absolute error ~1e-5.
        _in_kernels(check(lambda a, dim=dim: a.cumsum(dim), x, atol=1e-4, rtol=1e-5))
    i = torch.randint(-9, 10, (4, 3000), generator=_g(), dtype=torch.int32)
    _in_kernels(check(lambda a: a.cumsum(1), i))


@pytest.mark.skipif(_TEST_DEVICE != "cpu", reason="the CPU kernel's source")
def test_cpu_scan_is_a_serial_loop():
    jf = check(lambda a: a.cumsum(1), torch.randn(4, 64, generator=_g()))
    (k,) = keraunos.last_traces(jf)[-1].kernels
    assert "scan " in k.ir, k.ir
    loop = k.source.split("for (int64_t s")[0].rstrip().splitlines()[-1]
    assert "simd" not in loop, k.source

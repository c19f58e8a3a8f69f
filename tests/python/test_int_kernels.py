"""Integer division by a constant and float-to-int32/int64 conversion inside generated kernels
(codegen/lower.cpp: Accept::FloatOrIntByConstant and NoFloatToNarrowInt), against eager,
bit for bit, with the operands that have edge cases: negative dividends and divisors, the
integer's extremes, NaN, infinities and out-of-range floats. With NVRTC present the CUDA twin
of every kernel is compiled too."""

import pytest
import torch

import keraunos
from harness import _TEST_DEVICE, KERNEL_TESTS, check, cuda_twins  # noqa: F401

pytestmark = KERNEL_TESTS


def _kernels_only(jf):
    prog = str(keraunos.last_traces(jf)[-1])
    body = [ln.strip() for ln in prog.splitlines() if ln.startswith("  ")]
    assert all(
        ln.startswith(("t", "return")) and "= k" in ln or ln.startswith("return") for ln in body
    ), prog
    return prog


def _ints(dtype):
    info = torch.iinfo(dtype)
    edge = [info.min, info.min + 1, -7, -6, -1, 0, 1, 5, 6, 7, info.max - 1, info.max]
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, (52,), generator=g)
    return torch.cat([torch.tensor(edge, dtype=torch.int64), rand]).to(dtype)


INT_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("d", [1, 2, 3, 7, -2, -3, 100])
def test_integer_division_by_a_constant(dtype, d):
    if dtype == torch.uint8 and d < 0:
        pytest.skip("a negative divisor does not fit uint8")
    x = _ints(dtype)
    for fn in (
        lambda x: x // d,
        lambda x: x % d,
        lambda x: torch.fmod(x, d),
        lambda x: torch.div(x, d, rounding_mode="trunc"),
        lambda x: torch.div(x, d, rounding_mode="floor"),
        lambda x: (x // d) * 2 + x % d - torch.fmod(x, d),
    ):
        jf = check(fn, x)
        if dtype == torch.int8 and abs(d) == 2:
            # NVRTC miscompiled these (lower.cpp, int_by_constant): torch divides.
            body = str(keraunos.last_traces(jf)[-1]).split("def program")[1]
            assert any(op in body for op in ("div", "remainder", "fmod")), body
        else:
            _kernels_only(jf)


@pytest.mark.skipif(_TEST_DEVICE != "cpu", reason="eager's CUDA integer division by 0 is undefined")
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_divisors_a_kernel_does_not_take(dtype):
    # By zero eager raises (or not, per op); by -1, INT_MIN / -1 traps in C: torch runs them.
    x = _ints(dtype)
    for fn in (
        lambda x: x // 0,
        lambda x: x % 0,
        lambda x: x // -1,
        lambda x: x % -1,
        lambda x: torch.fmod(x, -1),
        lambda x: x // x.clamp(min=1),
    ):
        check(fn, x)


FLOATS = [
    float("nan"),
    float("inf"),
    -float("inf"),
    0.0,
    -0.0,
    0.5,
    -0.5,
    1.5,
    -1.5,
    2.5,
    -2.99,
    1e9,
    -1e9,
    2147483647.0,
    2147483648.0,
    -2147483648.0,
    -2147483904.0,
    3e9,
    -3e9,
    9.2e18,
    9.3e18,
    -9.3e18,
    1e30,
    -1e30,
]


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.int64, torch.int32])
def test_float_to_int(src, dst):
    x = torch.tensor(FLOATS, dtype=torch.float64).to(src)
    jf = check(lambda x: (x * 1).to(dst) + 1, x)
    _kernels_only(jf)
    y = torch.randn(1000, dtype=torch.float64).mul(1e3).to(src)
    check(lambda y: (y * 3.5).to(dst) // 4, y)


def test_narrow_integer_targets_run_through_torch():
    # float -> int8/int16/uint8 of out-of-range values differs between eager's kernels.
    x = torch.tensor(FLOATS[3:12])
    for dst in (torch.int8, torch.int16, torch.uint8):
        jf = check(lambda x, dst=dst: (x * 2).to(dst) + 1, x)
        assert "_kr.to(" in keraunos.last_traces(jf)[-1].source  # the cast runs in torch


def test_t5_relative_position_bucket():
    # T5's bucketing: logs of int distances cast back to long, floor divisions: one kernel.
    import math

    def bucket(rel, num_buckets=32, max_distance=128):
        num_buckets //= 2
        ret = (rel > 0).to(torch.long) * num_buckets
        n = torch.abs(rel)
        max_exact = num_buckets // 2
        is_small = n < max_exact
        large = max_exact + (
            torch.log(n.float() / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).to(torch.long)
        large = torch.min(large, torch.full_like(large, num_buckets - 1))
        return ret + torch.where(is_small, n, large)

    ctx = torch.arange(64)[:, None]
    mem = torch.arange(64)[None, :]
    check(lambda c, m: bucket(m - c), ctx, mem)

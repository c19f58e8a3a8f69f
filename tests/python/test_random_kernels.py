"""Random draws inside generated kernels (the kernel_random option): Philox4x32-10 keyed by a
seed the program draws from torch's generator (prims.def, prim_seed; kr_cpu.h, kr_philox).

Checked against an independent implementation of the generator in torch integer arithmetic
(bit for bit for uniform draws), against the distributions (mean, variance, dropout's rate),
for reproducibility under torch.manual_seed, for independence between calls and between the
random tensors of one kernel, and for the invariant that matters most: a random tensor that
two kernels of a region both recompute has the same values in both."""

import math

import pytest
import torch
import torch.nn.functional as F

import keraunos
from harness import _TEST_DEVICE, KERNEL_TESTS, cuda_twins  # noqa: F401

pytestmark = KERNEL_TESTS
DEV = _TEST_DEVICE
FUSION_TYPES = ["consecutive", "dataflow"]


@pytest.fixture(autouse=True)
def kernel_random():
    keraunos.set_option("kernel_random", True)
    yield
    keraunos.set_option("kernel_random", None)


# --- the generator, in torch int64 arithmetic (32-bit words kept in the low bits) -------------

M32 = 0xFFFFFFFF


def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 (Salmon et al., SC'11) on int64 tensors holding 32-bit words."""
    c = [torch.as_tensor(v, dtype=torch.int64) & M32 for v in (c0, c1, c2, c3)]
    k0 = torch.as_tensor(k0, dtype=torch.int64) & M32
    k1 = torch.as_tensor(k1, dtype=torch.int64) & M32
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]  # exact modulo 2^64: its bits 32..63 are the high word
        p1 = 0xCD9E8D57 * c[2]
        hi0, lo0 = (p0 >> 32) & M32, p0 & M32
        hi1, lo1 = (p1 >> 32) & M32, p1 & M32
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0 = (k0 + 0x9E3779B9) & M32
        k1 = (k1 + 0xBB67AE85) & M32
    return c


def test_reference_generator_known_answers():
    # Random123's known-answer vectors for philox4x32_10.
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for ctr, key, want in cases:
        got = philox(*ctr, *key)
        assert [int(w) for w in got] == list(want)


def seed_after(s, device=DEV):
    """The seed a program's first random segment draws after torch.manual_seed(s)."""
    torch.manual_seed(s)
    return int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64, device=device))


def words(seed, n, stream, per_block):
    """The Philox words of elements 0..n-1 of a stream, `per_block` elements to a block: element
    i takes the 4 // per_block words of block i // per_block that follow element i - 1's."""
    blocks = torch.arange((n + 3) // per_block + 1, dtype=torch.int64)
    w = torch.stack(philox(blocks, blocks >> 32, stream, 0, seed, seed >> 32), dim=-1)
    return w.reshape(-1, 4 // per_block)[:n].unbind(-1)


def reference_uniform(seed, n, stream, dtype):
    if dtype == torch.float64:
        x, y = words(seed, n, stream, 2)
        m = (x << 21) | (y >> 11)
        return m.to(torch.float64) * 2.0**-53
    (x,) = words(seed, n, stream, 4)
    bits = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}[dtype]
    return ((x >> (32 - bits)).to(torch.float64) * 2.0**-bits).to(dtype)


def reference_normal(seed, n, stream):
    x, y = words(seed, n, stream, 2)
    u1 = ((x >> 8) + 1).to(torch.float64) * 2.0**-24
    u2 = (y >> 8).to(torch.float64) * 2.0**-24
    return torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * math.pi * u2)


def _kernels(jf):
    return str(keraunos.last_traces(jf)[-1]).count("\n# kernel ")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_uniform_draws_are_philox_bit_for_bit(dtype):
    n = 3000

    def f(x):
        return torch.rand(n, dtype=dtype, device=x.device) + x

    jf = keraunos.jit(f)
    zero = torch.zeros((), dtype=dtype, device=DEV)
    torch.manual_seed(5)
    got = jf(zero)
    assert _kernels(jf) == 1, keraunos.last_traces(jf)[-1]
    seed = seed_after(5)
    # stream: the draw's position among the segment's prims (the first prim here)
    want = reference_uniform(seed, n, 0, dtype)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    assert float(got.min()) >= 0 and float(got.max()) < 1


def test_normal_draws_follow_box_muller():
    n = 4000

    def f(x):
        return torch.randn(n, device=x.device) + x

    jf = keraunos.jit(f)
    torch.manual_seed(11)
    got = jf(torch.zeros((), device=DEV))
    want = reference_normal(seed_after(11), n, 0).float()
    torch.testing.assert_close(got.cpu(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_distributions(fusion_type):
    def f(x):
        return (
            torch.rand_like(x),
            torch.randn_like(x) * 3 + 2,
            F.dropout(x, 0.25),
            torch.empty_like(x).uniform_(-2, 3) + 0,  # not [0, 1): drawn by torch, fused after
        )

    x = torch.ones(1 << 20, device=DEV)
    u, z, d, w = keraunos.jit(f, fusion_type=fusion_type)(x)
    assert abs(u.mean().item() - 0.5) < 3e-3 and abs(u.var().item() - 1 / 12) < 2e-3
    assert abs(z.mean().item() - 2) < 0.02 and abs(z.std().item() - 3) < 0.02
    kept = d != 0
    assert abs(kept.float().mean().item() - 0.75) < 3e-3
    torch.testing.assert_close(d[kept], torch.full_like(d[kept], 1 / 0.75))
    assert w.min().item() >= -2 and w.max().item() < 3 and abs(w.mean().item() - 0.5) < 0.02
    # The four tensors of one kernel are independent of each other.
    assert abs(torch.corrcoef(torch.stack([u, z, w]))[0, 1:].abs().max().item()) < 0.01


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_reproducible_under_manual_seed_and_new_on_each_call(fusion_type):
    def f(x, r):
        return F.dropout(x, 0.3) + r, torch.randn_like(x)

    jf = keraunos.jit(f, fusion_type=fusion_type)
    x, r = torch.randn(256, 64, device=DEV), torch.randn(256, 64, device=DEV)
    torch.manual_seed(0)
    a = jf(x, r)
    torch.manual_seed(0)
    b = jf(x, r)
    c = jf(x, r)
    for p, q, o in zip(a, b, c):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
        assert (p != o).float().mean() > 0.2
    # The generator moved on as eager's would: the next eager draw differs from the last one.
    torch.manual_seed(0)
    jf(x, r)
    after = torch.rand(4, device=DEV)
    torch.manual_seed(0)
    assert not torch.equal(torch.rand(4, device=DEV), after)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_a_draw_two_kernels_recompute_is_one_tensor(fusion_type):
    # u is read by the kernel of the sum and by the one of the division, and stored by neither:
    # each computes it again. The result sums to 1 only if both drew the same numbers.
    # (Column sums: the sums are broadcast along the outer loop, so an earlier kernel computes
    # them.)
    def f(x):
        u = torch.rand_like(x)
        y = u * x
        return y / y.sum(0)

    x = torch.rand(300, 17, device=DEV) + 0.5
    jf = keraunos.jit(f, fusion_type=fusion_type)
    out = jf(x)
    prog = str(keraunos.last_traces(jf)[-1])
    assert _kernels(jf) == 2 and prog.count("_kr.seed") == 1, prog
    torch.testing.assert_close(out.sum(0), torch.ones(17, device=DEV))
    # Row-wise too: the softmax-like shape of a dropout before a normalization.
    g = keraunos.jit(lambda x: F.dropout(x, 0.5).softmax(-1), fusion_type=fusion_type)
    s = g(x)
    torch.testing.assert_close(s.sum(-1), torch.ones(300, device=DEV))


def test_option_off_gives_eager_numbers():
    keraunos.set_option("kernel_random", False)

    def f(x):
        return F.dropout(x, 0.5) * 2, torch.rand_like(x) + 1

    x = torch.randn(64, 8, device=DEV)
    jf = keraunos.jit(f)
    torch.manual_seed(3)
    got = jf(x)
    torch.manual_seed(3)
    want = f(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert "_kr.seed" not in str(keraunos.last_traces(jf)[-1])


def test_eager_random_restores_the_callers_setting():
    from keraunos.testing import eager_random

    assert keraunos._C.option_override("kernel_random") == "1"  # this module's fixture
    with eager_random():
        assert keraunos._C.option("kernel_random") is False
        with eager_random():
            pass
        assert keraunos._C.option("kernel_random") is False
    assert keraunos._C.option_override("kernel_random") == "1"

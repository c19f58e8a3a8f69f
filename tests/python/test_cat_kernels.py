"""torch.cat and torch.stack inside generated kernels (codegen/lower.cpp, KernelGen::cat): each
part is read at the index clamped into its extent and a select picks the part that holds the
element, so a concatenation fuses with what computes its parts and what reads it (rotary
embeddings: one kernel). Values against eager, both fusion types; the program must hold no
torch.cat. With NVRTC present, the CUDA twin of every kernel is compiled too."""

import pytest
import torch

import keraunos
from harness import _TEST_DEVICE, KERNEL_TESTS, check, cuda_twins  # noqa: F401

pytestmark = KERNEL_TESTS

FUSION_TYPES = ("consecutive", "dataflow")


def _program(jf) -> str:
    return str(keraunos.last_traces(jf)[-1])


def _fused(fn, *args, fusion_type, kernels=1, **kw):
    jf = check(fn, *args, fusion_type=fusion_type, **kw)
    prog = _program(jf)
    assert "torch.cat" not in prog and "torch.stack" not in prog, prog
    assert len(keraunos.last_traces(jf)[-1].kernels) == kernels, prog
    return jf


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_embedding_is_one_kernel(fusion_type, dtype):
    q = torch.randn(2, 4, 16, 32, dtype=dtype)
    k = torch.randn(2, 2, 16, 32, dtype=dtype)
    cos, sin = torch.randn(16, 32, dtype=dtype), torch.randn(16, 32, dtype=dtype)
    # q and k have different shapes: one kernel each.
    _fused(rotary, q, k, cos, sin, fusion_type=fusion_type, kernels=2)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_cat_along_each_dim(fusion_type):
    a, b = torch.randn(3, 5, 4), torch.randn(3, 5, 4)
    for dim in (0, 1, 2, -1):
        _fused(
            lambda a, b, d=dim: torch.cat([a.sin(), b * 2, a + b], d),
            a,
            b,
            fusion_type=fusion_type,
            exact=False,
        )


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_parts_of_different_extents(fusion_type):
    a, b, c = torch.randn(4, 1), torch.randn(4, 7), torch.randn(4, 2)
    _fused(
        lambda a, b, c: torch.cat([a * 3, b.neg(), c + 1], 1).relu(),
        a,
        b,
        c,
        fusion_type=fusion_type,
    )
    # An input read as it is (a loaded part) and non-contiguous parts.
    _fused(
        lambda a, b: torch.cat([a, b.t() * 2], 0) - 1,
        torch.randn(2, 4),
        torch.randn(4, 3),
        fusion_type=fusion_type,
    )


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_stack(fusion_type):
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    for dim in (0, 1, 2):
        _fused(
            lambda a, b, d=dim: torch.stack([a.cos(), b * 2, a - b], d).exp(),
            a,
            b,
            fusion_type=fusion_type,
            exact=False,
        )


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.int32, torch.bool])
def test_dtypes(fusion_type, dtype):
    a = torch.randint(0, 3, (4, 6)).to(dtype)
    b = torch.randint(0, 3, (4, 6)).to(dtype)
    if dtype == torch.bool:
        _fused(
            lambda a, b: torch.cat([a & b, a | b], 1) ^ torch.cat([b, a], 1),
            a,
            b,
            fusion_type=fusion_type,
        )
    else:
        _fused(lambda a, b: torch.cat([a + b, a * b], 0) - 1, a, b, fusion_type=fusion_type)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_reductions_over_and_into_a_cat(fusion_type):
    a, b = torch.randn(6, 8), torch.randn(6, 8)
    # A reduction of a concatenation, and a concatenation of reductions.
    check(
        lambda a, b: torch.cat([a.exp(), b], 1).sum(1),
        a,
        b,
        fusion_type=fusion_type,
        exact=False,
        atol=1e-5,
        rtol=1e-5,
    )
    check(
        lambda a, b: torch.cat([a.amax(1, keepdim=True), b.sum(1, keepdim=True), a], 1) * 2,
        a,
        b,
        fusion_type=fusion_type,
        exact=False,
        atol=1e-5,
        rtol=1e-5,
    )
    check(
        lambda a, b: torch.softmax(torch.cat([a, b], 1), 1),
        a,
        b,
        fusion_type=fusion_type,
        exact=False,
        atol=1e-6,
        rtol=1e-5,
    )


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_cat_read_after_and_returned(fusion_type):
    a, b = torch.randn(3, 4), torch.randn(3, 4)

    def f(a, b):
        c = torch.cat([a * 2, b], 0)
        return c, c.sum(0), c[1:4].exp()

    check(f, a, b, fusion_type=fusion_type, exact=False, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_empty_parts_and_legacy_empty(fusion_type):
    a, e, e1 = torch.randn(3, 4), torch.randn(0, 4), torch.empty(0)
    _fused(lambda a, e, e1: torch.cat([e, a * 2, e1, e * 3], 0), a, e, e1, fusion_type=fusion_type)
    check(lambda e: torch.cat([e + 1, e], 0), e, fusion_type=fusion_type)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_cat_of_broadcasts_and_slices_of_a_cat(fusion_type):
    a, b = torch.randn(4, 1), torch.randn(1, 6)

    def f(a, b):
        c = torch.cat([a.expand(4, 6), b.expand(3, 6) + 1], 0)
        return c[::2, 1:5] * 2 + c[1:4, ::3].sum()

    check(f, a, b, fusion_type=fusion_type, exact=False, atol=1e-5, rtol=1e-5)


def repeat_kv(x, n):
    """HF's repeat_kv: key/value heads repeated for grouped-query attention."""
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_repeat_kv_is_a_vectorized_copy_kernel(fusion_type):
    """expand + reshape is a copy no view gives: a kernel makes it (not torch.reshape). The
    merged head dim's index is head // rep (the reshape's div/mod simplified), so the head dim
    stays affine and the CUDA kernel loads and stores whole vectors along it. (With a mask: an
    SDPA without one takes the kv heads with enable_gqa=True and no copy is made.)"""

    def f(q, k, v, m):
        return torch.nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=m
        )

    q = torch.randn(2, 8, 16, 32, dtype=torch.bfloat16)
    k, v = (
        torch.randn(2, 2, 16, 32, dtype=torch.bfloat16),
        torch.randn(2, 2, 16, 32, dtype=torch.bfloat16),
    )
    m = (torch.rand(16, 16) > 0.3) | torch.eye(16, dtype=torch.bool)
    jf = check(f, q, k, v, m, fusion_type=fusion_type)
    prog = _program(jf)
    assert "torch.reshape" not in prog, prog
    assert "(i1 / 4LL) * 512LL" in prog, prog
    kernels = keraunos.last_traces(jf)[-1].kernels
    assert kernels, prog
    for k in kernels:
        cuda = k.source if _TEST_DEVICE == "cuda" else k.cuda_check_source
        if cuda:
            assert f"{k.name}_vec(" in cuda, cuda


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_merged_transposed_dims_copy(fusion_type):
    """An attention output's transpose(1, 2).reshape(b, s, h) of a contiguous (b, heads, s, d)
    tensor, read by a kernel: its merged dim splits into head = i // d and i % d (the multiples
    of d of the other dims dropped from the modulus). (Alone, such a reshape stays torch's,
    which views where the runtime layout allows.)"""

    def f(a, w):
        b, nh, s, d = a.shape
        return (a.transpose(1, 2).reshape(b, s, nh * d) * 2) @ w

    jf = check(f, torch.randn(2, 4, 8, 16), torch.randn(64, 8), fusion_type=fusion_type)
    prog = _program(jf)
    assert "(i2 % 16LL)" in prog and "torch.reshape" not in prog, prog

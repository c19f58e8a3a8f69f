"""Gathers inside generated kernels (codegen/lower.cpp, KernelGen::take and ::gather): a load
whose position along one dim comes from an index tensor. F.embedding, index_select, gather,
take_along_dim, advanced indexing and cross-entropy / nll_loss (the target's logit gathered in
the kernel that reduces the rows) against eager, both fusion types; indices out of range raise
eager's error type before a CPU kernel runs (prim_check_index). With NVRTC present the CUDA
twin of every kernel is compiled too (there an index out of range traps, like eager's
device-side assert)."""

import pytest
import torch
import torch.nn.functional as F

import keraunos
from harness import _TEST_DEVICE, KERNEL_TESTS, check, cuda_twins  # noqa: F401

pytestmark = KERNEL_TESTS

FUSION_TYPES = ("consecutive", "dataflow")


def _gathers_in_kernels(jf):
    prog = str(keraunos.last_traces(jf)[-1]).split("def program")[1]
    for torch_gather in ("index_select", "torch.gather", "_prims.take", "_prims.gather"):
        assert torch_gather not in prog, prog
    assert keraunos.last_traces(jf)[-1].kernels, prog
    return prog


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding(fusion_type, dtype):
    w = torch.randn(50, 16, generator=_g()).to(dtype)
    ids = torch.randint(0, 50, (3, 7), generator=_g(1))
    pos = torch.randn(7, 16, generator=_g(2)).to(dtype)
    jf = check(
        lambda ids, w, pos: F.embedding(ids, w) * 2 + pos, ids, w, pos, fusion_type=fusion_type
    )
    prog = _gathers_in_kernels(jf)
    # The program checks the ids before a CPU kernel; a CUDA kernel traps on a bad one.
    assert ("_kr.check_index" in prog) == (_TEST_DEVICE == "cpu"), prog
    emb = torch.nn.Embedding(50, 16, padding_idx=0)
    check(lambda ids: emb(ids).sum(-1), ids, fusion_type=fusion_type, exact=False)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_index_select_gather_take_along_dim(fusion_type):
    x = torch.randn(6, 9, generator=_g())
    i = torch.tensor([4, 0, 0, 8, 2])
    gi = torch.randint(0, 9, (6, 4), generator=_g(1))
    for fn, args in (
        (lambda x, i: x.index_select(1, i).exp(), (x, i)),
        (lambda x, i: torch.index_select(x * 2, 0, i[:3]), (x, i)),
        (lambda x, i: x.index_select(1, i.int()) + 1, (x, i)),
        (lambda x, g: torch.gather(x, 1, g) * 3, (x, gi)),
        (lambda x, g: torch.gather(x.t(), 0, g.t()).sin(), (x, gi)),
        (lambda x, g: torch.take_along_dim(x, g, 1) - 1, (x, gi)),
        (lambda x, g: torch.take_along_dim(x, x.argsort(1), 1), (x, gi)),
    ):
        check(fn, *args, fusion_type=fusion_type, exact=False)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_advanced_indexing(fusion_type):
    x = torch.randn(5, 6, 7, generator=_g())
    i = torch.tensor([[0, -1], [3, 2]])  # negative indices count from the end
    j = torch.tensor([1, 5])
    for fn in (
        lambda x, i, j: x[i] * 2,
        lambda x, i, j: x[:, j] + 1,
        lambda x, i, j: x[i[0], j] - x[1, j],
        lambda x, i, j: x[..., j].exp(),
    ):
        check(fn, x, i, j, fusion_type=fusion_type, exact=False)


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"reduction": "sum"},
        {"reduction": "none"},
        {"ignore_index": 3},
        {"weight": "w"},
        {"label_smoothing": 0.1},
        {"weight": "w", "ignore_index": 1, "label_smoothing": 0.2},
    ],
)
def test_cross_entropy(fusion_type, kw):
    x = torch.randn(16, 40, generator=_g())
    t = torch.randint(0, 40, (16,), generator=_g(1))
    t[::5] = 3
    w = torch.rand(40, generator=_g(2)) + 0.5  # an argument: check moves it to the device

    def args(kw, w):
        return {k: (w if v == "w" else v) for k, v in kw.items()}

    nll_kw = {k: v for k, v in kw.items() if k != "label_smoothing"}
    tol = dict(exact=False, atol=1e-5, rtol=1e-5)
    jf = check(
        lambda x, t, w: F.cross_entropy(x, t, **args(kw, w)),
        x,
        t,
        w,
        fusion_type=fusion_type,
        **tol,
    )
    _gathers_in_kernels(jf)
    check(
        lambda x, t, w: F.nll_loss(F.log_softmax(x, 1), t, **args(nll_kw, w)),
        x,
        t,
        w,
        fusion_type=fusion_type,
        **tol,
    )


def test_cross_entropy_bf16_and_3d():
    x = torch.randn(4, 40, 6, generator=_g()).bfloat16()
    t = torch.randint(0, 40, (4, 6), generator=_g(1))
    check(lambda x, t: F.cross_entropy(x, t), x, t, exact=False, atol=1e-2, rtol=1e-2)
    x2 = torch.randn(2, 5, 64, generator=_g(2))
    t2 = torch.randint(0, 64, (2, 5), generator=_g(3))
    # An LM's loss: logits [batch, seq, vocab] flattened.
    check(
        lambda x, t: F.cross_entropy(x.view(-1, 64), t.view(-1)),
        x2,
        t2,
        exact=False,
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.skipif(
    _TEST_DEVICE != "cpu",
    reason="on CUDA an index out of range ends the process's CUDA context (eager's device-side "
    "assert, keraunos's trap) and fails every later test",
)
def test_indices_out_of_range_raise_eagers_error():
    x = torch.randn(4, 5)
    w = torch.randn(10, 3)
    for fn, args in (
        (lambda ids, w: F.embedding(ids, w) * 2, (torch.tensor([1, 10]), w)),
        (lambda ids, w: F.embedding(ids, w) * 2, (torch.tensor([-1, 2]), w)),
        (lambda x, i: x.index_select(1, i) + 1, (x, torch.tensor([0, 5]))),
        (lambda x, g: torch.gather(x, 1, g) + 1, (x, torch.tensor([[0], [7], [1], [2]]))),
        (lambda x, g: torch.gather(x, 1, g) + 1, (x, torch.tensor([[0], [-2], [1], [2]]))),
        (lambda x, t: F.cross_entropy(x, t), (x, torch.tensor([0, 1, 5, 2]))),
    ):
        check(fn, *args)  # eager raises: keraunos raises the same type
    # The same function with good indices afterwards still runs (the check is per call).
    jf = keraunos.jit(lambda ids, w: F.embedding(ids, w) * 2)
    with pytest.raises(IndexError, match="index out of range in self"):
        jf(torch.tensor([1, 10]), w)
    torch.testing.assert_close(
        jf(torch.tensor([1, 9]), w), F.embedding(torch.tensor([1, 9]), w) * 2
    )


def test_gather_of_empty_and_of_a_computed_index():
    x = torch.randn(4, 5, generator=_g())
    check(lambda x, i: x.index_select(0, i) * 2, x, torch.tensor([], dtype=torch.long))
    # The index computed in the same region is materialized first, then checked and gathered.
    check(
        lambda x, t: torch.gather(x.exp(), 1, (t * 2 + 1).unsqueeze(1)).sum(),
        x,
        torch.tensor([0, 1, 0, 1]),  # columns 1 and 3 (of 5)
        exact=False,
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("fusion_type", FUSION_TYPES)
def test_softmax_of_a_gather_reuses_values(fusion_type):
    # Fuzzer seed 700777: reuse_reduced_values dropped the load of the index a gather in the
    # pointwise loop reads (its liveness ignored the load's index).
    def f(x0):
        v3 = x0[[0, -1, 0]] * 2
        return v3.softmax(1), v3

    check(
        f,
        torch.randn(4, 6, generator=_g()),
        fusion_type=fusion_type,
        exact=False,
        atol=1e-6,
        rtol=1e-5,
    )

"""The CPU buffer pool (csrc/keraunos/python/cpu_pool.h): memory of CPU kernel outputs and
matmul results of 64 KiB or more is reused once no tensor uses it, never while one does."""

import pytest
import torch

import keraunos
from keraunos import _C, _kr

N = 128  # a 128 x 128 float32 result is 64 KiB


@pytest.fixture(autouse=True)
def _pool_on():
    keraunos.set_option("cpu_pool", None)
    keraunos.empty_cpu_pool()
    yield
    keraunos.set_option("cpu_pool", None)
    keraunos.empty_cpu_pool()


def f(a, b):
    y = a @ b  # a matmul result
    return (y * 2).relu() + 1  # a kernel output


def test_results_are_eagers_and_memory_is_reused_only_once_free():
    jf = keraunos.jit(f)
    a, b = torch.randn(N, N), torch.randn(N, N)
    r1 = jf(a, b)
    torch.testing.assert_close(r1, f(a, b))
    ptr = r1.data_ptr()
    kept = r1.clone()
    # r1 is alive: the next call must not write into it.
    r2 = jf(a * 3, b)
    assert r2.data_ptr() != ptr
    torch.testing.assert_close(r1, kept, rtol=0, atol=0)
    torch.testing.assert_close(r2, f(a * 3, b))
    hits = _C.cpu_pool_stats()["hits"]
    del r1
    r3 = jf(a - 1, b)
    torch.testing.assert_close(r3, f(a - 1, b))
    assert _C.cpu_pool_stats()["hits"] > hits


@pytest.mark.parametrize("keep", ["view", "storage"])
def test_memory_a_view_or_storage_still_uses_is_not_reused(keep):
    jf = keraunos.jit(f)
    a, b = torch.randn(N, N), torch.randn(N, N)
    for _ in range(2):
        jf(a, b)  # the pool now holds free buffers of these sizes
    r = jf(a, b)
    held = r[3:5] if keep == "view" else r.untyped_storage()
    expect = r.clone()
    ptr = r.data_ptr()
    del r
    outs = [jf(a + i, b) for i in range(4)]
    assert all(o.data_ptr() != ptr for o in outs)
    if keep == "view":
        torch.testing.assert_close(held, expect[3:5], rtol=0, atol=0)
    else:
        torch.testing.assert_close(
            torch.empty(0).set_(held, 0, expect.shape, expect.stride()), expect, rtol=0, atol=0
        )


def test_training_gradients_are_eagers_and_taken_without_copies():
    torch.manual_seed(0)
    lin = torch.nn.Linear(N, N)
    ref = torch.nn.Linear(N, N)
    ref.load_state_dict(lin.state_dict())

    def loss(m, x):
        return torch.nn.functional.gelu(m(x)).pow(2).mean()

    class CountCopies(torch.utils._python_dispatch.TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("clone", "copy_", "_to_copy"):
                CountCopies.calls += 1
            return func(*args, **(kwargs or {}))

    jf = keraunos.jit(loss)
    x = torch.randn(256, N)
    for step in range(4):
        out = jf(lin, x + step)
        with CountCopies():  # AccumulateGrad copies a gradient it cannot take as it is
            out.backward()
        assert CountCopies.calls == 0
        loss(ref, x + step).backward()
        for p, q in zip(lin.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        with torch.no_grad():
            for p, q in zip(lin.parameters(), ref.parameters()):
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
        lin.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    assert _C.cpu_pool_stats()["hits"] > 0


def test_the_pool_off_allocates_as_before():
    keraunos.set_option("cpu_pool", False)
    jf = keraunos.jit(f)
    a, b = torch.randn(N, N), torch.randn(N, N)
    for _ in range(3):
        torch.testing.assert_close(jf(a, b), f(a, b))
    assert _C.cpu_pool_stats()["held_bytes"] == 0


def test_empty_cpu_pool_releases_free_buffers_and_keeps_live_ones():
    jf = keraunos.jit(f)
    a, b = torch.randn(N, N), torch.randn(N, N)
    r = jf(a, b)
    expect = r.clone()
    assert _C.cpu_pool_stats()["held_bytes"] >= 2 * N * N * 4
    keraunos.empty_cpu_pool()
    assert _C.cpu_pool_stats()["held_bytes"] == 0
    torch.testing.assert_close(r, expect, rtol=0, atol=0)
    torch.testing.assert_close(jf(a, b), f(a, b))


@pytest.mark.parametrize(
    "sa,sb",
    [((N, N), (N, N)), ((2, N, N), (N, N)), ((2, N, N), (2, N, N)), ((2, N, N), (1, N, N))],
)
def test_cpu_matmul_is_torch_matmul(sa, sb):
    a, b = torch.randn(sa), torch.randn(sb)
    torch.testing.assert_close(_kr.cpu_matmul(a, b), torch.matmul(a, b), rtol=0, atol=0)


def test_cpu_matmul_under_autograd_records_like_torch():
    a = torch.randn(N, N, requires_grad=True)
    b = torch.randn(N, N)
    y = _kr.cpu_matmul(a, b)
    assert y.grad_fn is not None
    y.sum().backward()
    torch.testing.assert_close(a.grad, b.sum(1).expand(N, N))


def test_cpu_matmul_keeps_torchs_shape_errors():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        _kr.cpu_matmul(torch.randn(N, N), torch.randn(N + 1, N))

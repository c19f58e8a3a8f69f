"""Data-dependent points in keraunos.jit (split.py): branches on tensor values, .item(),
ops whose output shape depends on values. The program is split there; every call must agree
with eager (outputs, the inputs afterwards, random numbers, gradients), whichever way it goes."""

import pytest
import torch
import torch.nn.functional as F

import keraunos
from harness import _TEST_DEVICE, _to_device, assert_same, check, eager_draws  # noqa: F401
from keraunos.testing import clone_args


def _run_both(fn, calls, fusion_type="consecutive"):
    """Calls the jitted fn and fn on copies of each argument tuple in `calls`, in order, and
    asserts outputs and inputs afterwards agree. Returns the jitted function."""
    jf = keraunos.jit(fn, fusion_type=fusion_type)
    for args in calls:
        if _TEST_DEVICE != "cpu":  # KERAUNOS_TEST_DEVICE=cuda: on the GPU
            args = _to_device(args, _TEST_DEVICE)
        ea = clone_args(args)
        ja = clone_args(args)
        expected = fn(*ea)
        actual = jf(*ja)
        assert_same(actual, expected)
        assert_same(ja, ea, what="input after call")
    return jf


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_branch_on_a_value_takes_each_path(fusion_type):
    def f(x, y):
        z = (x * 0.5).exp()
        if z.sum() > 5:
            out = z + y
        else:
            out = z - y
        return out.tanh()

    calls = [(torch.randn(5) + s, torch.randn(5)) for s in (3, -3, 2, -2, 3)]
    jf = _run_both(f, calls, fusion_type)
    st = keraunos.compile_stats(jf)
    assert st["misses"] == 1  # one input signature; its tree grew to both paths
    sp = jf._split
    assert len(sp.root.children) == 2
    assert st["compiles"] == 3  # the segment before the branch, and one for each path


def test_item_int_and_tolist():
    def f(x):
        n = int(x.abs().sum() > 1)
        s = x.max().item()
        return x * s + n, x[:2].tolist()

    _run_both(f, [(torch.randn(4),), (torch.randn(4),)])


def test_data_dependent_output_shapes():
    def f(x, y):
        idx = torch.nonzero(x > 0)
        kept = x[x > 0]
        u = torch.unique(y)
        return kept * 2 + 1, idx.sum(0), u.float().mean(), torch.masked_select(y, y > 1)

    calls = [
        (torch.randn(8), torch.randint(0, 4, (6,))),
        (torch.randn(8), torch.randint(0, 4, (6,))),
        (torch.randn(8), torch.randint(0, 4, (6,))),
    ]
    _run_both(f, calls)


def test_mutations_before_and_after_a_point_reach_the_inputs():
    def f(x, y):
        v = x[1:]
        v.add_(1)
        if x.sum() > 0:
            y.mul_(2)
            v.mul_(3)
        else:
            x.sub_(1)
        return v.view(-1)[:2], y

    for s in (5.0, -5.0, 5.0):
        check(f, torch.randn(6) + s, torch.randn(3))


def test_aliased_inputs_across_a_point():
    def f(a, b):
        a.add_(1)
        if b.sum() > 0:  # b is a view of a: sees the write
            b.mul_(2)
        return a[2:] + b, a

    for s in (5.0, -5.0):
        base = torch.randn(6) + s
        base2 = base.clone()
        jf = keraunos.jit(f)
        out = jf(base, base[2:])
        expected = f(base2, base2[2:])
        assert_same(out, expected)
        assert_same(base, base2, what="input after call")


@pytest.mark.usefixtures("eager_draws")
def test_random_numbers_match_eager_across_points():
    def f(x):
        torch.manual_seed(7)
        a = F.dropout(x, 0.5, True)
        if a.sum() > 0:
            b = torch.rand_like(x)
        else:
            b = -torch.rand_like(x)
        return a, b + torch.randn_like(x)

    jf = keraunos.jit(f)
    for s in (3.0, -3.0, 3.0):
        x = torch.randn(64) + s
        assert_same(jf(x), f(x))


def test_gradients_flow_through_segments():
    def f(x, w):
        h = (x * w).tanh()
        if h.sum() > 0:
            return (h * 2).sum()
        return (h - 1).pow(2).sum()

    jf = keraunos.jit(f)
    for s in (2.0, -2.0):
        x = torch.randn(5) + s
        w1 = torch.rand(5, requires_grad=True)
        w2 = w1.detach().clone().requires_grad_()
        out = jf(x, w1)
        exp = f(x, w2)
        assert_same(out, exp)
        out.backward()
        exp.backward()
        assert_same(w1.grad, w2.grad, what="gradient")


def test_segments_run_compiled_forward_and_backward_programs():
    """Under autograd each segment is a compiled forward + backward pair (an autograd
    Function); gradients chain through the tensors one segment hands the next."""

    def f(x, w):
        y = (x @ w).sin()
        z = y * 2 if y.sum() > 0 else y.exp()
        n = int((z > 0.5).sum())
        return z.cos().sum() * n + y.sum()

    jf = keraunos.jit(f)
    for seed in range(3):
        torch.manual_seed(seed)
        x, w = torch.randn(4, 5), torch.randn(5, 5)
        w1, w2 = w.clone().requires_grad_(), w.clone().requires_grad_()
        out = jf(x, w1)
        assert keraunos.compile_stats(jf)["grad_fallback"] is None
        assert "autodiff" in [t.stage for t in keraunos.last_traces(jf)]
        exp = f(x, w2)
        torch.testing.assert_close(out, exp)
        out.backward()
        exp.backward()
        torch.testing.assert_close(w1.grad, w2.grad)


def test_module_with_a_value_check():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, mask):
            if (mask == 0).any():  # as attention-mask checks do
                x = x.masked_fill(mask == 0, 0.0)
            return self.lin(x).relu()

    m = M()
    jm = keraunos.jit(m)
    for mask in (torch.ones(3, 4), torch.tensor([[1.0, 0, 1, 1]] * 3), torch.ones(3, 4)):
        x = torch.randn(3, 4)
        assert_same(jm(x, mask), m(x, mask), exact=False)


def test_a_point_inside_no_grad_or_autocast_is_refused_by_name():
    def f(x):
        with torch.no_grad():
            if x.sum() > 0:
                return x + 1
        return x

    with pytest.raises(
        RuntimeError, match=r"data-dependent control flow.*test_split\.py:\d+.*no_grad"
    ):
        keraunos.jit(f)(torch.randn(3))

    def g(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return x.nonzero()

    with pytest.raises(
        RuntimeError, match=r"torch\.Tensor\.nonzero.*depends on tensor values.*autocast"
    ):
        keraunos.jit(g)(torch.randn(3))


def test_a_point_under_the_callers_autocast_region_splits():
    # The region is the caller's (part of the call's signature), not one the function enters.
    def f(x, w):
        h = (x @ w).relu()
        return h.sum() + h.nonzero().shape[0], h

    jf = keraunos.jit(f)
    device = _TEST_DEVICE
    with torch.autocast(device, dtype=torch.bfloat16):
        for scale in (1.0, 2.0, -1.0):
            x, w = torch.randn(4, 4, device=device), scale * torch.randn(4, 4, device=device)
            assert_same(jf(x, w), f(x, w))


def test_user_except_does_not_hide_a_point():
    def f(x):
        try:
            flag = bool(x.sum() > 0)
        except Exception:
            flag = None
        return x + 1 if flag else x - 1

    _run_both(f, [(torch.randn(3) + 3,), (torch.randn(3) - 3,)])


def test_errors_after_a_point_are_eagers():
    def f(x, y):
        if x.sum() > 0:
            return x + y  # wrong shapes: eager's error, with the line
        return x

    jf = keraunos.jit(f)
    with pytest.raises(RuntimeError, match=r"must match the size.*test_split\.py:\d+"):
        jf(torch.ones(3), torch.ones(4))
    assert_same(jf(-torch.ones(3), torch.ones(4)), -torch.ones(3))


def test_many_values_warn():
    def f(x):
        return x * x.sum().item()

    jf = keraunos.jit(f)
    with pytest.warns(RuntimeWarning, match="different values"):
        for i in range(12):
            x = torch.full((2,), float(i))
            assert_same(jf(x), f(x))


def test_explain_shows_the_split(capsys):
    def f(x):
        if x.sum() > 0:
            return x.sin()
        return x.cos()

    jf = keraunos.jit(f)
    jf(torch.ones(3))
    jf(-torch.ones(3))
    text = keraunos.explain(jf, file=None, traces="last")
    assert "split at data-dependent points into 3 segment(s)" in text
    assert "test_split.py" in text and "bool()" in text
    assert "= True: segment: runs to the return" in text
    assert "= False: segment: runs to the return" in text

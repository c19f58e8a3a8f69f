"""The torch fallback: calls with no op-table entry run through torch inside the program,
with their writes and views made exact; and the Python that real models use inside traced
functions (grad mode, manual_seed, torch.compiler.is_compiling)."""

import pytest
import torch
import torch.nn.functional as F

import keraunos
from harness import check, eager_draws  # noqa: F401


def _program(jf) -> str:
    return keraunos.last_traces(jf)[-1].source


def test_unmapped_call_runs_through_torch_and_fuses_around():
    def f(x):
        y = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        return (y.sin() * 2).exp()

    jf = check(f, torch.randn(1, 2, 4, 4))
    src = _program(jf)
    assert "_kr.fallback(" in src and "'torch.nn.functional.interpolate'" in src


def test_fallback_inplace_writes_input_and_its_views():
    def f(x, i, s):
        v = x[1:]
        v.scatter_reduce_(0, i, s, "amax", include_self=False)
        return x * 2, v

    check(f, torch.randn(6), torch.tensor([0, 1, 1, 3]), torch.randn(4))


def test_fallback_inplace_on_intermediate_then_read():
    def f(x, i, s):
        y = x.clone()
        r = y.index_reduce_(0, i, s, "prod")
        return y + 1, r

    check(f, torch.randn(5, 3), torch.tensor([0, 4, 2]), torch.randn(3, 3))


def test_fallback_view_output_aliases_input():
    def f(x):
        return x.unfold(0, 2, 1)

    x = torch.randn(6)
    jf = keraunos.jit(f)
    out = jf(x)
    torch.testing.assert_close(out, f(x))
    out.mul_(0)  # a view: writes reach x as in eager
    assert (x == 0).all()


def test_fallback_view_then_write_through_it():
    def f(x):
        u = x.unfold(0, 3, 3)
        u.add_(1)
        return x.sum()

    check(f, torch.randn(9))


def test_fallback_creation_and_several_outputs():
    def f(x):
        a = torch.linspace(0, 1, x.shape[0])
        q, r = torch.linalg.qr(x.reshape(4, 4))
        return x + a.repeat(4), q.abs(), r.abs()

    check(f, torch.randn(16), atol=1e-5, rtol=1e-4)


def test_fallback_random_calls_draw_in_eager_order():
    def f(x):
        a = torch.poisson(x.abs())
        b = torch.rand_like(x)
        c = F.rrelu(x, training=True)
        return a, b, c

    check(f, torch.randn(64), seed=3)


def test_fallback_non_tensor_arguments_and_outputs():
    def f(x):
        n = torch.result_type(x, 1.0)
        return x.to(n) * torch.finfo(x.dtype).eps, x.new_zeros(3, dtype=torch.int32)

    check(f, torch.randn(3))


def test_fallback_mapping_refusal_form_runs_through_torch():
    def f(x):
        return x.round(decimals=2), x.float(memory_format=torch.preserve_format) + 1

    check(f, torch.randn(8) * 10)


def test_fallback_data_dependent_shapes_split_the_program():
    # (tests/python/test_split.py has the details.)
    check(lambda x: torch.nonzero(x) + 1, torch.randn(4))
    check(lambda x: torch.unique(x) * 2, torch.randint(0, 3, (6,)))


def test_mapping_sends_forms_it_does_not_take_to_the_fallback():
    # tensor_split and addbmm_ have no op; batch_norm's op expects (N, C, ...).
    check(lambda x: torch.tensor_split(x, [1, 3], dim=1), torch.randn(2, 5))
    # (check_alias=False: an in-place call through the fallback returns a view of self, not
    # self; known.)
    check(
        lambda x, a, b: x.addbmm_(a, b),
        torch.randn(2, 4),
        torch.randn(3, 2, 5),
        torch.randn(3, 5, 4),
        check_alias=False,
    )
    check(lambda x: F.batch_norm(x, None, None, training=True), torch.randn(0))
    # torch.is_floating_point is metadata: concrete while tracing.
    check(lambda x: x + 1 if torch.is_floating_point(x) else x, torch.randn(3))


def test_mapping_refuses_what_the_fallback_cannot_make_exact():
    # (A tensor of split points splits the program: test_split.py.)
    check(lambda x, i: torch.tensor_split(x, i), torch.randn(5), torch.tensor([1, 3]))
    # Eager resizes self to the result's shape here.
    with pytest.raises(NotImplementedError, match="keraunos: torch.Tensor.addbmm_ resizes"):
        keraunos.jit(lambda x, a, b: x.addbmm_(a, b))(
            torch.randn(1), torch.randn(3, 2, 5), torch.randn(3, 5, 4)
        )


def test_fallback_refuses_effects_outside_tensors():
    def f(x):
        x.register_hook(lambda g: g)
        return x

    with pytest.raises(NotImplementedError, match="register_hook"):
        keraunos.jit(f)(torch.randn(2, requires_grad=True))


def test_fallback_errors_are_eagers():
    with pytest.raises(ValueError, match="same number of spatial dimensions"):
        keraunos.jit(lambda x: F.interpolate(x, size=(2, 2, 2)))(torch.randn(1, 1, 4, 4))
    with pytest.raises(RuntimeError, match=r"torch\.polar at .*test_fallback\.py"):
        keraunos.jit(lambda x, y: torch.kron(x, y).sin() + torch.polar(x, y).abs())(
            torch.randn(2), torch.randn(3)
        )


def test_fallback_with_grad_runs_under_autograd():
    x = torch.randn(1, 2, 4, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    f = lambda t: F.interpolate(t, scale_factor=2).sin().sum()  # noqa: E731
    keraunos.jit(f)(x).backward()
    f(x2).backward()
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.usefixtures("eager_draws")
def test_manual_seed_is_replayed_on_every_call():
    def f(x):
        torch.manual_seed(42)
        return F.dropout(x, 0.5, True), torch.rand(3)

    jf = keraunos.jit(f)
    x = torch.ones(16)
    for _ in range(3):
        torch.manual_seed(7)
        ours = jf(x)
        after_ours = torch.rand(1)
        torch.manual_seed(7)
        ref = f(x)
        after_ref = torch.rand(1)
        torch.testing.assert_close(ours, ref)
        torch.testing.assert_close(after_ours, after_ref)
    assert "_kr.manual_seed(42)" in _program(jf)


@pytest.mark.usefixtures("eager_draws")
def test_rng_state_save_and_restore_is_replayed():
    def f(x):
        state = torch.get_rng_state()
        torch.manual_seed(42)
        y = F.dropout(x, 0.5) + torch.rand_like(x)
        torch.set_rng_state(state)
        return y, torch.rand(2)

    jf = keraunos.jit(f)
    x = torch.ones(6)
    for _ in range(2):
        torch.manual_seed(1)
        ours, after_ours = jf(x), torch.rand(2)
        torch.manual_seed(1)
        ref, after_ref = f(x), torch.rand(2)
        torch.testing.assert_close(ours, ref)
        torch.testing.assert_close(after_ours, after_ref)
    src = _program(jf)
    assert "'torch.get_rng_state'" in src and "_kr.set_rng_state(" in src


def test_seed_calls_are_refused_while_tracing():
    with pytest.raises(NotImplementedError, match="torch.seed"):
        keraunos.jit(lambda x: (torch.seed(), x)[1])(torch.randn(2))
    torch.initial_seed()  # restored outside tracing


def test_inplace_fallback_returns_its_argument():
    x = torch.randn(2, 3)
    r = keraunos.jit(lambda x, a, b: x.addr_(a, b))(x, torch.randn(2), torch.randn(3))
    assert r is x


def test_inplace_fallback_that_would_resize_raises_eagers_error():
    check(lambda x, y: x.atan2_(y), torch.randn(5, 1), torch.randn(5))


def test_rdiv():
    check(lambda x: x.__rdiv__(2.0), torch.randn(3))


def test_arange_positional_start_with_end_keyword():
    check(lambda x: torch.arange(1, end=5) + x, torch.zeros(4))
    check(lambda x: torch.arange(2, end=9, step=3) + x, torch.zeros(3))


def test_is_compiling_while_tracing():
    def f(x):
        return x + 1 if torch.compiler.is_compiling() else x - 1

    jf = keraunos.jit(f)
    torch.testing.assert_close(jf(torch.zeros(2)), torch.ones(2))
    assert not torch.compiler.is_compiling()


@pytest.mark.parametrize("ctx", ["no_grad", "set_grad_enabled", "decorator", "inference_mode"])
def test_grad_mode_regions(ctx):
    def body(x, w):
        h = x * w
        if ctx == "no_grad":
            with torch.no_grad():
                s = h.sum(-1, keepdim=True)
        elif ctx == "set_grad_enabled":
            with torch.set_grad_enabled(False):
                s = h.sum(-1, keepdim=True)
        elif ctx == "inference_mode":
            with torch.inference_mode():
                s = (x * 3).sum(-1, keepdim=True)
            s = s.clone()
        else:
            s = _scale(h)
        return (h / (s.abs() + 1)).sum(), torch.is_grad_enabled()

    x = torch.randn(3, 4)
    w1 = torch.randn(4, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_()
    ours, ours_flag = keraunos.jit(body)(x, w1)
    ref, ref_flag = body(x, w2)
    assert ours_flag == ref_flag
    torch.testing.assert_close(ours, ref)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(w1.grad, w2.grad)


def _twins(*shapes):
    """Two copies of leaves that require grad: one for keraunos, one for eager."""
    a = [torch.randn(*sh, requires_grad=True) for sh in shapes]
    return a, [t.detach().clone().requires_grad_() for t in a]


def test_inplace_on_a_leaf_under_no_grad_is_not_recorded_as_in_eager():
    # Manual SGD, an EMA update, a clamp: eager allows in-place writes to leaves that require
    # grad under no_grad, and autograd does not see them.
    def f(x, w, b):
        y = (x * w).sum() + b.sum()
        with torch.no_grad():
            w.mul_(2)
            b[0] = 7.0
            w.detach().add_(1)
            z = w * 3
        return y, z, w

    x = torch.randn(3)
    (w1, b1), (w2, b2) = _twins((3,), (2,))
    ours, ref = keraunos.jit(f)(x, w1, b1), f(x, w2, b2)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close((w1, b1), (w2, b2))
    assert ours[2] is w1 and ours[1].requires_grad is False
    assert (w1.is_leaf, w1.grad_fn, b1._version > 0) == (True, None, True)
    ours[0].backward()
    ref[0].backward()
    torch.testing.assert_close((w1.grad, b1.grad), (w2.grad, b2.grad))

    # Autograd sees eager's tensor as the leaf it was; a functional program would see a value
    # computed from the old one: refused by name until it can say that.
    def h(w):
        with torch.no_grad():
            w.mul_(2)
        return w * 3

    with pytest.raises(NotImplementedError, match=r"mul.*after an in-place write.*no_grad"):
        keraunos.jit(h)(torch.randn(3, requires_grad=True))

    def g(w):
        y = w * w  # saves w
        with torch.no_grad():
            w.add_(1)
        return y

    (w1,), (w2,) = _twins((3,))
    for fn, w in ((keraunos.jit(g), w1), (g, w2)):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            fn(w).sum().backward()


def test_enable_grad_inside_a_call_under_no_grad_records_as_in_eager():
    def f(x, w):
        a = x.sin()
        with torch.enable_grad():
            y = (a * w).exp()
            z = y * 2
        return z + 1, y, torch.is_grad_enabled()

    x = torch.randn(3)
    (w1,), (w2,) = _twins((3,))
    with torch.no_grad():
        ours, ref = keraunos.jit(f)(x, w1), f(x, w2)
    torch.testing.assert_close(ours, ref)
    assert [t.requires_grad for t in ours[:2]] == [t.requires_grad for t in ref[:2]]
    ours[1].sum().backward()
    ref[1].sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad)

    def g(w):
        with torch.enable_grad():
            return w.t()

    with (
        torch.no_grad(),
        pytest.raises(NotImplementedError, match=r"torch\.Tensor\.t.*enable_grad"),
    ):
        keraunos.jit(g)(torch.randn(2, 3, requires_grad=True))


@torch.no_grad()
def _scale(h):
    return h.sum(-1, keepdim=True)


def test_autocast_regions_follow_eagers_casts():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x @ w  # bfloat16 under autocast
            s = torch.softmax(h, -1)
            with torch.autocast("cpu", enabled=False):
                g = (x @ w).sin()  # float32
        return h, s, g, (h.float() + g).exp()

    jf = check(f, torch.randn(4, 8), torch.randn(8, 8))
    out = jf(torch.randn(4, 8), torch.randn(8, 8))
    assert out[0].dtype == torch.bfloat16 and out[2].dtype == torch.float32


def test_the_callers_autocast_region_and_default_dtype_select_the_program():
    # Both are global state a trace depends on: a program traced outside autocast must not
    # run inside it (and back), nor one traced under another default dtype.
    def fn(a, b):
        h = (a @ b).sin()
        return h, h + torch.ones(4, 4)

    f = keraunos.jit(fn)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert [t.dtype for t in f(a, b)] == [torch.float32] * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = f(a, b), fn(a, b)
        assert [t.dtype for t in out] == [torch.bfloat16, torch.float32]
        torch.testing.assert_close(out, ref)
    assert [t.dtype for t in f(a, b)] == [torch.float32] * 2
    saved = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        out, ref = f(a, b), fn(a, b)
        assert [t.dtype for t in out] == [torch.float32, torch.float64]
        torch.testing.assert_close(out, ref)
    finally:
        torch.set_default_dtype(saved)
    assert [t.dtype for t in f(a, b)] == [torch.float32] * 2
    assert keraunos.compile_stats(f)["cache_size"] == 3


def test_unbound_method_calls():
    def f(x, y):
        torch.Tensor.add_(x, y)
        torch.manual_seed(3)
        z = torch.Tensor.uniform_(torch.empty_like(x), 0, 1)
        return torch.Tensor.mul(x, 2), z, x.H, x.mH, torch.tensor_split(x, torch.tensor([1]))

    check(f, torch.randn(2, 3), torch.randn(2, 3))
    # The hooks are gone after tracing.
    assert type(torch.Tensor.add_).__name__ == "method_descriptor"


def test_sparse_input_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="without strides"):
        keraunos.jit(lambda x: x * 2)(torch.eye(3).to_sparse_csr())


def test_dataclass_and_dict_outputs():
    import dataclasses

    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        extra: dict
        n: int = 3

    def f(x):
        return Out(x.sin(), {"a": x + 1, "dt": x.dtype})

    jf = keraunos.jit(f)
    x = torch.randn(3)
    for _ in range(2):
        o = jf(x)
        assert isinstance(o, Out) and o.n == 3 and o.extra["dt"] == torch.float32
        torch.testing.assert_close(o.logits, x.sin())
        torch.testing.assert_close(o.extra["a"], x + 1)


def test_batch_norm_empty_input_in_training():
    rm, rv = torch.zeros(3), torch.ones(3)
    check(lambda x, m, v: F.batch_norm(x, m, v, training=True), torch.randn(0, 3), rm, rv)


def test_detach_and_data():
    def f(x):
        return x.detach() * 2 + x.data, x.detach().requires_grad

    check(f, torch.randn(3))


@pytest.mark.parametrize(
    "f",
    [
        lambda b, x, w: torch.addmm(b, x, w),
        lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0),
        lambda b, x, w: b.addmm(x, w, beta=0),
        lambda b, x, w: torch.addmm(b[:1], x, w),
    ],
)
def test_addmm_decomposes_and_fuses(f):
    jf = check(f, torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5), atol=1e-5, rtol=1e-5)
    assert "_kr.fallback" not in _program(jf)


def test_addmm_forms_outside_the_decomposition_run_through_torch():
    check(
        lambda b, x, w: torch.addmm(b, x, w.double()),
        torch.randn(3, 5),
        torch.randn(3, 4),
        torch.randn(4, 5),
    )  # eager's dtype error
    check(
        lambda b, x, w: torch.addmm(b, x, w),
        torch.randn(6, 5),
        torch.randn(3, 4),
        torch.randn(4, 5),
    )  # eager's shape error
    check(
        lambda b, x, w: torch.baddbmm(b, x, w, alpha=3),
        torch.randn(2, 3, 5),
        torch.randn(2, 3, 4),
        torch.randn(2, 4, 5),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    jf = check(
        lambda a, b: F.mse_loss(a, b, reduction=reduction),
        torch.randn(4, 6),
        torch.randn(4, 6),
        atol=1e-5,
        rtol=1e-5,
    )
    assert "_kr.fallback" not in _program(jf)
    check(
        lambda a, b: F.mse_loss(a, b, reduction=reduction),
        torch.randn(4, 6),
        torch.randn(6),
        atol=1e-5,
        rtol=1e-5,
    )  # broadcasting (eager warns): through torch


def test_vmap_runs_through_torch_with_traced_tensors_in_closures():
    def f(x, pad):
        def mask(q, k):
            return (k <= q) & pad[k]  # pad: a traced tensor in the closure

        inner = torch.vmap(mask, in_dims=(None, 0))
        m = torch.vmap(inner, in_dims=(0, None))(torch.arange(4), torch.arange(4))
        return torch.where(m, x, -1.0)

    check(f, torch.randn(4, 4), torch.tensor([True, False, True, True]))


def test_objects_holding_tensors_are_rebuilt_on_every_call():
    class Cache:
        def __init__(self, layers):
            self.layers = layers
            self.name = "cache"

    def f(x):
        return {"out": x + 1, "cache": Cache([(x * 2, x.sum()), (x.t(), None)])}

    jf = keraunos.jit(f)
    for _ in range(2):
        x = torch.randn(2, 3)
        o = jf(x)
        c = o["cache"]
        assert isinstance(c, Cache) and c.name == "cache" and c.layers[1][1] is None
        torch.testing.assert_close(c.layers[0][0], x * 2)
        torch.testing.assert_close(c.layers[0][1], x.sum())
        torch.testing.assert_close(c.layers[1][0], x.t())
    assert jf(x)["cache"] is not o["cache"]


@pytest.mark.parametrize(
    "op",
    [
        lambda x: x.t_(),
        lambda x: x.unsqueeze_(0).squeeze_(0),
        lambda x: x.transpose_(0, 1),
        lambda x: x.swapdims_(0, 1),
        lambda x: x.as_strided_((2, 2), (1, 2), 1),
    ],
    ids=["t_", "unsqueeze_squeeze_", "transpose_", "swapdims_", "as_strided_"],
)
def test_inplace_view_ops_change_the_inputs_metadata(op):
    # The input's shape, strides and offset afterwards are eager's (harness compares them).
    def f(x, y):
        r = op(x)
        x.add_(1)
        return r * 2, y.unsqueeze_(1) + 0, (x + 1).unsqueeze_(0)

    jf = keraunos.jit(f)
    a, b = torch.randn(2, 3), torch.randn(4)
    a2, b2 = a.clone(), b.clone()
    out, exp = jf(a, b), f(a2, b2)
    torch.testing.assert_close(out, exp)
    for t, e in ((a, a2), (b, b2)):
        assert (t.shape, t.stride(), t.storage_offset()) == (
            e.shape,
            e.stride(),
            e.storage_offset(),
        )
        torch.testing.assert_close(t, e)


def test_inplace_view_op_under_autograd_is_refused_by_name():
    def f(x, w):
        x.t_()
        return x * w

    with pytest.raises(NotImplementedError, match=r"torch\.Tensor\.t_ changes a tensor's metadata"):
        keraunos.jit(f)(torch.randn(2, 3), torch.randn(3, 2, requires_grad=True))


def test_call_that_writes_and_changes_metadata_inside_is_not_a_view_op():
    # F.dropout3d(inplace=True) on an unbatched input: unsqueeze_, feature_dropout_, squeeze_
    # inside one fallback call. The write must stay (it is not a metadata-only call).
    check(lambda x: F.dropout3d(x, 0.5, True, inplace=True), torch.ones(2, 3, 2, 2), seed=0)

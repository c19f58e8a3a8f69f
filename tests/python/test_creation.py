import pytest
import torch

import keraunos
from harness import check, check_prims, eager_draws  # noqa: F401

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
ALL = FLOATS + [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


def _meta(t):
    return (t.dtype, tuple(t.shape), t.device, t.stride())


@pytest.mark.parametrize("name", ["zeros", "ones"])
def test_factories_sizes(name):
    f = getattr(torch, name)
    check(lambda: f(2, 3))
    check(lambda: f((2, 3)))
    check(lambda: f([2, 3]))
    check(lambda: f([]))
    check(lambda: f(()))
    check(lambda: f(0, 4))
    check(lambda: f(size=(4, 1)))
    check(lambda: f(torch.Size([2, 5])))
    check(lambda: f(3, device="cpu"))
    check(lambda: f(3, device=torch.device("cpu"), layout=torch.strided))
    check(lambda: f(3, requires_grad=False))


@pytest.mark.parametrize("name", ["zeros", "ones", "empty", "rand", "randn"])
@pytest.mark.parametrize("dtype", ALL)
def test_factories_dtype(name, dtype):
    f = getattr(torch, name)
    fn = lambda: f(2, 3, dtype=dtype)  # noqa: E731
    if name == "empty":
        jf = keraunos.jit(fn)
        assert _meta(jf()) == _meta(fn())
        return
    check(fn, seed=0)


@pytest.mark.parametrize("name", ["zeros", "ones", "empty", "rand", "randn", "full"])
def test_default_dtype_follows_torch(name):
    f = getattr(torch, name)
    args = ((2,), 1.5) if name == "full" else ((2,),)
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        fn = lambda: f(*args)  # noqa: E731
        jf = keraunos.jit(fn)
        assert jf().dtype == torch.float64 == fn().dtype
    finally:
        torch.set_default_dtype(old)


def test_empty_meta():
    for fn in [
        lambda: torch.empty(2, 3),
        lambda: torch.empty((4,), dtype=torch.int32),
        lambda: torch.empty([]),
        lambda: torch.empty(size=(0, 2), dtype=torch.bool),
    ]:
        jf = keraunos.jit(fn)
        assert _meta(jf()) == _meta(fn())


def test_negative_sizes():
    check(lambda: torch.zeros(2, -1))
    for f in (torch.ones, torch.empty, torch.rand, torch.randn):
        check(lambda f=f: f(2, -1))
        with pytest.raises(
            RuntimeError, match=r"Trying to create tensor with negative dimension -1: \[2, -1\]"
        ):
            keraunos.jit(lambda f=f: f(2, -1))()
    with pytest.raises(RuntimeError, match="zeros: Dimension size must be non-negative."):
        keraunos.jit(lambda: torch.zeros(-3))()
    check(lambda: torch.full((-1, 3), 1.0))


@pytest.mark.parametrize(
    "value,dtype",
    [
        (3, torch.int64),
        (1.5, torch.float32),
        (True, torch.bool),
        (False, torch.bool),
        (-7, torch.int64),
    ],
)
def test_full_dtype_inference(value, dtype):
    jf = check(lambda: torch.full((2, 3), value))
    assert jf().dtype == dtype
    check(lambda: torch.full((), value))
    check(lambda: torch.full([4], value, dtype=torch.float16))
    check(lambda: torch.full(size=[4], fill_value=value))


def test_full_cast():
    check(lambda: torch.full((3,), 1.5, dtype=torch.int64))
    check(lambda: torch.full((3,), 2, dtype=torch.bool))
    check(lambda: torch.full((3,), 0.1, dtype=torch.bfloat16))
    check(lambda: torch.full((3,), 1e10, dtype=torch.float64))


@pytest.mark.parametrize(
    "args",
    [
        (5,),
        (0,),
        (2, 7),
        (7, 2, -2),
        (0, 10, 3),
        (10, 0, -3),
        (1, 2, 0.1),
        (0.5, 2.7),
        (5.0,),
        (-3, 3),
        (1.5, 3, 0.25),
        (0, 1, 1e-3),
        (3, 3),
        (0, -1, -0.3),
        (True,),
        (-5, -1),
    ],
)
def test_arange(args):
    jf = check(lambda: torch.arange(*args))
    out = torch.arange(*args)
    assert jf().shape == out.shape and jf().dtype == out.dtype


@pytest.mark.parametrize(
    "dtype",
    [
        torch.int64,
        torch.int32,
        torch.int16,
        torch.uint8,
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
    ],
)
@pytest.mark.parametrize(
    "args", [(5,), (1, 9, 2), (0.5, 2.7), (0, 5.9), (0, 1, 0.5), (0, 5, 0.3), (4, 0, -1)]
)
def test_arange_dtype(dtype, args):
    fractional_step = len(args) == 3 and abs(args[2]) < 1
    if fractional_step and not dtype.is_floating_point and _TORCH < (2, 13):
        pytest.skip("eager torch < 2.13 divides by the truncated step (SIGFPE)")
    check(lambda: torch.arange(*args, dtype=dtype))


_TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def test_arange_kwargs_and_errors():
    check(lambda: torch.arange(start=1, end=5))
    check(lambda: torch.arange(end=5))
    check(lambda: torch.arange(0, 5, step=2))
    check(lambda: torch.arange(0, 4, device="cpu", dtype=torch.float64))
    check(lambda: torch.arange(0, 1, 0))
    check(lambda: torch.arange(0, 1, 0.0))
    check(lambda: torch.arange(0, -1, 1))
    check(lambda: torch.arange(0, float("inf")))
    if _TORCH >= (2, 13):  # older eager divides by the truncated step (SIGFPE)
        check(lambda: torch.arange(0, 2.5, 0.5, dtype=torch.int64))  # ValueError in eager
    check(lambda: torch.arange(3, dtype=torch.bool))  # NotImplementedError in eager
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        keraunos.jit(lambda: torch.arange(0, 1, 0))()
    with pytest.raises(
        RuntimeError, match="upper bound and lower bound inconsistent with step sign"
    ):
        keraunos.jit(lambda: torch.arange(0, -1, 1.0))()
    with pytest.raises(RuntimeError, match="unsupported range: 0 -> inf"):
        keraunos.jit(lambda: torch.arange(0, float("inf")))()


def test_arange_with_input():
    check(lambda x: x + torch.arange(x.shape[-1]), torch.randn(3, 4))
    check(lambda x: x * torch.arange(0.0, 1.0, 0.25), torch.randn(2, 4))


def _inputs():
    x = torch.randn(3, 4)
    return [
        x,
        x.t(),
        x[:, ::2],
        torch.randn(2, 3, 4).permute(2, 0, 1),
        torch.randn(1, 4, 1),
        torch.randn(()),
        torch.randn(3, 1).expand(3, 4),
        torch.arange(12).view(3, 4),
        torch.zeros(0, 3),
        torch.ones(2, 3, dtype=torch.float16).t(),
    ]


@pytest.mark.parametrize("name", ["zeros_like", "ones_like"])
def test_like(name):
    f = getattr(torch, name)
    for x in _inputs():
        check(lambda a: f(a), x, check_strides=True)
        check(lambda a: f(a, dtype=torch.float64), x, check_strides=True)
        check(lambda a: f(a, dtype=torch.int32, device="cpu"), x, check_strides=True)
        check(lambda a: f(a, memory_format=torch.preserve_format), x, check_strides=True)


def test_full_like():
    for x in _inputs():
        check(lambda a: torch.full_like(a, 2.5), x, check_strides=True)
        check(lambda a: torch.full_like(a, 7, dtype=torch.int16), x, check_strides=True)
        check(lambda a: torch.full_like(a, fill_value=True), x, check_strides=True)


def test_empty_like():
    for x in _inputs():
        fn = lambda a: torch.empty_like(a)  # noqa: E731
        jf = keraunos.jit(fn)
        assert _meta(jf(x)) == _meta(fn(x))
        fn2 = lambda a: torch.empty_like(a, dtype=torch.bool)  # noqa: E731
        assert _meta(keraunos.jit(fn2)(x)) == _meta(fn2(x))


@pytest.mark.parametrize("name", ["rand_like", "randn_like"])
def test_random_like(name):
    f = getattr(torch, name)
    for x in _inputs():
        if not x.dtype.is_floating_point:
            check(lambda a: f(a), x, seed=0)  # eager raises NotImplementedError
            continue
        check(lambda a: f(a), x, seed=0, check_strides=True)
        check(lambda a: f(a, dtype=torch.float64), x, seed=1, check_strides=True)
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        keraunos.jit(lambda a: f(a))(torch.zeros(2, dtype=torch.long))


@pytest.mark.usefixtures("eager_draws")
@pytest.mark.parametrize("name", ["rand", "randn"])
def test_random_matches_eager_generator(name):
    f = getattr(torch, name)

    def fn(x):
        a = f(4)
        b = f(2, 3, dtype=torch.float64)
        return x + a, b, f([])

    x = torch.randn(4)
    check(fn, x, seed=0)
    jf = keraunos.jit(fn)
    for seed in (0, 123):
        torch.manual_seed(seed)
        expected = fn(x)
        after_eager = torch.rand(3)
        torch.manual_seed(seed)
        actual = jf(x)
        after_jit = torch.rand(3)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=0, atol=0)
        torch.testing.assert_close(after_jit, after_eager, rtol=0, atol=0)  # same generator state
    src = keraunos.last_traces(jf)[-1].source
    assert f"torch.{name}([4], dtype=torch.float32, device=torch.device('cpu'))" in src


def test_random_errors():
    check(lambda: torch.randn(2, dtype=torch.long))
    check(lambda: torch.rand(2, dtype=torch.int32))
    check(lambda: torch.randn(2, dtype=torch.bool))
    with pytest.raises(
        NotImplementedError, match="\"normal_kernel_cpu\" not implemented for 'Long'"
    ):
        keraunos.jit(lambda: torch.randn(2, dtype=torch.long))()
    with pytest.raises(
        NotImplementedError, match="\"check_uniform_bounds\" not implemented for 'Int'"
    ):
        keraunos.jit(lambda: torch.rand(2, dtype=torch.int32))()
    g = torch.Generator().manual_seed(0)
    with pytest.raises(NotImplementedError, match="generator"):
        keraunos.jit(lambda: torch.randn(2, generator=g))()
    check(lambda: torch.randn(2, generator=None), seed=3)


def test_new_methods():
    for x in [
        torch.randn(3, 4, dtype=torch.float64),
        torch.arange(6).view(2, 3),
        torch.zeros(2, dtype=torch.bool),
    ]:
        check(lambda a: a.new_zeros(2, 3), x)
        check(lambda a: a.new_zeros((2, 3)), x)
        check(lambda a: a.new_ones([]), x)
        check(lambda a: a.new_ones(size=(4,)), x)
        check(lambda a: a.new_zeros((2,), dtype=torch.float16), x)
        check(lambda a: a.new_full((2, 2), 3), x)
        check(lambda a: a.new_full((2, 2), 1.5), x)  # the tensor's dtype, not the value's
        check(lambda a: a.new_full((3,), fill_value=7, dtype=torch.int32), x)
        check(lambda a: a.new_full(size=(3,), fill_value=7), x)
        fn = lambda a: a.new_empty(2, 5)  # noqa: E731
        assert _meta(keraunos.jit(fn)(x)) == _meta(fn(x))


def test_requires_grad_and_layout_errors():
    check(lambda: torch.zeros(2, dtype=torch.long, requires_grad=True))  # RuntimeError in eager
    with pytest.raises(NotImplementedError, match="requires_grad=True"):
        keraunos.jit(lambda: torch.zeros(2, requires_grad=True))()
    with pytest.raises(NotImplementedError, match="requires_grad=True"):
        keraunos.jit(lambda: torch.arange(3.0, requires_grad=True))()
    with pytest.raises(NotImplementedError, match="requires_grad=True"):
        keraunos.jit(lambda a: torch.zeros_like(a, requires_grad=True))(torch.ones(2))
    with pytest.raises(RuntimeError, match="Only Tensors of floating point"):
        keraunos.jit(lambda: torch.ones(2, dtype=torch.int32, requires_grad=True))()
    with pytest.raises((NotImplementedError, TypeError)):
        keraunos.jit(lambda: torch.zeros(2, layout=torch.sparse_coo))()
    check(lambda: torch.zeros(2, pin_memory=True))  # through torch: eager's result or error
    # A memory_format the mapping does not take: through torch, eager's strides.
    check(
        lambda a: torch.zeros_like(a, memory_format=torch.channels_last) + 1,
        torch.ones(1, 2, 3, 3),
        check_strides=True,
    )
    with pytest.raises(TypeError):
        keraunos.jit(lambda: torch.zeros(2.0))()
    with pytest.raises(TypeError):
        keraunos.jit(lambda: torch.full((2,), "x"))()


def test_creation_mixed_with_inputs():
    def f(x):
        z = torch.zeros_like(x)
        o = torch.ones(x.shape[1], dtype=x.dtype)
        return x + z * 2 + o, torch.full(x.shape, 3) + x

    for x in _inputs()[:4]:
        check(f, x)


def test_device_of_proxy():
    check(lambda a: torch.zeros(2, device=a.device) + a, torch.ones(2))
    check(lambda a: torch.randn(3, device=a.device, dtype=a.dtype), torch.ones(2), seed=0)
    check(lambda a: a.new_zeros(2, device=torch.device("cpu")) + a, torch.ones(2))
    check(
        lambda a: (
            torch.ones(
                2,
                device=torch.device(
                    "cpu",
                ),
            )
            + a
        ),
        torch.ones(2),
    )


def test_decompositions():
    x = torch.randn(3, 4)
    check_prims(lambda: torch.zeros(2, 3))
    check_prims(lambda: torch.ones(2, 3, dtype=torch.int32))
    check_prims(lambda: torch.full((2, 3), 1.5))
    check_prims(lambda: torch.full((2,), True))
    check_prims(lambda: torch.arange(7))
    check_prims(lambda: torch.arange(1, 9, 2))
    check_prims(lambda: torch.arange(10, 0, -3))
    check_prims(lambda: torch.arange(0.0, 1.0, 0.125))
    check_prims(lambda: torch.arange(0.5, 2.7, dtype=torch.int32))
    check_prims(lambda a: torch.zeros_like(a) + torch.ones_like(a), x)
    check_prims(lambda a: torch.zeros_like(a) + torch.ones_like(a), x.t())
    check_prims(lambda a: torch.full_like(a, 2.0), x.t())
    check_prims(lambda a: torch.fill(a, 3), x.t())
    check_prims(lambda a, v: torch.fill(a, v), x.t(), torch.tensor(2.5, dtype=torch.float64))
    check_prims(lambda a: a.new_full((2,), 4), x)


def test_random_decompositions_shapes():
    from keraunos.jit import build_program

    def f(x):
        return torch.rand(3, 4), torch.randn(5, dtype=torch.float64), torch.randn_like(x)

    x = torch.zeros(2, 3).t()
    jf = keraunos.jit(f)
    jf(x)
    _, prog = build_program(keraunos.last_traces(jf)[-2], prims=True)
    a, b, c = prog(x)
    assert a.shape == (3, 4) and a.dtype == torch.float32 and bool(((a >= 0) & (a < 1)).all())
    assert b.shape == (5,) and b.dtype == torch.float64
    assert c.shape == (3, 2) and c.stride() == (1, 3)


def test_trace_symbols():
    jf = keraunos.jit(lambda: torch.full((2,), 3))
    jf()
    s = str(keraunos.last_traces(jf)[0])
    assert "ltorch.full([2], 3, device=torch.device('cpu'))" in s
    assert "prims.full([2], 3, dtype=torch.int64, device=torch.device('cpu'))" in s

import pytest
import torch

from harness import check, check_prims

UNARY_FLOAT = [
    "exp",
    "exp2",
    "log",
    "log2",
    "log1p",
    "expm1",
    "sin",
    "cos",
    "tan",
    "tanh",
    "sigmoid",
    "sqrt",
    "rsqrt",
    "erf",
    "reciprocal",
]
UNARY_ANY = [
    "abs",
    "neg",
    "floor",
    "ceil",
    "round",
    "trunc",
    "sign",
    "isnan",
    "isinf",
    "isfinite",
    "logical_not",
]


def _inputs(dtype, shape=(3, 5)):
    if dtype.is_floating_point:
        x = torch.randn(shape, dtype=torch.float32) * 3
        x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), 0.5])
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    return torch.randint(-9, 10, shape).to(dtype)


@pytest.mark.parametrize("name", UNARY_FLOAT + UNARY_ANY)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32]
)
def test_unary(name, dtype):
    x = _inputs(dtype)
    if name in ("abs", "neg", "floor", "ceil", "round", "trunc") and dtype == torch.bool:
        pytest.skip("not defined for bool")
    check(lambda a: getattr(torch, name)(a), x)
    check(lambda a: getattr(a, name)(), x)


@pytest.mark.parametrize(
    "name", UNARY_FLOAT + ["abs", "neg", "floor", "ceil", "round", "trunc", "sign"]
)
def test_unary_inplace(name):
    x = _inputs(torch.float32)

    def f(a):
        r = getattr(a, name + "_")()
        return r, a

    jf = check(f, x)
    # the in-place op returns its input itself
    y = x.clone()
    out = jf(y)
    assert out[0] is y and out[1] is y


@pytest.mark.parametrize("name", UNARY_FLOAT)
def test_unary_decompositions(name):
    check_prims(lambda a: getattr(torch, name)(a), torch.rand(4, 6) + 0.1)


BINARY = [
    "add",
    "sub",
    "mul",
    "div",
    "floor_divide",
    "remainder",
    "fmod",
    "pow",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
]


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.float32, torch.float32),
        (torch.float32, torch.float16),
        (torch.int64, torch.float32),
        (torch.int32, torch.int64),
        (torch.bfloat16, torch.float16),
        (torch.uint8, torch.int8),
    ],
)
def test_binary_promotion_broadcast(name, dtypes):
    a = (
        _inputs(dtypes[0], (4, 1, 3)).abs() + 1
        if name in ("pow",)
        else _inputs(dtypes[0], (4, 1, 3))
    )
    b = _inputs(dtypes[1], (5, 1))
    if name in ("floor_divide", "remainder", "fmod", "div") and not (
        dtypes[0].is_floating_point or dtypes[1].is_floating_point
    ):
        b = b.abs() + 1
    if name == "pow" and not (dtypes[0].is_floating_point or dtypes[1].is_floating_point):
        b = b.abs()
    check(lambda x, y: getattr(torch, name)(x, y), a, b)


@pytest.mark.parametrize("scalar", [2, 2.5, True, -3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16, torch.uint8])
def test_python_scalars(scalar, dtype):
    x = _inputs(dtype, (3, 4)).abs() + 1
    check(
        lambda a: (a + scalar, scalar - a, a * scalar, a / scalar, scalar / a, a < scalar, a**2), x
    )


def test_zero_dim_tensor_promotion():
    x = torch.randn(3, 4, dtype=torch.float16)
    s = torch.tensor(2.5, dtype=torch.float64)
    i = torch.tensor(3)
    check(lambda a, b, c: (a * b, a + c, b * c, c + 1.5), x, s, i)


def test_non_contiguous_layouts():
    x = torch.randn(6, 8).t()  # transposed
    y = torch.randn(8, 12)[:, ::2]  # strided
    check(lambda a, b: (a.sin() + b, a * 2), x, y, check_strides=True)


def test_alpha_and_rounding():
    a = torch.randn(4, 4)
    b = torch.randn(4, 4)
    check(
        lambda x, y: (
            torch.add(x, y, alpha=2),
            torch.sub(x, y, alpha=0.5),
            torch.div(x, y, rounding_mode="trunc"),
            torch.div(x, y, rounding_mode="floor"),
        ),
        a,
        b,
    )
    ai = torch.randint(-20, 20, (5,))
    bi = torch.randint(1, 6, (5,))
    check(
        lambda x, y: (
            torch.div(x, y, rounding_mode="trunc"),
            torch.div(x, y, rounding_mode="floor"),
            x // y,
            x % y,
            torch.div(x, y),
        ),
        ai,
        bi,
    )


def test_where_clamp_lerp_addc():
    x, y, z = torch.randn(3, 4), torch.randn(4), torch.rand(3, 1)
    check(
        lambda a, b, c: (
            torch.where(a > 0, a, b),
            torch.where(a > 0, 1.0, a),
            torch.clamp(a, -0.5, 0.5),
            torch.clamp(a, min=b),
            a.clamp(max=0.1),
            torch.lerp(a, b, 0.3),
            torch.lerp(a, b, c),
            torch.addcmul(a, b, c, value=0.5),
            torch.addcdiv(a, b, c + 1, value=2),
        ),
        x,
        y,
        z,
    )


def test_nan_to_num_and_bitwise():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.5])
    check(lambda a: (torch.nan_to_num(a), a.nan_to_num(nan=1.0, posinf=2.0)), x)
    i, j = torch.randint(0, 16, (6,)), torch.randint(0, 16, (6,))
    check(lambda a, b: (a & b, a | b, a ^ b, ~a, torch.bitwise_and(a, 3)), i, j)
    m = torch.rand(6) > 0.5
    check(lambda a: (~a, a & a, torch.logical_not(a)), m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_activations(dtype):
    x = (torch.randn(4, 8) * 4).to(dtype)
    F = torch.nn.functional
    exact = dtype == torch.float32
    kw = {} if dtype in (torch.float32, torch.float64) else {"atol": 1e-2, "rtol": 1e-2}
    check(
        lambda a: (
            F.relu(a),
            F.gelu(a),
            F.gelu(a, approximate="tanh"),
            F.silu(a),
            F.softplus(a),
            F.softplus(a, beta=2, threshold=3),
            F.leaky_relu(a, 0.2),
            F.elu(a),
            F.hardtanh(a),
            torch.relu(a),
            F.relu6(a),
        ),
        x,
        **kw,
    )
    del exact


def test_activation_decompositions():
    F = torch.nn.functional
    x = torch.randn(4, 8) * 4
    check_prims(
        lambda a: (
            F.gelu(a),
            F.gelu(a, approximate="tanh"),
            F.silu(a),
            F.softplus(a),
            F.leaky_relu(a),
            F.elu(a),
            F.hardtanh(a),
            torch.clamp(a, -1, 1),
        ),
        x,
    )


def test_inplace_activations():
    F = torch.nn.functional

    def f(a, b):
        F.relu(a, inplace=True)
        F.silu(b, inplace=True)
        return a + b

    check(f, torch.randn(8), torch.randn(8))


def test_dropout():
    x = torch.randn(64, 64)
    F = torch.nn.functional
    check(
        lambda a: (F.dropout(a, 0.3), F.dropout(a, 0.0), F.dropout(a, 0.5, training=False)),
        x,
        seed=0,
    )


def test_casts():
    x = torch.randn(3, 4) * 10
    check(
        lambda a: (
            a.to(torch.int32),
            a.half(),
            a.bfloat16(),
            a.long(),
            a.bool(),
            a.double(),
            a.type_as(torch.zeros(1, dtype=torch.int16, device=a.device)),
            a.to(dtype=torch.float16),
            a.to(a.device.type),  # the same device (a move between devices is not supported)
            a.float(),
            a.to(torch.float32, copy=True),
        ),
        x,
    )


def test_noop_cast_returns_self():
    import keraunos

    jf = keraunos.jit(lambda a: a.float())
    x = torch.randn(3)
    assert jf(x) is x


def test_inplace_binary_ops():
    def f(a, b):
        a.add_(b, alpha=2)
        a.mul_(2)
        a.sub_(1)
        a.div_(b.abs() + 1)
        a.clamp_(-1, 1)
        a += 1
        a *= b
        a -= 0.5
        a /= 2
        return a

    check(f, torch.randn(4, 4), torch.randn(4))


def test_inplace_errors_match_eager():
    import keraunos

    def f(a):
        a.add_(1.5)
        return a

    with pytest.raises(RuntimeError, match="can't be cast"):
        keraunos.jit(f)(torch.ones(3, dtype=torch.int64))

    def g(a, b):
        a.add_(b)
        return a

    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        keraunos.jit(g)(torch.ones(3), torch.ones(2, 3))


def test_out_argument():
    def f(a, b, o):
        torch.add(a, b, out=o)
        torch.sin(a, out=b)
        return o

    check(f, torch.randn(3), torch.randn(3), torch.empty(3))


INPLACE_VARIANTS = {
    "addcdiv_": lambda a, b: a.addcdiv_(b, b.abs() + 1, value=0.5),
    "addcmul_": lambda a, b: a.addcmul_(b, b, value=2),
    "eq_": lambda a, b: a.eq_(b),
    "ne_": lambda a, b: a.ne_(b),
    "lt_": lambda a, b: a.lt_(b),
    "le_": lambda a, b: a.le_(0.5),
    "gt_": lambda a, b: a.gt_(b),
    "ge_": lambda a, b: a.ge_(b),
    "floor_divide_": lambda a, b: a.floor_divide_(b.abs() + 1),
    "fmod_": lambda a, b: a.fmod_(b.abs() + 1),
    "remainder_": lambda a, b: a.remainder_(1.5),
    "pow_": lambda a, b: a.abs_().pow_(b),
    "lerp_": lambda a, b: a.lerp_(b, 0.3),
    "logical_and_": lambda a, b: a.logical_and_(b > 0),
    "logical_or_": lambda a, b: a.logical_or_(b),
    "logical_xor_": lambda a, b: a.logical_xor_(b),
    "logical_not_": lambda a, b: a.logical_not_(),
    "nan_to_num_": lambda a, b: a.div_(0).nan_to_num_(posinf=1.0),
    "elu_": lambda a, b: torch.nn.functional.elu_(a, 0.5),
    "hardtanh_": lambda a, b: torch.nn.functional.hardtanh(a, -0.5, 0.5, inplace=True),
    "leaky_relu_": lambda a, b: torch.nn.functional.leaky_relu_(a, 0.1),
}


@pytest.mark.parametrize("name", sorted(INPLACE_VARIANTS))
def test_inplace_variants(name):
    fn = INPLACE_VARIANTS[name]
    check(lambda a, b: (fn(a, b), a)[1], torch.randn(4, 5), torch.randn(5))


@pytest.mark.parametrize("name", ["bitwise_and_", "bitwise_or_", "bitwise_xor_", "bitwise_not_"])
def test_inplace_bitwise(name):
    def f(a, b):
        getattr(a, name)(*([] if name == "bitwise_not_" else [b]))
        return a

    check(f, torch.randint(0, 64, (4, 5)), torch.randint(0, 64, (5,)))


_LARGE_OUTPUT_SCRIPT = """
import torch, keraunos
x = torch.randn(1 << 21)
y = torch.randn(1024, 2048)
jf = keraunos.jit(lambda a, b: ((a.sin() * 2).exp(), b.t() + 1, b.softmax(-1)))
for ours, ref in zip(jf(x, y), ((x.sin() * 2).exp(), y.t() + 1, y.softmax(-1))):
    torch.testing.assert_close(ours, ref)
print("ok")
"""


@pytest.mark.parametrize("huge_pages", ["1", "0"])
def test_large_cpu_outputs(huge_pages):
    """Outputs of 4 MiB and more are advised as transparent huge pages before the kernel first
    writes them (KERAUNOS_HUGEPAGES=0: not); results are the same either way."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, KERAUNOS_HUGEPAGES=huge_pages)
    r = subprocess.run(
        [sys.executable, "-c", _LARGE_OUTPUT_SCRIPT], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr

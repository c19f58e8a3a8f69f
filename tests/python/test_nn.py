import copy
import math

import pytest
import torch
import torch.nn.functional as F

import keraunos
from harness import assert_same, check, check_prims

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _tol(dtype):
    return {torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}.get(dtype, (1e-5, 1e-5))


# ---------------------------------------------------------------- matmul / bmm / linear

MATMUL_SHAPES = [
    ((3,), (3,)),
    ((2, 3), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3, 4)),
    ((5, 2, 3), (3, 4)),
    ((3,), (5, 3, 4)),
    ((5, 2, 3), (3,)),
    ((5, 1, 2, 3), (4, 3, 2)),
    ((2, 3), (6, 3, 4)),
    ((0, 3), (3, 4)),
    ((2, 0), (0, 4)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES)
def test_matmul_ranks(shapes):
    a, b = _r(*shapes[0]), _r(*shapes[1], seed=1)
    check(lambda x, y: torch.matmul(x, y), a, b)
    check(lambda x, y: x @ y, a, b)
    check(lambda x, y: x.matmul(y), a, b)
    check_prims(lambda x, y: x @ y, a, b)


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_matmul_dtypes_noncontiguous(dtype):
    a = _r(4, 6, dtype=dtype).t()  # (6, 4) transposed
    b = _r(5, 4, dtype=dtype, seed=1)[:, ::1].t()  # (4, 5) transposed
    check(lambda x, y: x @ y, a, b)


def test_rmatmul_real_left_operand():
    w = _r(4, 3)
    check(lambda x: w @ x, _r(3, 2))


def test_matmul_errors():
    for a, b, msg in [
        (torch.tensor(1.0), _r(3), "both arguments to matmul need to be at least 1D"),
        (_r(3), _r(4), "inconsistent tensor size"),
        (_r(2, 3), _r(4, 5), "mat1 and mat2 shapes cannot be multiplied \\(2x3 and 4x5\\)"),
        (
            _r(2, 3, 4),
            _r(3, 4, 5),
            "The size of tensor a \\(2\\) must match the size of tensor b \\(3\\)",
        ),
        (_r(2, 3), _r(3, 4, dtype=torch.float64), "same dtype"),
    ]:
        check(lambda x, y: x @ y, a, b)
        with pytest.raises(RuntimeError, match=msg):
            keraunos.jit(lambda x, y: x @ y)(a, b)


def test_bmm():
    a, b = _r(4, 2, 3), _r(4, 3, 5, seed=1)
    check(lambda x, y: torch.bmm(x, y), a, b)
    check(lambda x, y: x.bmm(y), a, b)
    check_prims(lambda x, y: torch.bmm(x, y), a, b)
    for x, y, msg in [
        (_r(2, 3), _r(2, 3, 4), "batch1 must be a 3D tensor"),
        (
            _r(2, 3, 4),
            _r(2, 5, 3),
            "Expected size for first two dimensions of batch2 tensor to be: \\[2, 4\\] but got: \\[2, 5\\]",
        ),
        (_r(2, 3, 4), _r(3, 4, 3), "Expected size for first two dimensions"),
    ]:
        check(lambda p, q: torch.bmm(p, q), x, y)
        with pytest.raises(RuntimeError, match=msg):
            keraunos.jit(lambda p, q: torch.bmm(p, q))(x, y)


@pytest.mark.parametrize("dtype", FLOATS)
def test_linear(dtype):
    x, w, b = _r(2, 3, 4, dtype=dtype), _r(5, 4, dtype=dtype, seed=1), _r(5, dtype=dtype, seed=2)
    check(
        lambda x, w, b, x1: (F.linear(x, w, b), F.linear(x, w), F.linear(x1, w, b)),
        x,
        w,
        b,
        x[0, 0],
    )
    atol, rtol = _tol(dtype)
    check_prims(lambda x, w, b: (F.linear(x, w, b), F.linear(x, w)), x, w, b, atol=atol, rtol=rtol)


def test_linear_noncontiguous_and_errors():
    x = _r(6, 4).t()  # (4, 6), non-contiguous
    check(lambda x, w: F.linear(x, w), _r(6, 4).t(), _r(6, 5).t())
    check(lambda x, w: F.linear(x, w), x, _r(5, 4))
    with pytest.raises(
        RuntimeError, match="mat1 and mat2 shapes cannot be multiplied \\(4x6 and 4x5\\)"
    ):
        keraunos.jit(lambda x, w: F.linear(x, w))(x, _r(5, 4))
    check(lambda x, w: F.linear(x, w), _r(3, 4), _r(5, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="same dtype"):
        keraunos.jit(lambda x, w: F.linear(x, w))(_r(3, 4), _r(5, 4, dtype=torch.float64))


def test_linear_module():
    m = torch.nn.Linear(4, 3)
    x = _r(2, 4)
    jm = keraunos.jit(m)
    assert_same(jm(x), m(x))


# ---------------------------------------------------------------- layer_norm / rms_norm


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm(dtype):
    x, w, b = _r(2, 3, 4, dtype=dtype), _r(3, 4, dtype=dtype, seed=1), _r(3, 4, dtype=dtype, seed=2)
    fn = lambda x, w, b, w0, b0: (
        F.layer_norm(x, (4,)),
        F.layer_norm(x, (3, 4), w, b),
        F.layer_norm(x, [4], w0, b0, 1e-3),
        F.layer_norm(x, (3, 4), weight=w),
        F.layer_norm(x, (3, 4), bias=b, eps=0.1),
    )
    check(fn, x, w, b, w[0], b[0])
    atol, rtol = _tol(dtype)
    check_prims(fn, x, w, b, w[0], b[0], atol=atol, rtol=rtol)


def test_layer_norm_noncontiguous_and_errors():
    x = _r(5, 4).t()
    check(lambda x: F.layer_norm(x, (5,)), x)
    check_prims(lambda x: F.layer_norm(x, (5,)), x)
    for args, exc, msg in [
        (
            (_r(2, 3), (4,)),
            RuntimeError,
            "Given normalized_shape=\\[4\\], expected input with shape \\[\\*, 4\\], but got input of size\\[2, 3\\]",
        ),
        (
            (_r(2, 4), (4,), _r(3)),
            RuntimeError,
            "Expected weight to be of same shape as normalized_shape",
        ),
        ((torch.arange(4), (4,)), NotImplementedError, "not implemented for 'Long'"),
    ]:
        check(lambda *a: F.layer_norm(*a), *args)
        with pytest.raises(exc, match=msg):
            keraunos.jit(lambda *a: F.layer_norm(*a))(*args)


def test_layer_norm_module():
    m = torch.nn.LayerNorm(4)
    with torch.no_grad():
        m.weight.copy_(_r(4)), m.bias.copy_(_r(4, seed=1))
    x = _r(3, 4)
    assert_same(keraunos.jit(m)(x), m(x))


@pytest.mark.parametrize("dtype", FLOATS)
def test_rms_norm(dtype):
    x, w = _r(2, 3, 4, dtype=dtype), _r(4, dtype=dtype, seed=1)
    fn = lambda x, w: (
        F.rms_norm(x, (4,)),
        F.rms_norm(x, (4,), w),
        F.rms_norm(x, [3, 4], eps=1e-3),
        F.rms_norm(x, (4,), weight=w, eps=0.5),
    )
    check(fn, x, w)
    atol, rtol = _tol(dtype)
    check_prims(fn, x, w, atol=atol, rtol=rtol)
    check(lambda x: F.rms_norm(x, (4,)), torch.arange(4))


# ---------------------------------------------------------------- batch_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_batch_norm_functional(dtype, shape):
    x = _r(*shape, dtype=dtype)
    rm, rv = _r(3, dtype=dtype, seed=1), _r(3, dtype=dtype, seed=2).abs() + 0.5
    w, b = _r(3, dtype=dtype, seed=3), _r(3, dtype=dtype, seed=4)

    def train(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, True, 0.2, 1e-3), rm * 1, rv * 1

    def train_twice(x, rm, rv, w, b):
        y1 = F.batch_norm(x, rm, rv, w, b, training=True)
        y2 = F.batch_norm(x * 2, rm, rv, training=True, momentum=0.5)
        return y1, y2

    check(train, x, rm, rv, w, b)  # running stats are compared as inputs after the call
    check(train_twice, x, rm, rv, w, b)
    check(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b), x, rm, rv, w, b)  # eval
    check(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b)
    check_prims(train, x, rm, rv, w, b)
    check_prims(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=False, eps=0.1), x, rm, rv)


def test_batch_norm_errors():
    x = _r(1, 3)
    rm, rv = torch.zeros(3), torch.ones(3)
    check(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=True), x, rm, rv)
    with pytest.raises(
        ValueError,
        match="Expected more than 1 value per channel when training, got input size torch.Size\\(\\[1, 3\\]\\)",
    ):
        keraunos.jit(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=True))(x, rm, rv)
    with pytest.raises(RuntimeError, match="running_mean should contain 3 elements not 4"):
        keraunos.jit(lambda x, rm, rv: F.batch_norm(x, rm, rv))(_r(2, 3), torch.zeros(4), rv)


def _compare_modules(m, make_input, calls=2):
    """Runs a module eagerly and through keraunos.jit on deep copies; compares outputs,
    parameters and buffers after each call."""
    m_eager, m_jit = copy.deepcopy(m), copy.deepcopy(m)
    jm = keraunos.jit(m_jit)
    for i in range(calls):
        x = make_input(i)
        expected = m_eager(x.clone())
        actual = jm(x.clone())
        assert_same(actual, expected, exact=False, atol=1e-5, rtol=1e-5)
        for (n, a), (_, e) in zip(m_jit.state_dict().items(), m_eager.state_dict().items()):
            assert_same(a, e, exact=False, atol=1e-6, rtol=1e-6, what=n)
    return jm


def test_batchnorm_module_train_updates_running_stats():
    m = torch.nn.BatchNorm1d(4, momentum=0.3)
    m.train()
    jm = _compare_modules(m, lambda i: _r(8, 4, seed=i) * (i + 1) + i, calls=3)
    assert int(jm.module.num_batches_tracked) == 3
    assert not torch.equal(jm.module.running_mean, torch.zeros(4))
    # eval mode afterwards uses the running stats
    m2 = copy.deepcopy(jm.module).eval()
    _compare_modules(m2, lambda i: _r(5, 4, 3, seed=10 + i))


def test_batchnorm2d_module_train():
    m = torch.nn.BatchNorm2d(3)
    _compare_modules(m, lambda i: _r(2, 3, 4, 4, seed=i))
    m = torch.nn.BatchNorm1d(3, track_running_stats=False)
    _compare_modules(m, lambda i: _r(5, 3, seed=i))


# ---------------------------------------------------------------- embedding


def test_embedding():
    w = _r(10, 4)
    idx = torch.tensor([[1, 2, 4], [4, 3, 9]])
    check(
        lambda i, w, i0: (
            F.embedding(i, w),
            F.embedding(i, w, padding_idx=2),
            F.embedding(i, w, -1),
            F.embedding(i0, w),
        ),
        idx,
        w,
        idx[0],
    )
    check(lambda i, w: F.embedding(i, w), idx.to(torch.int32), w)
    check(lambda i, w: F.embedding(i, w), torch.tensor(3), w)  # 0-d index
    check_prims(lambda i, w: F.embedding(i, w, padding_idx=0), idx, w)
    m = torch.nn.Embedding(10, 3, padding_idx=0)
    assert_same(keraunos.jit(m)(idx), m(idx))


def test_embedding_errors():
    w = _r(10, 4)
    check(lambda i, w: F.embedding(i, w), torch.tensor([1.0]), w)
    with pytest.raises(
        RuntimeError,
        match="Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int",
    ):
        keraunos.jit(lambda i, w: F.embedding(i, w))(torch.tensor([1.0]), w)
    # max_norm renormalizes the rows it reads in place: through the torch fallback, the
    # weight's final contents as in eager.
    check(lambda i, w: F.embedding(i, w, max_norm=1.0), torch.tensor([1, 3]), w * 10)
    check(lambda i, w: F.embedding(i, w, padding_idx=10), torch.tensor([1]), w)
    check(lambda i, w: F.embedding(i, w), torch.tensor([1]), _r(10))


# ---------------------------------------------------------------- cross_entropy


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_cross_entropy_indices(reduction, label_smoothing):
    x = _r(6, 5)
    t = torch.tensor([0, 4, 2, -100, 1, 3])
    w = _r(5, seed=1).abs()
    kw = dict(reduction=reduction, label_smoothing=label_smoothing)
    check(
        lambda x, t, w: (
            F.cross_entropy(x, t, **kw),
            F.cross_entropy(x, t, w, **kw),
            F.cross_entropy(x, t.clamp(min=0), ignore_index=2, **kw),
        ),
        x,
        t,
        w,
    )
    # (N, C, d) inputs and 1-D inputs
    check(
        lambda x, t: F.cross_entropy(x, t, **kw), _r(2, 5, 3), torch.tensor([[0, 1, 4], [3, 3, 2]])
    )
    check(lambda x, t: F.cross_entropy(x, t, **kw), _r(5), torch.tensor(2))
    # the decomposition (log_softmax + gather/take)
    check_prims(
        lambda x, t, w: (
            F.cross_entropy(x, t, **kw),
            F.cross_entropy(x, t, w, **kw),
            F.cross_entropy(x, t.clamp(min=0), w, ignore_index=2, **kw),
        ),
        x,
        t,
        w,
    )
    check_prims(
        lambda x, t: F.cross_entropy(x, t, **kw), _r(2, 5, 3), torch.tensor([[0, 1, 4], [3, 3, 2]])
    )
    check_prims(lambda x, t: F.cross_entropy(x, t, **kw), _r(5), torch.tensor(2))
    check_prims(
        lambda x, t: F.cross_entropy(x, t, **kw),
        _r(6, 5, dtype=torch.bfloat16),
        t,
        atol=2e-2,
        rtol=2e-2,
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_probs(reduction):
    x = _r(4, 5)
    p = torch.softmax(_r(4, 5, seed=1), -1)
    w = _r(5, seed=2).abs()
    check(
        lambda x, p, w: (
            F.cross_entropy(x, p, reduction=reduction),
            F.cross_entropy(x, p, w, reduction=reduction),
            F.cross_entropy(x, p, reduction=reduction, label_smoothing=0.1),
        ),
        x,
        p,
        w,
    )
    check_prims(
        lambda x, p, w: (
            F.cross_entropy(x, p, reduction=reduction),
            F.cross_entropy(x, p, w, reduction=reduction),
            F.cross_entropy(x, p, w, reduction=reduction, label_smoothing=0.1),
        ),
        x,
        p,
        w,
    )


def test_cross_entropy_errors():
    x = _r(3, 4)
    for t, exc, msg in [
        (
            torch.tensor([1, 2, 3], dtype=torch.int32),
            RuntimeError,
            "expected target dtype to be Long or Byte, but got Int",
        ),
        (
            torch.tensor([1, 2]),
            ValueError,
            "Expected input batch_size \\(3\\) to match target batch_size \\(2\\)",
        ),
        (torch.tensor([[1, 2, 0]] * 3), RuntimeError, ""),
    ]:
        check(lambda x, t: F.cross_entropy(x, t), x, t)
        with pytest.raises(exc, match=msg):
            keraunos.jit(lambda x, t: F.cross_entropy(x, t))(x, t)
    check(lambda x, t: F.cross_entropy(x, t), _r(2, 4, 3), torch.tensor([[1, 2]] * 2))
    with pytest.raises(RuntimeError, match="Expected target size \\[2, 3\\], got \\[2, 2\\]"):
        keraunos.jit(lambda x, t: F.cross_entropy(x, t))(_r(2, 4, 3), torch.tensor([[1, 2]] * 2))
    with pytest.raises(ValueError, match="bogus is not a valid value for reduction"):
        keraunos.jit(lambda x, t: F.cross_entropy(x, t, reduction="bogus"))(
            x, torch.tensor([1, 2, 3])
        )


def test_cross_entropy_legacy_reduce_args():
    x, t = _r(3, 4), torch.tensor([1, 0, 3])
    with pytest.warns(UserWarning):
        check(lambda x, t: F.cross_entropy(x, t, size_average=False), x, t)


# ---------------------------------------------------------------- scaled_dot_product_attention


def test_sdpa():
    q, k, v = _r(2, 3, 5, 8), _r(2, 3, 6, 8, seed=1), _r(2, 3, 6, 4, seed=2)
    mask_b = torch.rand(5, 6, generator=torch.Generator().manual_seed(3)) > 0.3
    mask_f = _r(2, 1, 5, 6, seed=4)
    check(
        lambda q, k, v, mb, mf: (
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, k, v, attn_mask=mb),
            F.scaled_dot_product_attention(q, k, v, mf, scale=0.3),
            F.scaled_dot_product_attention(q, k, v, mb.float(), dropout_p=0.0),
        ),
        q,
        k,
        v,
        mask_b,
        mask_f,
    )
    check(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        q,
        k[:, :, :5],
        v[:, :, :5],
    )


def test_sdpa_gqa_and_dropout():
    q, k, v = _r(1, 4, 5, 8), _r(1, 2, 5, 8, seed=1), _r(1, 2, 5, 8, seed=2)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k, v)
    check(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5),
        q,
        q * 2,
        q * 3,
        seed=7,
    )


def test_sdpa_errors():
    q = _r(2, 5, 8)
    check(lambda q, k: F.scaled_dot_product_attention(q, k, k), q, q.double())
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        keraunos.jit(lambda q, k: F.scaled_dot_product_attention(q, k, k))(q, q.double())


# ---------------------------------------------------------------- models


def test_mlp_module():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.GELU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.LayerNorm(16),
        torch.nn.Linear(16, 4),
        torch.nn.LogSoftmax(-1),
    )
    _compare_modules(m, lambda i: _r(5, 8, seed=i))


def test_mlp_function_with_loss():
    torch.manual_seed(0)
    w1, b1, w2, b2 = _r(16, 8), _r(16, seed=1), _r(4, 16, seed=2), _r(4, seed=3)

    def mlp(x, t, w1, b1, w2, b2):
        h = F.gelu(F.linear(x, w1, b1))
        logits = F.linear(h, w2, b2)
        return logits.softmax(-1), F.cross_entropy(logits, t), logits.argmax(-1)

    check(mlp, _r(6, 8, seed=5), torch.tensor([0, 1, 2, 3, 0, 1]), w1, b1, w2, b2)
    check_prims(
        lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2).softmax(-1),
        _r(6, 8, seed=5),
        w1,
        b1,
        w2,
        b2,
    )


def _attention_block(x, xT, wq, wk, wv, wo, ln_w, ln_b, w1, w2):
    """Single-head attention + MLP with residuals. k^T = wk @ x^T (x^T given as a view)."""
    d = x.shape[-1]
    h = F.layer_norm(x, (d,), ln_w, ln_b)
    q = F.linear(h, wq)
    kT = wk @ xT  # (B, d, n): the keys of the un-normalized input, transposed
    v = F.linear(x, wv)
    att = torch.softmax(q @ kT / math.sqrt(d), dim=-1)
    x = x + F.linear(att @ v, wo)
    return x + F.linear(F.gelu(F.linear(F.layer_norm(x, (d,)), w1)), w2)


def test_attention_block():
    d = 8
    x = _r(2, 5, d)
    params = (
        [_r(d, d, seed=i) * 0.3 for i in range(1, 5)]
        + [_r(d, seed=5), _r(d, seed=6)]
        + [_r(4 * d, d, seed=7) * 0.3, _r(d, 4 * d, seed=8) * 0.3]
    )
    check(_attention_block, x, x.transpose(-2, -1), *params)
    check_prims(_attention_block, x, x.transpose(-2, -1), *params, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(
    __import__("keraunos.torch_map", fromlist=["lookup"]).lookup(torch.Tensor.transpose) is None,
    reason="needs the shape ops (transpose)",
)
def test_attention_block_with_transpose():
    d = 8

    def f(x, wq, wk, wv):
        q, k, v = F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
        return F.layer_norm(x + att @ v, (d,))

    check(f, _r(2, 5, d), *[_r(d, d, seed=i) for i in range(1, 4)])

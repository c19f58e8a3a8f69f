import pytest
import torch
import torch.nn.functional as F

from harness import check, check_prims

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
ALL = FLOATS + [torch.int64, torch.int32, torch.uint8, torch.bool]


def _x(dtype, shape=(3, 4, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(0, 7, shape, generator=g).to(dtype)


def _tol(dtype):
    return {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-5)


# ---------------------------------------------------------------- sum / prod / mean


@pytest.mark.parametrize("dtype", ALL)
def test_sum_forms(dtype):
    x = _x(dtype)
    check(
        lambda a: (
            a.sum(),
            torch.sum(a, 1),
            a.sum(1, True),
            a.sum(dim=(0, 2)),
            a.sum(-1, keepdim=True),
            torch.sum(a, dim=()),
            a.sum(axis=0),
        ),
        x,
    )


@pytest.mark.parametrize("dtype", ALL)
def test_prod_forms(dtype):
    x = _x(dtype, (3, 4))
    check(lambda a: (a.prod(), torch.prod(a, 1), a.prod(-1, True), a.prod(dim=0, keepdim=True)), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
def test_sum_prod_dtype_kwarg(dtype):
    x = _x(dtype, (3, 4))
    check(
        lambda a: (
            a.sum(dtype=torch.float64),
            torch.sum(a, 1, dtype=torch.int32),
            a.prod(dtype=torch.float32),
            torch.prod(a, 0, dtype=torch.float64),
            torch.sum(a, torch.float64),
        ),
        x,
    )


@pytest.mark.parametrize("dtype", FLOATS)
def test_mean(dtype):
    x = _x(dtype)
    check(
        lambda a: (
            a.mean(),
            torch.mean(a, 1),
            a.mean((0, -1), True),
            a.mean(dim=[]),
            a.mean(dtype=torch.float64),
        ),
        x,
    )


def test_mean_int_errors():
    x = torch.arange(6)
    check(lambda a: a.mean(), x)
    with pytest.raises(
        RuntimeError, match="mean\\(\\): could not infer output dtype. Input dtype must be"
    ):
        import keraunos

        keraunos.jit(lambda a: a.mean())(x)
    with pytest.raises(RuntimeError, match="Optional dtype must be either a floating point"):
        keraunos.jit(lambda a: a.mean(dtype=torch.int32))(torch.randn(3))
    check(lambda a: a.mean(dtype=torch.float32), x)


def test_reductions_noncontiguous_and_zero_dim():
    x = torch.randn(5, 6).t()  # transposed
    y = torch.randn(4, 8)[:, ::2]  # strided
    s = torch.tensor(2.5)
    check(
        lambda a, b, c: (
            a.sum(0),
            a.mean(1, True),
            b.sum(-1),
            b.amax(0),
            torch.var(a, 0),
            c.sum(),
            c.sum(0),
            c.sum(-1, True),
            c.mean(),
            c.prod(0),
            c.amax(),
            torch.max(c),
            torch.max(c, 0),
        ),
        x,
        y,
        s,
    )


def test_empty_reductions():
    x = torch.randn(0, 3)
    check(lambda a: (a.sum(0), a.sum(), a.prod(0), a.mean(1), a.sum(1, True)), x)


def test_reduction_dim_errors():
    import keraunos

    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="dim 1 appears multiple times in the list of dims"):
        keraunos.jit(lambda a: a.sum((1, -1)))(x)
    # eager raises IndexError; keraunos reports out-of-range dims as ValueError (no IndexError kind yet)
    with pytest.raises((IndexError, ValueError), match="Dimension out of range"):
        keraunos.jit(lambda a: a.sum(2))(x)
    with pytest.raises((IndexError, ValueError), match="Dimension out of range"):
        keraunos.jit(lambda a: a.softmax(-3))(x)


# ---------------------------------------------------------------- amax / amin / max / min


@pytest.mark.parametrize("dtype", ALL)
def test_amax_amin(dtype):
    x = _x(dtype)
    check(
        lambda a: (
            a.amax(),
            torch.amax(a, 1),
            a.amin((0, 2), True),
            torch.amin(a, -1),
            a.amax(dim=(), keepdim=True),
        ),
        x,
    )


@pytest.mark.parametrize("dtype", ALL)
def test_max_min(dtype):
    x = _x(dtype, (4, 6))
    check(
        lambda a: (
            torch.max(a),
            a.min(),
            torch.max(a, 1),
            torch.min(a, dim=0, keepdim=True),
            a.max(-1, True),
            a.min(dim=1),
        ),
        x,
    )


def test_max_returns_structseq():
    import keraunos

    x = torch.randn(3, 4)

    def f(a):
        r = torch.max(a, 1)
        v, i = r
        return r, r.values * 2, r.indices, v, i

    check(f, x)
    out = keraunos.jit(f)(x)[0]
    assert isinstance(out, torch.return_types.max)


def test_binary_max_min():
    a, b = torch.randn(3, 4), torch.randn(4)
    check(lambda x, y: (torch.max(x, y), x.min(y), torch.min(y, x)), a, b)
    check(lambda x, y: torch.max(x, other=y), a, b)


def test_max_nan():
    x = torch.randn(3, 4)
    x[1, 2] = float("nan")
    check(lambda a: (a.max(), torch.max(a, 1), a.amax(0), a.argmax(1)), x)


def test_extremum_errors():
    import keraunos

    e = torch.empty(0, 3)
    check(lambda a: a.max(), e)
    with pytest.raises(
        RuntimeError, match="Expected reduction dim to be specified for input.numel\\(\\) == 0"
    ):
        keraunos.jit(lambda a: a.max())(e)
    with pytest.raises(
        (IndexError, ValueError), match="Expected reduction dim 0 to have non-zero size"
    ):
        keraunos.jit(lambda a: torch.max(a, 0))(e)
    with pytest.raises(
        (IndexError, ValueError), match="amax\\(\\): Expected reduction dim 0 to have non-zero size"
    ):
        keraunos.jit(lambda a: a.amax(0))(e)
    check(lambda a: (torch.max(a, 1), a.amax(1)), e)


# ---------------------------------------------------------------- argmax / argmin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8])
def test_argmax_argmin(dtype):
    x = _x(dtype, (4, 5))
    check(
        lambda a: (
            a.argmax(),
            torch.argmin(a),
            a.argmax(1),
            torch.argmin(a, -1, True),
            a.argmax(keepdim=True),
            a.argmin(dim=0),
        ),
        x,
    )
    check(lambda a: (a.argmax(), a.argmax(0), a.argmin(-1, keepdim=True)), torch.tensor(3.0))


def test_argmax_errors():
    import keraunos

    check(lambda a: a.argmax(), torch.tensor([True, False]))
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        keraunos.jit(lambda a: a.argmax())(torch.tensor([True, False]))
    with pytest.raises((IndexError, ValueError), match="Expected reduction dim to be specified"):
        keraunos.jit(lambda a: a.argmax())(torch.empty(0, 2))


# ---------------------------------------------------------------- var / std


@pytest.mark.parametrize("dtype", FLOATS)
def test_var_std(dtype):
    x = _x(dtype)
    check(
        lambda a: (
            a.var(),
            torch.var(a, 1),
            torch.var(a, 1, unbiased=False),
            a.std(-1, True),
            torch.std(a, False),
            a.var(dim=(0, 2), correction=0, keepdim=True),
            torch.std(a, 1, True, True),
            a.var(correction=2),
            torch.std(a, dim=None, correction=3),
        ),
        x,
    )


def test_var_std_errors_and_edge_cases():
    import keraunos

    check(lambda a: a.var(), torch.arange(5))
    with pytest.raises(RuntimeError, match="std and var only support floating point"):
        keraunos.jit(lambda a: a.std())(torch.arange(5))
    # single element: nan like eager
    check(lambda a: (a.var(), a.std(0)), torch.randn(1))
    check(lambda a: (a.var(), a.std(correction=0)), torch.tensor(1.5))


# ---------------------------------------------------------------- softmax / log_softmax / logsumexp


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax(dtype):
    x = _x(dtype) * 4
    check(
        lambda a: (
            a.softmax(-1),
            torch.softmax(a, 1),
            F.softmax(a, 0),
            F.log_softmax(a, -1),
            a.log_softmax(dim=1),
            torch.log_softmax(a, 2, dtype=torch.float64),
            F.softmax(a, dim=-1, dtype=torch.float32),
        ),
        x,
    )


def test_softmax_implicit_dim():
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning):
        check(lambda a: F.softmax(a), x)


def test_softmax_edge_cases():
    x = torch.tensor([[float("-inf"), 0.0, 1.0], [1000.0, 1000.0, -1000.0]])
    check(lambda a: (a.softmax(-1), a.log_softmax(-1), torch.logsumexp(a, 1)), x)
    check(lambda a: (a.softmax(0), a.log_softmax(-1)), torch.tensor(3.0))
    check(lambda a: (a.softmax(1), a.softmax(0)), torch.empty(0, 4))
    # Eager checks the dtype only when there are elements (the grad fuzzer's seed 4300185).
    check(lambda a: (a.softmax(0), a.log_softmax(0)), torch.empty(0, dtype=torch.long))
    check(lambda a: a.softmax(1, dtype=torch.float16), torch.empty(0, 3, dtype=torch.long))
    check(lambda a: a.softmax(1), torch.randn(6, 5).t())


def test_variance_kernel_ir():
    """A variance lowers to two passes (the mean, then the squared deviations from it), and the
    second pass names the first pass's sum and the mean: a backend may combine both sums across
    threads in one round (the CUDA cluster schedule does)."""
    import keraunos

    x = torch.randn(4, 6)
    jf = keraunos.jit(lambda a: a.var(1))
    torch.testing.assert_close(jf(x), x.var(1))
    assert keraunos.last_traces(jf)[-1].kernels[0].ir == (
        "kernel k0_0(in0: f32[4, 6], out0: f32[4]):\n"
        "  parallel i0 < 4:\n"
        "    acc a1 sum\n"
        "    reduce r2 < 6:\n"
        "      v3 = load in0[6 * i0 + r2]\n"
        "      let v4 = (double)(v3)\n"
        "      update a1 sum v4\n"
        "    let v5 = a1 / 6.0\n"
        "    acc a6 sum\n"
        "    reduce r7 < 6:  // deviations of a1's values from v5\n"
        "      v8 = load in0[6 * i0 + r7]\n"
        "      let v9 = (double)(v8) - v5\n"
        "      let v10 = v9 * v9\n"
        "      update a6 sum v10\n"
        "    let v11 = (float)(a6 / 5.0)\n"
        "    store out0[i0] = v11\n"
    )


def test_cpu_softmax_computes_exp_once():
    """On the CPU the sum pass stores exp(x - max) into the output and the last pass rescales
    it in place (reuse_reduced_values); outputs of a lower-precision dtype, or a value that the
    last pass computes differently, keep the recomputation."""
    import keraunos

    x = torch.randn(7, 33) * 4
    jf = keraunos.jit(lambda a: a.softmax(-1))
    torch.testing.assert_close(jf(x), x.softmax(-1))
    ir = keraunos.last_traces(jf)[-1].kernels[0].ir
    reduce_body = ir.split("reduce ")[2].split("inner ")[0]
    assert "kr_exp" in reduce_body and "store out0" in reduce_body, ir
    assert "kr_exp" not in ir.split("inner ")[1], ir
    # Two softmaxes of one input, one per output: each caches into its own buffer.
    jf2 = keraunos.jit(lambda a: (a.softmax(-1), (a * 2).softmax(-1)))
    for ours, ref in zip(jf2(x), (x.softmax(-1), (x * 2).softmax(-1))):
        torch.testing.assert_close(ours, ref)
    # bfloat16 output: the cached float value would be rounded, so it is recomputed.
    xb = x.to(torch.bfloat16)
    jb = keraunos.jit(lambda a: a.softmax(-1))
    torch.testing.assert_close(jb(xb), xb.softmax(-1))
    assert "store out0" not in keraunos.last_traces(jb)[-1].kernels[0].ir.split("inner ")[0]


def test_softmax_int_error():
    import keraunos

    x = torch.arange(6).reshape(2, 3)
    check(lambda a: a.softmax(-1), x)
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        keraunos.jit(lambda a: a.softmax(-1))(x)
    check(
        lambda a: (a.softmax(-1, dtype=torch.float32), F.log_softmax(a, 0, dtype=torch.float64)), x
    )


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_logsumexp(dtype):
    x = _x(dtype)
    check(
        lambda a: (torch.logsumexp(a, 1), a.logsumexp((0, 2), True), torch.logsumexp(a, dim=-1)),
        x,
        **({"atol": 1e-6, "rtol": 1e-6} if dtype == torch.int64 else {}),
    )
    check(lambda a: a.logsumexp(0), torch.tensor([float("-inf"), float("-inf")]))


# ---------------------------------------------------------------- cumsum


@pytest.mark.parametrize("dtype", ALL)
def test_cumsum(dtype):
    x = _x(dtype, (3, 4))
    check(lambda a: (a.cumsum(0), torch.cumsum(a, -1), a.cumsum(dim=1, dtype=torch.float64)), x)


def test_cumsum_inplace_and_zero_dim():
    check(lambda a: a.cumsum_(1), torch.randn(3, 4))
    check(lambda a: (a.cumsum(0), a.cumsum(-1)), torch.tensor(2.0))


# ---------------------------------------------------------------- decompositions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_decompositions(dtype):
    x = _x(dtype, (4, 6)) * 3
    tol = _tol(dtype)
    check_prims(
        lambda a: (
            a.sum(1),
            a.mean(0, True),
            a.amax(1),
            a.amin(),
            a.prod(1),
            a.var(1),
            a.std(0, keepdim=True),
            a.softmax(-1),
            a.log_softmax(0),
            torch.logsumexp(a, 1),
            torch.max(a, 1),
            torch.min(a),
            a.argmax(),
            a.argmin(0, True),
            a.cumsum(1),
        ),
        x,
        atol=tol * 10,
        rtol=tol,
    )


def test_decompositions_int_and_bool():
    x = _x(torch.int32, (3, 5))
    check_prims(
        lambda a: (
            a.sum(1),
            a.prod(0),
            a.cumsum(1),
            a.amax(0),
            torch.max(a, 1),
            a.argmax(),
            a.sum(dtype=torch.float32),
            torch.logsumexp(a, 1),
        ),
        x,
    )
    b = _x(torch.bool, (3, 5))
    check_prims(lambda a: (a.sum(1), torch.max(a, 1), a.amin(0), a.cumsum(0)), b)


def test_decompositions_edge_cases():
    x = torch.tensor([[float("-inf"), 0.0, 1.0], [1000.0, 1000.0, -1000.0]])
    check_prims(lambda a: (a.softmax(-1), a.log_softmax(-1), torch.logsumexp(a, 1)), x)
    check_prims(
        lambda a: (a.sum(0), a.softmax(0), a.argmax(), a.var(), torch.max(a, 0)), torch.tensor(1.5)
    )


def test_out_kwarg():
    x = torch.randn(3, 4)
    out = torch.empty(3)
    check(lambda a, o: (torch.sum(a, 1, out=o), o), x, out)

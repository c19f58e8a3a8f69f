import pytest
import torch

import keraunos
from harness import check, check_prims


def _x(*shape, dtype=torch.float32):
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    return torch.randint(-9, 10, shape).to(dtype)


def _layouts():
    """Contiguous, transposed, sliced (offset + step) and expanded inputs of shape (4, 6)."""
    base = torch.randn(8, 12)
    return {
        "contig": torch.randn(4, 6),
        "transposed": torch.randn(6, 4).t(),
        "sliced": base[2:6, ::2],
        "offset": base[1:5, 3:9],
    }


def _meta(out):
    """The output with its metadata: while tracing, stride()/storage_offset() are keraunos's
    meta values (baked into the trace as constants), so `check` compares them with eager's."""
    if isinstance(out, (tuple, list)):
        return tuple(_meta(o) for o in out)
    if hasattr(out, "stride"):
        return out, out.stride(), out.storage_offset(), out.is_contiguous()
    return out


def check_meta(fn, *args, **kw):
    return check(lambda *a: _meta(fn(*a)), *args, check_strides=True, **kw)


def _jit_raises(fn, *args, exc, match):
    with pytest.raises(exc, match=match):
        fn(*args)
    with pytest.raises(exc, match=match):
        keraunos.jit(fn)(*args)


# --- view / reshape ----------------------------------------------------------------------------

VIEW_FNS = {
    "view_-1": lambda a: a.view(-1) if a.is_contiguous() else a.reshape(-1),
    "view_varargs": lambda a: a.contiguous().view(2, 12),
    "reshape": lambda a: a.reshape(3, -1),
    "reshape_tuple": lambda a: torch.reshape(a, (2, 2, 6)),
    "reshape_-1": lambda a: a.reshape(-1),
    "reshape_same": lambda a: a.reshape(4, 6),
    "reshape_split_dim": lambda a: a.reshape(4, 2, 3),
    "reshape_unsqueezed": lambda a: a.reshape(1, 4, 1, 6, 1),
    "flatten": lambda a: a.flatten(),
    "flatten_kw": lambda a: torch.flatten(a, start_dim=0, end_dim=-1),
    "unflatten": lambda a: a.unflatten(1, (2, -1)),
    "permute": lambda a: a.permute(1, 0),
    "permute_neg": lambda a: torch.permute(a, (-1, -2)),
    "transpose": lambda a: a.transpose(0, 1),
    "transpose_same": lambda a: a.transpose(1, -1),
    "swapaxes": lambda a: torch.swapaxes(a, 0, 1),
    "t": lambda a: a.t(),
    "T": lambda a: a.T,
    "mT": lambda a: a.mT,
    "unsqueeze0": lambda a: a.unsqueeze(0),
    "unsqueeze1": lambda a: a.unsqueeze(1),
    "unsqueeze_end": lambda a: a.unsqueeze(-1),
    "squeeze": lambda a: a.unsqueeze(1).squeeze(),
    "squeeze_dim": lambda a: a.unsqueeze(1).squeeze(1),
    "squeeze_noop": lambda a: a.squeeze(0),
    "squeeze_tuple": lambda a: a.unsqueeze(0).unsqueeze(-1).squeeze((0, -1, 1)),
    "expand": lambda a: a.unsqueeze(1).expand(4, 3, 6),
    "expand_-1": lambda a: a.unsqueeze(1).expand(-1, 3, -1),
    "expand_leading": lambda a: a.expand(2, 3, 4, 6),
    "expand_leading_1": lambda a: a.expand(1, 4, 6),
    "broadcast_to": lambda a: torch.broadcast_to(a[:1], (5, 6)),
    "narrow": lambda a: a.narrow(1, 2, 3),
    "narrow_neg": lambda a: torch.narrow(a, 0, -3, 2),
    "select": lambda a: a.select(1, -2),
    "diagonal": lambda a: a.diagonal(),
    "diagonal_off": lambda a: torch.diagonal(a, 2),
    "diagonal_neg": lambda a: a.diagonal(-1, 1, 0),
    "diagonal_empty": lambda a: a.diagonal(10),
    "movedim": lambda a: a.unsqueeze(0).movedim(0, -1),
    "movedim_list": lambda a: torch.movedim(a.unsqueeze(0), (0, 2), (1, 0)),
    "moveaxis": lambda a: torch.moveaxis(a, 0, 1),
}


@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize("name", list(VIEW_FNS))
def test_views(name, layout):
    x = _layouts()[layout]
    check_meta(VIEW_FNS[name], x)


@pytest.mark.parametrize(
    "name",
    ["chunk", "chunk_uneven", "split", "split_list", "unbind", "unbind1", "split_kw", "chunk_more"],
)
@pytest.mark.parametrize("layout", ["contig", "transposed", "sliced"])
def test_multi_output_views(name, layout):
    x = _layouts()[layout]
    fns = {
        "chunk": lambda a: a.chunk(2),
        "chunk_uneven": lambda a: torch.chunk(a, 4, 1),
        "chunk_more": lambda a: a.chunk(10, 0),
        "split": lambda a: a.split(4, 1),
        "split_list": lambda a: torch.split(a, [1, 0, 3], 0),
        "split_kw": lambda a: torch.split(a, split_size_or_sections=2, dim=-1),
        "unbind": lambda a: a.unbind(),
        "unbind1": lambda a: torch.unbind(a, 1),
    }
    check_meta(fns[name], x)
    jf = check(fns[name], x, check_strides=True)
    out = jf(x.clone())
    assert isinstance(out, tuple)


def test_iterate_proxy():
    check(lambda a: [r * 2 for r in a], torch.randn(3, 4))


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.float64]
)
def test_views_dtypes(dtype):
    x = _x(4, 6, dtype=dtype)
    check_meta(
        lambda a: (a.view(-1), a.t().reshape(-1), a[1:, None, ::3], a.permute(1, 0).unsqueeze(0)), x
    )


def test_view_aliases_input_and_write_through():
    def f(a):
        v = a.view(-1)
        v.sin_()
        return v

    check_meta(f, torch.randn(3, 4))

    def g(a):
        a.t()[0].mul_(2)
        a.diagonal().neg_()
        return a.view(2, 6)

    check(g, torch.randn(4, 3))

    def h(a):
        u = a.unsqueeze(0).expand(2, 4, 3)
        return u, u[1], a.transpose(0, 1).unsqueeze(1)

    check_meta(h, torch.randn(4, 3))


def test_reshape_copy_when_not_viewable():
    x = torch.randn(6, 4).t()

    def f(a):
        r = a.reshape(-1)
        r.add_(1)  # writes into the copy, not into a
        return r

    check_meta(f, x)
    check_meta(lambda a: a.flatten(), x)
    check(lambda a: a.reshape(2, 12) * 2, x)
    check_prims(lambda a: a.reshape(2, 12), x)


def test_contiguous():
    x = torch.randn(3, 4)
    jf = check(lambda a: a.contiguous(), x, check_strides=True)
    y = x.clone()
    assert jf(y) is y  # already contiguous: the input itself
    check_meta(lambda a: a.t().contiguous(), x)
    check_meta(lambda a: a[:, ::2].contiguous(), x)
    check_prims(lambda a: a.t().contiguous(), x)


def test_flatten_edge_cases():
    x = torch.randn(2, 3, 4)
    check_meta(lambda a: a.flatten(1), x)
    check_meta(lambda a: a.flatten(0, 1), x.permute(2, 0, 1))
    check_meta(lambda a: a.flatten(1, 2), x.permute(2, 0, 1))
    jf = check(lambda a: a.flatten(1, 1), x)
    y = x.clone()
    assert jf(y) is y  # eager returns the input itself
    check_meta(lambda a: a.flatten(), torch.tensor(3.0))
    check_meta(lambda a: a.unflatten(-1, (2, 2)), x)
    check_meta(lambda a: a.unflatten(0, (1, 2, 1)), x.transpose(0, 2))


def test_zero_d_and_empty():
    s = torch.tensor(2.5)
    check_meta(
        lambda a: (
            a.view(1),
            a.reshape(1, 1),
            a.unsqueeze(0),
            a.squeeze(),
            a.squeeze(0),
            a.expand(3, 2),
            a.t(),
            a.view(()),
            a[None],
            a[...],
            a.permute(()),
            a.transpose(0, -1),
            a.flatten(),
        ),
        s,
    )
    e = torch.randn(0, 3)
    check_meta(
        lambda a: (
            a.view(-1),
            a.view(3, 0),
            a.reshape(0, 5, 0),
            a.t(),
            a[1:],
            a.unsqueeze(2),
            a.split(2, 1),
            a.chunk(3, 0),
            a.expand(2, 0, 3),
        ),
        e,
    )
    check_meta(lambda a: a.t().reshape(3, 0), e)


# --- errors --------------------------------------------------------------------------------------


def test_view_errors():
    x = torch.randn(3, 4)
    _jit_raises(lambda a: a.t().view(-1), x, exc=RuntimeError, match="view size is not compatible")
    _jit_raises(
        lambda a: a.view(5, -1),
        x,
        exc=RuntimeError,
        match=r"shape '\[5, -1\]' is invalid for input of size 12",
    )
    _jit_raises(
        lambda a: a.view(-1, -1), x, exc=RuntimeError, match="only one dimension can be inferred"
    )
    _jit_raises(lambda a: a.reshape(-2, 6), x, exc=RuntimeError, match="invalid shape dimension -2")
    _jit_raises(
        lambda a: a[:0].view(-1, 0),
        x,
        exc=RuntimeError,
        match="cannot reshape tensor of 0 elements",
    )
    with pytest.raises(NotImplementedError, match=r"view with another dtype"):
        keraunos.jit(lambda a: a.view(torch.int32))(x)


def test_shape_op_errors():
    x = torch.randn(3, 4)
    _jit_raises(lambda a: a.expand(2), x, exc=RuntimeError, match="the number of sizes provided")
    _jit_raises(
        lambda a: a.expand(2, 5, 4),
        x,
        exc=RuntimeError,
        match=r"expanded size of the tensor \(5\) must match",
    )
    _jit_raises(
        lambda a: a.expand(-1, 3, 4), x, exc=RuntimeError, match="leading, non-existing dimension 0"
    )
    _jit_raises(
        lambda a: a.permute(0),
        x,
        exc=RuntimeError,
        match="number of dimensions in the tensor input",
    )
    _jit_raises(lambda a: a.permute(0, -2), x, exc=RuntimeError, match="duplicate dims")
    _jit_raises(
        lambda a: a.unsqueeze(0).t(),
        x,
        exc=RuntimeError,
        match=r"t\(\) expects a tensor with <= 2 dimensions",
    )
    _jit_raises(lambda a: a.narrow(0, 4, 1), x, exc=IndexError, match="start out of range")
    _jit_raises(
        lambda a: a.narrow(0, 2, 2),
        x,
        exc=RuntimeError,
        match=r"start \(2\) \+ length \(2\) exceeds",
    )
    _jit_raises(
        lambda a: a.diagonal(0, 1, 1),
        x,
        exc=RuntimeError,
        match="diagonal dimensions cannot be identical",
    )
    _jit_raises(
        lambda a: a.chunk(0),
        x,
        exc=RuntimeError,
        match="chunk expects `chunks` to be greater than 0",
    )
    _jit_raises(
        lambda a: a.split(-1), x, exc=RuntimeError, match="split expects split_size be non-negative"
    )
    _jit_raises(
        lambda a: a.split([1, 1]),
        x,
        exc=RuntimeError,
        match="split_with_sizes expects split_sizes to sum",
    )
    _jit_raises(lambda a: a.unflatten(0, (2, 2)), x, exc=RuntimeError, match="don't multiply up")
    _jit_raises(
        lambda a: a.flatten(1, 0), x, exc=RuntimeError, match="start_dim cannot come after end_dim"
    )
    _jit_raises(
        lambda a: a.movedim((0, 1), (0,)), x, exc=RuntimeError, match="movedim: Invalid source"
    )
    _jit_raises(lambda a: a.squeeze(5), x, exc=IndexError, match="Dimension out of range")
    _jit_raises(lambda a: a.unsqueeze(3), x, exc=IndexError, match="Dimension out of range")
    _jit_raises(lambda a: a.transpose(0, 2), x, exc=IndexError, match="Dimension out of range")
    _jit_raises(
        lambda a: a.select(0, 5), x, exc=IndexError, match="out of range for tensor of size"
    )
    _jit_raises(lambda a: a.unbind(2), x, exc=IndexError, match="Dimension out of range")


# --- getitem --------------------------------------------------------------------------------------

BASIC_INDICES = {
    "int": 1,
    "neg_int": -1,
    "int_int": (2, -3),
    "slice": slice(1, 3),
    "slice_step": (slice(None), slice(None, None, 2)),
    "slice_step3": (slice(1, None, 3),),
    "slice_neg": (slice(-3, -1), slice(-100, 100)),
    "slice_empty": (slice(3, 1),),
    "slice_past": (slice(10, 20),),
    "none": None,
    "none_mid": (slice(None), None),
    "none_end": (Ellipsis, None),
    "ellipsis": Ellipsis,
    "ellipsis_int": (Ellipsis, 1),
    "int_ellipsis_none": (0, Ellipsis, None),
    "mixed": (None, slice(1, None), None, -2),
    "empty_tuple": (),
    "double_ellipsis": (Ellipsis, Ellipsis),
}


@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize("name", list(BASIC_INDICES))
def test_getitem_basic(name, layout):
    idx = BASIC_INDICES[name]
    check_meta(lambda a: a[idx], _layouts()[layout])


def test_getitem_3d_and_0d():
    x = torch.randn(3, 4, 5)
    check_meta(
        lambda a: (a[1, :, ::2], a[..., 1:3], a[:, None, 2], a[-1, -1, -1], a[None, ..., None]), x
    )
    check_meta(lambda a: a.permute(2, 0, 1)[1:, 2], x)
    s = torch.tensor(1.5)
    check_meta(lambda a: (a[None], a[...], a[()], a[None, None, ...]), s)


def test_getitem_errors():
    x = torch.randn(3, 4)
    _jit_raises(
        lambda a: a[5],
        x,
        exc=IndexError,
        match="index 5 is out of bounds for dimension 0 with size 3",
    )
    _jit_raises(
        lambda a: a[:, -5],
        x,
        exc=IndexError,
        match="index -5 is out of bounds for dimension 1 with size 4",
    )
    _jit_raises(
        lambda a: a[0, 0, 0], x, exc=IndexError, match="too many indices for tensor of dimension 2"
    )
    _jit_raises(lambda a: a[::-1], x, exc=ValueError, match="step must be greater than zero")
    _jit_raises(lambda a: a[0, 0][0], x, exc=IndexError, match="invalid index of a 0-dim tensor")
    _jit_raises(lambda a: a[1.5], x, exc=IndexError, match="are valid indices")
    fi = torch.tensor([1.0])
    _jit_raises(lambda a: a[fi], x, exc=IndexError, match="tensors used as indices must be")
    _jit_raises(
        lambda a, i, j: a[i, j],
        x,
        torch.tensor([0, 1]),
        torch.tensor([0, 1, 2]),
        exc=IndexError,
        match="could not be broadcast together",
    )
    # Boolean-mask indexing splits the program (test_split.py).
    torch.testing.assert_close(keraunos.jit(lambda a: a[a > 0] * 2)(x), x[x > 0] * 2)
    _jit_raises(
        lambda a, m: a[m],
        x,
        torch.ones(2, dtype=torch.bool),
        exc=IndexError,
        match="The shape of the mask",
    )


ADVANCED = {
    "one": lambda a, i, j: a[i],
    "one_dim1": lambda a, i, j: a[:, i],
    "neg_idx": lambda a, i, j: a[-i - 1],
    "two_adjacent": lambda a, i, j: a[i, j],
    "two_adjacent_mid": lambda a, i, j: a[:, i, j],
    "two_separated": lambda a, i, j: a[i, :, j],
    "int_then_idx": lambda a, i, j: a[0, :, i],
    "idx_int_idx": lambda a, i, j: a[i, 1, j],
    "slice_idx": lambda a, i, j: a[1:, i, ::2],
    "none_idx": lambda a, i, j: a[None, i],
    "ellipsis_idx": lambda a, i, j: a[..., i],
    "broadcast_2d": lambda a, i, j: a[i.unsqueeze(1), j],
    "list": lambda a, i, j: a[[0, 1, 1]],
    "list_in_tuple": lambda a, i, j: a[:, [2, 0]],
    "int32": lambda a, i, j: a[i.int()],
    "zero_d_index": lambda a, i, j: a[i[0], j],
}


@pytest.mark.parametrize("name", list(ADVANCED))
def test_getitem_advanced(name):
    x = torch.randn(3, 4, 5)
    i = torch.tensor([2, 0, 1, 0])
    j = torch.tensor([1, -1, 0, 3])
    check(ADVANCED[name], x, i, j)
    check(ADVANCED[name], x.permute(1, 0, 2).contiguous().permute(1, 0, 2), i, j)
    if "list" not in name:  # list indices become constant tensors, which check_prims does not pass
        check_prims(ADVANCED[name], x, i, j)


# --- setitem --------------------------------------------------------------------------------------


def _setitem_fns():
    def f_int(a, v, i):
        a[0] = 1
        return a

    def f_slice_tensor(a, v, i):
        a[:, 1:3] = v
        return a

    def f_broadcast(a, v, i):
        a[1:] = v[0, :1]
        return a

    def f_leading_ones(a, v, i):
        a[0, :2] = v[:1, :1].reshape(1, 1, 1) * 3
        return a

    def f_dtype(a, v, i):
        a[..., 0] = v[:, 0].double()
        return a

    def f_step(a, v, i):
        a[::2, ::3] = -1.5
        return a

    def f_none(a, v, i):
        a[None, 1] = 7.0
        return a

    def f_full(a, v, i):
        a[...] = 2.0
        return a

    def f_idx_tensor(a, v, i):
        a[i] = 0
        return a

    def f_idx_tensor_values(a, v, i):
        a[:, i + 1] = v
        return a

    def f_two_idx(a, v, i):
        a[i, -i - 1] = v[0, :1]
        return a

    def f_mask(a, v, i):
        a[a > 0.5] = 2.0
        return a

    def f_mask_row(a, v, i):
        m = a[:, 0] > 0
        a[m] = v[0, :1]
        return a

    def f_mask_after_slice(a, v, i):
        m = a[0] > 0
        a[1:, m] = 3.0
        return a

    def f_mask_tensor_value(a, v, i):
        a[a < 0] = v[0, 0]
        return a

    def f_view_write(a, v, i):
        b = a.view(-1)
        b[2:5] = 9.0
        return b

    return {k[2:]: fn for k, fn in locals().items() if k.startswith("f_")}


SETITEM = _setitem_fns()


@pytest.mark.parametrize("name", list(SETITEM))
@pytest.mark.parametrize("layout", ["contig", "transposed", "sliced"])
def test_setitem(name, layout):
    x = _layouts()[layout]
    if name == "view_write" and not x.is_contiguous():
        pytest.skip("view of a non-contiguous tensor")
    v = torch.randn(4, 2)
    i = torch.tensor([0, 2])
    check(SETITEM[name], x, v, i)
    check_prims(SETITEM[name], x, v, i)


def test_setitem_int_tensor_and_returns_none():
    def f(a):
        r = a.__setitem__(0, 5)
        assert r is None
        a[1, 2] = 3.7  # truncated into int64 like eager
        return a

    check(f, torch.arange(12).reshape(3, 4))


def test_setitem_errors():
    x = torch.randn(3, 4)
    _jit_raises(
        lambda a, v: a.__setitem__(slice(None), v),
        x,
        torch.ones(2),
        exc=RuntimeError,
        match="must match the existing size",
    )
    i01 = torch.tensor([0, 1])
    _jit_raises(
        lambda a, v: a.__setitem__(i01, v),
        x,
        torch.ones(3),
        exc=RuntimeError,
        match="shape mismatch: value tensor of shape",
    )
    _jit_raises(lambda a: a.__setitem__(5, 1.0), x, exc=IndexError, match="out of bounds")

    def overlap(a):
        a.unsqueeze(0).expand(2, 3, 4)[:, 0] = 1.0

    _jit_raises(
        overlap, x, exc=RuntimeError, match="more than one element of the written-to tensor"
    )


# --- masked_fill / index ops ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_masked_fill(dtype):
    x = _x(3, 4, dtype=dtype)
    m = torch.rand(3, 4) > 0.5
    check(lambda a, m: a.masked_fill(m, 1), x, m)
    check(lambda a, m: torch.masked_fill(a, m[0], 0), x, m)
    three = torch.tensor(3)
    check(lambda a, m: a.masked_fill(m, three), x, m)
    check(lambda a, m: a.t().masked_fill(m.t(), 0), x, m)

    def inplace(a, m):
        r = a.masked_fill_(m[:, :1], True)
        return r

    check(inplace, x, m)
    check_prims(lambda a, m: a.masked_fill(m, 1), x, m)


def test_masked_fill_broadcast_and_errors():
    x = torch.randn(3, 4)
    check(lambda a, m: a.masked_fill(m, 2.5), x, torch.rand(2, 1, 4) > 0.5)
    check(lambda a: a.long().masked_fill(a > 0, 2.5), x)
    _jit_raises(
        lambda a: a.masked_fill(a, 1.0), x, exc=RuntimeError, match="only supports boolean masks"
    )
    _jit_raises(
        lambda a: a.masked_fill(a > 0, a[0]),
        x,
        exc=RuntimeError,
        match="0-dimensional value tensor",
    )
    big = torch.ones(2, 3, 4, dtype=torch.bool)
    _jit_raises(lambda a: a.masked_fill_(big, 1.0), x, exc=RuntimeError, match=None)


def test_index_put():
    x = torch.randn(4, 5)
    i = torch.tensor([0, 2, 2])
    j = torch.tensor([1, 1, -1])
    one, five, one64 = torch.tensor(1.0), torch.tensor(5.0), torch.tensor(1.0, dtype=torch.float64)
    check(lambda a, i, j: torch.index_put(a, (i, j), one), x, i, j)
    check(lambda a, i, j: a.index_put((i,), a[0] * 2), x, i, j)
    check(lambda a, i, j: a.index_put((i, j), a[0, :3], accumulate=True), x, i, j)
    _jit_raises(
        lambda a, j: a.index_put_((None, j), a[:, :3]), x, j, exc=TypeError, match="NoneType"
    )

    def inplace(a, i, j):
        a.index_put_((i, j), five, True)
        return a

    check(inplace, x, i, j)
    check_prims(lambda a, i, j: a.index_put((i, j), a[0, :3], accumulate=True), x, i, j)
    _jit_raises(
        lambda a, i: a.index_put((i,), one64),
        x,
        i,
        exc=RuntimeError,
        match="Index put requires the source and destination dtypes match",
    )
    _jit_raises(
        lambda a, i: a.index_put((i, i, i), one), x, i, exc=IndexError, match="too many indices"
    )


def test_index_copy_and_select():
    x = torch.randn(4, 5)
    idx = torch.tensor([3, 0])
    check(lambda a, i, s: a.index_copy(0, i, s), x, idx, torch.randn(2, 5))
    check(lambda a, i, s: torch.index_copy(a, 1, i, s), x, idx, torch.randn(4, 2))

    def inplace(a, i, s):
        return a.index_copy_(-1, i, s)

    check(inplace, x, idx, torch.randn(4, 2))
    check_prims(lambda a, i, s: a.index_copy(0, i, s), x, idx, torch.randn(2, 5))
    _jit_raises(
        lambda a, i: a.index_copy(0, i.int(), a[:2]),
        x,
        idx,
        exc=RuntimeError,
        match="Expected a long tensor for index",
    )
    _jit_raises(
        lambda a, i: a.index_copy(0, i, a[:1]), x, idx, exc=IndexError, match="Number of indices"
    )
    _jit_raises(
        lambda a, i: a.index_copy(0, i, a[:2].double()),
        x,
        idx,
        exc=RuntimeError,
        match="self and source expected to have the same dtype",
    )

    check(
        lambda a, i: (
            a.index_select(0, i),
            torch.index_select(a, 1, i.int()),
            a.index_select(-1, i[0]),
        ),
        x,
        idx,
    )
    check(lambda a, i: a.t().index_select(0, i), x, idx)
    check_prims(lambda a, i: a.index_select(1, i), x, idx)
    _jit_raises(
        lambda a, i: a.index_select(0, i.view(1, 2)),
        x,
        idx,
        exc=IndexError,
        match="supposed to be a vector",
    )
    _jit_raises(
        lambda a, i: a.index_select(0, i.float()),
        x,
        idx,
        exc=RuntimeError,
        match="Expected dtype int32 or int64",
    )


def test_index_copy_and_select_of_a_scalar():
    # A 0-dim tensor is a 1-element vector to both; the result is 0-dim again.
    s = torch.tensor(2.5)
    check(lambda a, i: (a.index_select(0, i), a.index_select(-1, i[0])), s, torch.tensor([0]))
    check(lambda a, i, v: a.index_copy(0, i, v), s, torch.tensor([0]), torch.tensor(-1.0))
    check(lambda a, i, v: a.index_copy_(0, i, v), s, torch.tensor(0), torch.tensor([-1.0]))
    check(
        lambda a, i, v: a.index_copy(0, i, v), s, torch.tensor([], dtype=torch.long), torch.ones(0)
    )
    _jit_raises(
        lambda a, i: a.index_select(0, i),
        s,
        torch.tensor([0, 0]),
        exc=RuntimeError,
        match="Index to scalar can have only 1 value",
    )


# --- cat / stack ----------------------------------------------------------------------------------


def test_cat():
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    check(lambda a, b: torch.cat([a, b]), a, b)
    check(lambda a, b: torch.cat((a, b, a), dim=0), a, b)
    check(lambda a, b: torch.cat([a.t(), b.t()], -1), a, b)
    check(lambda a, b: torch.cat([a, b.half()]), a, b)
    check(lambda a, b: torch.cat([a.long(), b.int()]), a, b)
    check(lambda a, b: torch.cat([a.bool(), b.to(torch.uint8)]), a, b)
    e0 = torch.empty(0)
    check(lambda a, b: torch.cat([a, e0]), a, b)  # legacy: 1-D empty tensors are skipped
    check(lambda a, b: torch.concat([a], 1), a, b)
    check_prims(lambda a, b: torch.cat([a, b.double()]), a, b)
    _jit_raises(
        lambda a, b: torch.cat([a, b], 1),
        a,
        b,
        exc=RuntimeError,
        match="Sizes of tensors must match",
    )
    _jit_raises(
        lambda a, b: torch.cat([a, b[0]]), a, b, exc=RuntimeError, match="same number of dimensions"
    )
    _jit_raises(
        lambda a, b: torch.cat([a[0, 0]]), a, b, exc=RuntimeError, match="zero-dimensional tensor"
    )
    _jit_raises(lambda a, b: torch.cat([]), a, b, exc=ValueError, match="expected a non-empty list")
    _jit_raises(
        lambda a, b: torch.cat([a, a], 2), a, b, exc=IndexError, match="Dimension out of range"
    )


def test_stack():
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    check(lambda a, b: torch.stack([a, b]), a, b)
    check(lambda a, b: torch.stack([a, b], 1), a, b)
    check(lambda a, b: torch.stack((a, b.double()), dim=-1), a, b)
    check(lambda a, b: torch.stack([a[0, 0], b[1, 1]]), a, b)
    check_prims(lambda a, b: torch.stack([a, b.t().t()], 2), a, b)
    _jit_raises(
        lambda a, b: torch.stack([a, b[0]]),
        a,
        b,
        exc=RuntimeError,
        match="stack expects each tensor to be equal size",
    )
    _jit_raises(
        lambda a, b: torch.stack([]),
        a,
        b,
        exc=RuntimeError,
        match="stack expects a non-empty TensorList",
    )


def test_trace_records_views_without_subsymbols():
    jf = keraunos.jit(lambda a: a.view(-1).t()[1:])
    jf(torch.randn(4))
    acquired = str(keraunos.last_traces(jf)[0])
    assert "ltorch.view" in acquired and "prims" not in acquired


COPY_META = {
    "adv": lambda a, i, m: a[i],
    "adv_dim1": lambda a, i, m: a[:, i],
    "adv_separated": lambda a, i, m: a.unsqueeze(1)[i, :, i],
    "masked_fill": lambda a, i, m: a.masked_fill(m, 0.0),
    "cat": lambda a, i, m: torch.cat([a, a]),
    "cat1": lambda a, i, m: torch.cat([a, a], 1),
    "stack": lambda a, i, m: torch.stack([a, a], 1),
    "index_select": lambda a, i, m: a.index_select(1, i),
    "index_copy": lambda a, i, m: a.index_copy(0, i, a[:2]),
    "contiguous": lambda a, i, m: a.contiguous(),
    "reshape_copy": lambda a, i, m: a.reshape(-1),
}


@pytest.mark.parametrize("layout", ["contig", "transposed"])
@pytest.mark.parametrize("name", list(COPY_META))
def test_copy_results_meta(name, layout):
    """Results that are copies are dense like eager's (so views of them agree too)."""
    x = _layouts()[layout]
    check_meta(COPY_META[name], x, torch.tensor([0, 2]), torch.rand(4, 6) > 0.5)
    check_meta(
        lambda a, i, m: COPY_META[name](a, i, m).view(-1),
        x,
        torch.tensor([0, 2]),
        torch.rand(4, 6) > 0.5,
    )


def test_as_variants_and_globals():
    x, y = torch.randn(2, 6), torch.randn(3, 4)
    check_meta(
        lambda a, b: (a.view_as(b), a.reshape_as(b), a[:1].expand_as(a), b.t().reshape_as(a)), x, y
    )
    g = torch.randn(5, 3)

    def f(i):
        return g[i], g[1:, i[0]]

    check(f, torch.tensor([4, 0]))


def test_inplace_through_views_changes_inputs():
    def f(a):
        a.view(-1)[::5].sin_()
        a.t()[1:].mul_(3)
        a.unsqueeze(0).squeeze(0).narrow(1, 1, 2).add_(1)
        return a

    check(f, torch.randn(4, 6))
    check(f, torch.randn(6, 4).t())

    def g(a, b):
        a.select(0, 1).copy_(b[0])
        a.unbind(1)[2].mul_(0)
        return a

    check(g, torch.randn(3, 4), torch.randn(2, 4))

"""Shape, view and indexing ops: view/reshape/permute/... (torch.X and Tensor.X forms, varargs
sizes), getitem/setitem, masked_fill, index_put, index_copy, index_select, cat, stack."""

import torch

from .. import _shape_impl
from ..tracer import Proxy, record, where
from . import lookup, register, register_handler

T = torch.Tensor

# Eager raises IndexError for these; the C++ error channel raises ValueError with eager's
# message, and the entries below re-raise them as IndexError.
_INDEX_ERRORS = (
    "Dimension out of range",
    "is out of bounds for dimension",
    "too many indices for tensor",
    "invalid index of a 0-dim tensor",
    "tensors used as indices must be",
    "are valid indices",
    "The shape of the mask",
    "indexing tensors could not be broadcast",
    "out of range for tensor of size",
    "cannot be applied to a 0-dim tensor",
    "start out of range",
    "Index is supposed to be a vector",
    "Index should have dimension",
    "Number of indices",
    "When source and destination are not scalars",
    "tensor has no dimensions",
)


def _index_errors(entry):
    def wrapped(tr, args, kwargs):
        try:
            return entry(tr, args, kwargs)
        except ValueError as e:
            msg = str(e)
            if any(k in msg for k in _INDEX_ERRORS):
                raise IndexError(msg) from None
            raise

    return wrapped


def _reg(funcs, op, normalize=None, out_ok=True):
    funcs = [f for f in (funcs if isinstance(funcs, (list, tuple)) else [funcs]) if f is not None]
    register(funcs, op, normalize, out_ok=out_ok)
    for f in funcs:
        register_handler(f, _index_errors(lookup(f)))


def _ensure_program_alias():
    """The generated programs call `_shape.getitem` / `_shape.setitem`."""
    from ..jit import _program_globals

    _program_globals().setdefault("_shape", _shape_impl)


def _is_size_seq(x):
    return isinstance(x, (tuple, list, torch.Size))


def _sizes(size, kwargs, key):
    """Varargs sizes: f(2, 3), f((2, 3)), f([2, 3]) or f(key=(2, 3))."""
    if key in kwargs:
        if size:
            raise TypeError(f"got multiple values for argument '{key}'")
        return tuple(kwargs.pop(key))
    if len(size) == 1 and _is_size_seq(size[0]):
        return tuple(size[0])
    return tuple(size)


def _self(args, kwargs):
    if args:
        return args[0], args[1:]
    return kwargs.pop("input"), ()


# Views --------------------------------------------------------------------------------------


def _view(a, *size, **kw):
    if (
        len(size) == 1
        and isinstance(size[0], torch.dtype)
        or isinstance(kw.get("dtype"), torch.dtype)
    ):
        raise NotImplementedError(
            f"keraunos: Tensor.view(dtype) (reinterpreting the bits) is not supported yet (at {where()})"
        )
    return (a, _sizes(size, kw, "size")), {}


_reg(T.view, "view", _view, out_ok=False)
_reg([T.detach, torch.detach], "detach", out_ok=False)
_reg(T.view_as, "view", lambda a, other: ((a, tuple(other.shape)), {}), out_ok=False)


def _reshape(*args, **kw):
    a, rest = _self(args, kw)
    return (a, _sizes(rest, kw, "shape")), {}


_reg([torch.reshape, T.reshape], "reshape", _reshape, out_ok=False)
_reg(T.reshape_as, "reshape", lambda a, other: ((a, tuple(other.shape)), {}), out_ok=False)


def _flatten(*args, **kw):
    a, rest = _self(args, kw)
    return (a, *rest), kw


_reg([torch.flatten, T.flatten], "flatten", _flatten, out_ok=False)


def _unflatten(*args, **kw):
    a, rest = _self(args, kw)
    return (a, *rest), kw


_reg([torch.unflatten, T.unflatten], "unflatten", _unflatten, out_ok=False)


def _permute(*args, **kw):
    a, rest = _self(args, kw)
    return (a, _sizes(rest, kw, "dims")), {}


_reg([torch.permute, T.permute], "permute", _permute, out_ok=False)


def _transpose(*args, **kw):
    a, rest = _self(args, kw)
    rest = list(rest)
    for k, alias in (("dim0", "axis0"), ("dim1", "axis1")):
        if k in kw:
            rest.append(kw.pop(k))
        elif alias in kw:
            rest.append(kw.pop(alias))
    return (a, *rest), {}


_reg(
    [torch.transpose, T.transpose, torch.swapaxes, T.swapaxes, torch.swapdims, T.swapdims],
    "transpose",
    _transpose,
    out_ok=False,
)
_reg([torch.t, T.t], "t", lambda *a, **k: ((_self(a, k)[0],), {}), out_ok=False)


def _squeeze(*args, **kw):
    a, rest = _self(args, kw)
    dim = rest[0] if rest else kw.pop("dim", None)
    return (a, dim), {}


_reg([torch.squeeze, T.squeeze], "squeeze", _squeeze, out_ok=False)


def _unsqueeze(*args, **kw):
    a, rest = _self(args, kw)
    return (a, *rest), kw


_reg([torch.unsqueeze, T.unsqueeze], "unsqueeze", _unsqueeze, out_ok=False)


def _expand(a, *size, **kw):
    kw.pop("implicit", None)
    return (a, _sizes(size, kw, "size")), {}


_reg(T.expand, "expand", _expand, out_ok=False)
_reg(T.expand_as, "expand", lambda a, other: ((a, tuple(other.shape)), {}), out_ok=False)


def _broadcast_to(*args, **kw):
    a, rest = _self(args, kw)
    return (a, _sizes(rest, kw, "size")), {}


_reg([torch.broadcast_to, T.broadcast_to], "expand", _broadcast_to, out_ok=False)


def _plain(*args, **kw):
    a, rest = _self(args, kw)
    return (a, *rest), kw


def _narrow(*args, **kw):
    a, rest = _self(args, kw)
    if any(isinstance(x, (Proxy, torch.Tensor)) for x in list(rest) + list(kw.values())):
        raise NotImplementedError(
            f"keraunos: narrow with a tensor start is not supported (at {where()})"
        )
    return (a, *rest), kw


_reg([torch.narrow, T.narrow], "narrow", _narrow, out_ok=False)
_reg([torch.select, T.select], "select", _plain, out_ok=False)
_reg([torch.diagonal, T.diagonal], "diagonal", _plain, out_ok=False)


def _split(*args, **kw):
    a, rest = _self(args, kw)
    rest = list(rest)
    if not rest:
        for k in ("split_size_or_sections", "split_size", "split_sizes"):
            if k in kw:
                rest.append(kw.pop(k))
                break
    if rest and _is_size_seq(rest[0]):
        rest[0] = list(rest[0])
    return (a, *rest), kw


_reg([torch.split, T.split], "split", _split, out_ok=False)
_reg([T.split_with_sizes, getattr(torch, "split_with_sizes", None)], "split", _split, out_ok=False)
_reg([torch.chunk, T.chunk], "chunk", _plain, out_ok=False)
_reg([torch.unbind, T.unbind], "unbind", _plain, out_ok=False)


def _tensor_split(tr, args, kwargs):
    """torch.tensor_split runs through the torch fallback, except with a traced tensor of
    split points: the outputs' shapes would depend on its values."""
    points = args[1] if len(args) > 1 else None
    for k in ("indices_or_sections", "tensor_indices_or_sections", "indices", "sections"):
        points = kwargs.get(k, points)
    if isinstance(points, Proxy):
        # The outputs' shapes depend on the split points' values: the program is split here
        # and torch runs it (split.py).
        from .. import split

        return split.point("torch.tensor_split with a tensor of split points", _TS, args, kwargs)
    raise NotImplementedError("keraunos: tensor_split has no op of its own")  # the fallback


_TS = torch.tensor_split
register_handler([torch.tensor_split, T.tensor_split], _tensor_split)


def _movedim(*args, **kw):
    a, rest = _self(args, kw)
    return (a, *rest), kw


_reg([torch.movedim, T.movedim, torch.moveaxis, T.moveaxis], "movedim", _movedim, out_ok=False)


def _contiguous(a, memory_format=torch.contiguous_format):
    if memory_format is not torch.contiguous_format:
        raise NotImplementedError(
            f"keraunos: contiguous(memory_format={memory_format}) is not supported yet (at {where()})"
        )
    return (a,), {}


_reg(T.contiguous, "contiguous", _contiguous, out_ok=False)


# Indexing -----------------------------------------------------------------------------------


def _seq_as_tuple(seq):
    """torch's treatSequenceAsTuple for a list index."""
    if len(seq) >= 32:
        return False
    for x in seq:
        if isinstance(x, (Proxy, torch.Tensor, slice, list, tuple)) or x is None or x is Ellipsis:
            return True
    return False


def _as_index_tensor(a, seq):
    def check(x):
        if isinstance(x, (list, tuple)):
            for e in x:
                check(e)
        elif isinstance(x, Proxy):
            raise NotImplementedError(
                f"keraunos: a list index that contains traced tensors is not supported (at {where()})"
            )

    check(seq)
    with torch._C.DisableTorchFunction():
        return torch.tensor(seq, device=a.device)


def _normalize_index(a, idx):
    if isinstance(idx, tuple):
        items = list(idx)
    elif isinstance(idx, list) and _seq_as_tuple(idx):
        items = list(idx)
    else:
        items = [idx]
    out = []
    for it in items:
        if isinstance(it, (list, tuple)):
            it = _as_index_tensor(a, it)
        elif (
            not isinstance(it, (bool, int, slice, Proxy, torch.Tensor))
            and it is not None
            and it is not Ellipsis
        ):
            if hasattr(it, "__index__") and not isinstance(it, float):
                it = it.__index__()
            else:
                raise IndexError(
                    "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables "
                    f"are valid indices (got {type(it).__name__})"
                )
        out.append(it)
    return out


def _getitem(tr, args, kwargs):
    _ensure_program_alias()
    a, idx = args
    items = _normalize_index(a, idx)
    if any(
        isinstance(it, (Proxy, torch.Tensor)) and it.dtype in (torch.bool, torch.uint8)
        for it in items
    ):
        # Boolean-mask indexing: as many elements as the mask has True values. The program is
        # split here and torch indexes (split.py).
        from .. import split

        return split.point("x[mask] (boolean-mask indexing)", T.__getitem__, (a, idx))
    return record("getitem", "torch.Tensor.__getitem__", (a, _normalize_index(a, idx)), {})


def _setitem(tr, args, kwargs):
    _ensure_program_alias()
    a, idx, v = args
    if not isinstance(v, (Proxy, torch.Tensor, bool, int, float)):
        raise NotImplementedError(
            f"keraunos: assigning a {type(v).__name__} with x[...] = v is not supported (at {where()})"
        )
    record("setitem_", "torch.Tensor.__setitem__", (a, _normalize_index(a, idx), v), {})
    return None


register_handler(T.__getitem__, _index_errors(_getitem))
register_handler(T.__setitem__, _index_errors(_setitem))


def _masked_fill(*args, **kw):
    a, rest = _self(args, kw)
    return (a, *rest), kw


_reg([torch.masked_fill, T.masked_fill], "masked_fill", _masked_fill, out_ok=False)
_reg(T.masked_fill_, "masked_fill_", _masked_fill, out_ok=False)


def _index_put(*args, **kw):
    a, rest = _self(args, kw)
    rest = list(rest)
    if rest:
        rest[0] = list(rest[0])
        indices = rest[0]
    else:
        indices = kw["indices"] = list(kw.get("indices", ()))
    if any(
        isinstance(i, (Proxy, torch.Tensor)) and i.dtype in (torch.bool, torch.uint8)
        for i in indices
    ):
        # A boolean mask: torch runs it (the fallback splits the program there: split.py).
        raise NotImplementedError("index_put with a boolean mask index")
    return (a, *rest), kw


_reg([torch.index_put, T.index_put], "index_put", _index_put, out_ok=False)
_reg([T.index_put_, getattr(torch, "index_put_", None)], "index_put_", _index_put, out_ok=False)


def _index_copy(*args, **kw):
    a, rest = _self(args, kw)
    return (a, *rest), kw


_reg([torch.index_copy, T.index_copy], "index_copy", _index_copy, out_ok=False)
_reg([T.index_copy_], "index_copy_", _index_copy, out_ok=False)
_reg([torch.index_select, T.index_select], "index_select", _plain)


def _cat(tensors=None, dim=0, **kw):
    if tensors is None:
        tensors = kw.pop("tensors")
    if "axis" in kw:
        dim = kw.pop("axis")
    return (list(tensors), dim), kw


_reg([torch.cat, torch.concat, getattr(torch, "concatenate", None)], "cat", _cat)
_reg(torch.stack, "stack", _cat)

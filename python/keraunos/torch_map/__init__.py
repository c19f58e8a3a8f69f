"""The mapping table: torch callables -> keraunos ops. The C++ op table owns signatures,
checks and decompositions; entries here only name the op and, where torch's Python calling
convention differs from the op's schema (varargs sizes, reflected operators), normalize the
arguments. Each topic module registers its own entries."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .. import _C
from ..tracer import Proxy, callable_name, record, where

_TABLE: dict[object, Callable] = {}


def lookup(func):
    return _TABLE.get(func)


def registered() -> dict[object, Callable]:
    return dict(_TABLE)


def _funcs(funcs) -> list:
    if not isinstance(funcs, Iterable) or isinstance(funcs, str):
        funcs = [funcs]
    return [f for f in funcs if f is not None]


def register_handler(funcs, handler: Callable):
    """`handler(tracer, args, kwargs)` computes the result itself (for calls that are not one
    op: metadata, several ops, Python-level conveniences)."""
    for f in _funcs(funcs):
        _TABLE[f] = handler


def register(funcs, op: str, normalize: Callable | None = None, out_ok: bool = True):
    """Maps each callable in `funcs` to the C++ op `op`. `normalize(*args, **kwargs)` returns
    (args, kwargs) in the op's schema form. `out=` is accepted unless `out_ok` is False."""
    assert _C.has_op(op), f"no C++ op named {op!r}"
    for f in _funcs(funcs):
        display = callable_name(f)

        def entry(tr, args, kwargs, _op=op, _display=display):
            out = None
            if "out" in kwargs:
                kwargs = dict(kwargs)
                out = kwargs.pop("out")
                if not out_ok or (out is not None and not isinstance(out, Proxy)):
                    raise NotImplementedError(
                        f"keraunos: {_display}(out=...) is not supported here (at {where()})"
                    )
            if normalize is not None:
                args, kwargs = normalize(*args, **kwargs)
            result = record(_op, _display, args, kwargs)
            if out is not None:
                return write_out(out, result, _display)
            return result

        _TABLE[f] = entry


def write_out(out, result, display):
    if isinstance(result, tuple):
        raise NotImplementedError(
            f"keraunos: {display}(out=...) with several outputs is not supported"
        )
    if tuple(out.shape) != tuple(result.shape):
        raise NotImplementedError(
            f"keraunos: {display}(out=...) would resize the out tensor from {list(out.shape)} to "
            f"{list(result.shape)}; resizing is not supported (at {where()})"
        )
    if not _can_cast(result.dtype, out.dtype):
        raise RuntimeError(
            f"result type {_tname(result.dtype)} can't be cast to the desired output type "
            f"{_tname(out.dtype)}"
        )
    record("copy_", display, (out, result), {})
    return out


def _tname(d):
    return str(d).replace("torch.", "").capitalize()


def _can_cast(src, dst):
    import torch

    return torch.can_cast(src, dst)


def swap(a, b, **kw):
    """Reflected operators: `2 - x` arrives as x.__rsub__(2)."""
    return (b, a), kw


from . import composite, creation, elementwise, mutation, nn, reduction, shape  # noqa: E402, F401

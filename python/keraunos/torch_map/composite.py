"""Calls that real models make often and that decompose into ops of the table, so that their
elementwise parts fuse with their neighbours: addmm / baddbmm (a matmul and a bias add),
F.mse_loss. Forms outside what the decomposition covers exactly (out=, mixed dtypes, legacy
arguments, shapes eager would reject) raise NotImplementedError before recording anything:
the tracer then runs the call through the torch fallback, which gives eager's result or
eager's error."""

import torch
import torch.nn.functional as F

from ..tracer import Proxy, record
from . import register_handler

T = torch.Tensor


class _NotCovered(NotImplementedError):
    """This form of the call runs through the torch fallback."""


def _is_tensor(x):
    return isinstance(x, (Proxy, torch.Tensor))


def _bind(names, defaults, args, kwargs, kwonly=()):
    if len(args) > len(names):
        raise _NotCovered()
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in bound or (k not in names and k not in kwonly):
            raise _NotCovered()
        bound[k] = v
    for k, v in defaults.items():
        bound.setdefault(k, v)
    if any(k not in bound for k in names):
        raise _NotCovered()
    return bound


def _scaled(x, factor, display):
    if factor == 1:
        return x
    return record("mul", display, (x, factor), {})


def _add_matmul(display, batched):
    """input * beta + (a @ b) * alpha, with eager's checks."""
    ndim = 3 if batched else 2

    def handler(tr, args, kwargs):
        b = _bind(["input", "a", "b"], {"beta": 1, "alpha": 1}, args, kwargs, ("beta", "alpha"))
        inp, a, m = b["input"], b["a"], b["b"]
        beta, alpha = b["beta"], b["alpha"]
        if not all(_is_tensor(t) for t in (inp, a, m)):
            raise _NotCovered()
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in (beta, alpha)):
            raise _NotCovered()
        if a.dim() != ndim or m.dim() != ndim or not a.dtype == m.dtype == inp.dtype:
            raise _NotCovered()
        if not inp.dtype.is_floating_point:
            raise _NotCovered()
        inner = a.shape[-1]
        if m.shape[-2] != inner or (batched and a.shape[0] != m.shape[0]):
            raise _NotCovered()
        result_shape = (*a.shape[:-1], m.shape[-1])
        try:
            if torch.broadcast_shapes(tuple(inp.shape), result_shape) != result_shape:
                raise _NotCovered()
        except RuntimeError:
            raise _NotCovered() from None
        prod = _scaled(record("matmul", display, (a, m), {}), alpha, display)
        if beta == 0:  # eager ignores the input then, NaNs included
            return prod
        return record("add", display, (_scaled(inp, beta, display), prod), {})

    return handler


register_handler([torch.addmm, T.addmm], _add_matmul("torch.addmm", batched=False))
register_handler([torch.baddbmm, T.baddbmm], _add_matmul("torch.baddbmm", batched=True))


def _mse_loss(tr, args, kwargs):
    b = _bind(
        ["input", "target", "size_average", "reduce", "reduction", "weight"],
        {"size_average": None, "reduce": None, "reduction": "mean", "weight": None},
        args,
        kwargs,
    )
    x, y = b["input"], b["target"]
    if b["size_average"] is not None or b["reduce"] is not None or b["weight"] is not None:
        raise _NotCovered()  # legacy arguments (and their warning): eager's own code
    if not (_is_tensor(x) and _is_tensor(y)) or x.dtype != y.dtype:
        raise _NotCovered()
    if tuple(x.shape) != tuple(y.shape) or not x.dtype.is_floating_point:
        raise _NotCovered()  # eager warns about broadcasting: its own code does that
    reduction = b["reduction"]
    if reduction not in ("mean", "sum", "none"):
        raise _NotCovered()
    d = record("sub", "torch.nn.functional.mse_loss", (x, y), {})
    sq = record("mul", "torch.nn.functional.mse_loss", (d, d), {})
    if reduction == "none":
        return sq
    return record(reduction, "torch.nn.functional.mse_loss", (sq,), {})


register_handler(F.mse_loss, _mse_loss)

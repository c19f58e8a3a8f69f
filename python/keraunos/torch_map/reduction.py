"""Reductions, scans, softmax-like ops and arg-reductions. Normalizers turn torch's calling
conventions (`x.sum(1, True)`, `axis=`, `torch.var(x, 1, unbiased=False)`, `torch.max(x, 1)`,
`F.softmax(x)` without dim) into the ops' schema form."""

import warnings

import torch

from ..tracer import Proxy, record
from . import register, register_handler, write_out

F = torch.nn.functional
T = torch.Tensor


def _dim_kw(kwargs):
    if "axis" in kwargs:
        if "dim" in kwargs:
            raise TypeError("got both 'dim' and 'axis'")
        kwargs["dim"] = kwargs.pop("axis")
    return kwargs


def _sum_like(a, *args, **kwargs):
    """sum/mean/nansum style: (input, dim=None, keepdim=False, *, dtype=None)."""
    kwargs = _dim_kw(dict(kwargs))
    if len(args) == 1 and isinstance(args[0], torch.dtype):  # torch.sum(x, torch.float64)
        return (a,), {"dtype": args[0], **kwargs}
    return (a, *args), kwargs


def _prod(a, *args, **kwargs):
    kwargs = _dim_kw(dict(kwargs))
    if len(args) == 1 and isinstance(args[0], torch.dtype):
        return (a,), {"dtype": args[0], **kwargs}
    return (a, *args), kwargs


def _amax(a, *args, **kwargs):
    kwargs = _dim_kw(dict(kwargs))
    if kwargs.get("dim", 0) is None:
        kwargs["dim"] = []
    if args and args[0] is None:
        args = ([], *args[1:])
    return (a, *args), kwargs


for _name in ("sum", "mean"):
    register([getattr(torch, _name), getattr(T, _name)], _name, _sum_like)
register([torch.prod, T.prod], "prod", _prod)
register([torch.amax, T.amax], "amax", _amax)
register([torch.amin, T.amin], "amin", _amax)


def _var_norm(a, *args, **kwargs):
    """torch.var(x, dim=None, *, correction=1, keepdim=False), torch.var(x, unbiased),
    torch.var(x, dim, unbiased, keepdim)."""
    kwargs = _dim_kw(dict(kwargs))
    args = list(args)
    dim = kwargs.pop("dim", None)
    unbiased = kwargs.pop("unbiased", None)
    correction = kwargs.pop("correction", None)
    keepdim = kwargs.pop("keepdim", False)
    if kwargs:
        raise TypeError(f"var()/std() got unexpected keyword arguments {sorted(kwargs)}")
    if args and isinstance(args[0], bool):
        unbiased = args.pop(0)
        if args:
            raise TypeError("var()/std(): unexpected arguments after unbiased")
    else:
        if args:
            dim = args.pop(0)
        if args:
            unbiased = args.pop(0)
        if args:
            keepdim = args.pop(0)
        if args:
            raise TypeError("var()/std() received too many positional arguments")
    if unbiased is not None:
        if correction is not None:
            raise RuntimeError("Cannot specify both unbiased and correction")
        correction = 1 if unbiased else 0
    return (a, dim), {"correction": correction, "keepdim": keepdim}


register([torch.var, T.var], "var", _var_norm)
register([torch.std, T.std], "std", _var_norm)


def _extremum(full_op, dim_op, binary_op, name):
    ret_type = getattr(torch.return_types, name)

    def handler(tr, args, kwargs):
        kwargs = dict(kwargs)
        out = kwargs.pop("out", None)
        display = f"torch.{name}"
        a, *rest = args
        kwargs = _dim_kw(kwargs)
        other = kwargs.pop("other", None)
        if rest and isinstance(rest[0], (Proxy, torch.Tensor)):
            other = rest.pop(0)
        if other is not None:
            if rest or kwargs:
                raise TypeError(f"{name}() received an invalid combination of arguments")
            r = record(binary_op, display, (a, other), {})
            return write_out(out, r, display) if out is not None else r
        if not rest and "dim" not in kwargs:
            if kwargs:
                raise TypeError(f"{name}() got unexpected keyword arguments {sorted(kwargs)}")
            r = record(full_op, display, (a,), {})
            return write_out(out, r, display) if out is not None else r
        if out is not None:
            raise NotImplementedError(f"keraunos: torch.{name}(..., dim, out=...) is not supported")
        values, indices = record(dim_op, display, (a, *rest), kwargs)
        return ret_type((values, indices))

    return handler


register_handler([torch.max, T.max], _extremum("max", "max_dim", "maximum", "max"))
register_handler([torch.min, T.min], _extremum("min", "min_dim", "minimum", "min"))


def _argnorm(a, *args, **kwargs):
    return (a, *args), _dim_kw(dict(kwargs))


register([torch.argmax, T.argmax], "argmax", _argnorm)
register([torch.argmin, T.argmin], "argmin", _argnorm)


def _lse(a, dim=None, keepdim=False, **kwargs):
    kwargs = _dim_kw(dict(kwargs))
    if "dim" in kwargs:
        dim = kwargs.pop("dim")
    if dim is None:
        raise TypeError("logsumexp() missing required argument 'dim'")
    return (a, dim, keepdim), kwargs


register([torch.logsumexp, T.logsumexp, torch.special.logsumexp], "logsumexp", _lse)


def _softmax_dim(ndim):
    # torch.nn.functional._get_softmax_dim
    warnings.warn(
        "Implicit dimension choice for softmax has been deprecated. "
        "Change the call to include dim=X as an argument.",
        stacklevel=4,
    )
    return 0 if ndim in (0, 1, 3) else 1


def _softmax_like(op, fname):
    def f_norm(a, dim=None, _stacklevel=3, dtype=None):
        """F.softmax(input, dim=None, _stacklevel=3, dtype=None)."""
        if dim is None:
            dim = _softmax_dim(a.dim())
        return (a, dim, dtype), {}

    def t_norm(a, dim, dtype=None, **kwargs):
        """torch.softmax(input, dim, dtype=None) / Tensor.softmax(dim, dtype=None)."""
        if kwargs:
            raise TypeError(f"{fname}() got unexpected keyword arguments {sorted(kwargs)}")
        return (a, dim, dtype), {}

    register(getattr(F, fname), op, f_norm, out_ok=False)
    register(
        [getattr(torch, fname), getattr(T, fname), getattr(torch.special, fname, None)], op, t_norm
    )


_softmax_like("softmax", "softmax")
_softmax_like("log_softmax", "log_softmax")


def _cumsum(a, dim=None, *, dtype=None, **kwargs):
    kwargs = _dim_kw(dict(kwargs))
    if "dim" in kwargs:
        dim = kwargs.pop("dim")
    if dim is None:
        raise TypeError("cumsum() missing required argument 'dim'")
    return (a, dim), {"dtype": dtype, **kwargs}


register([torch.cumsum, T.cumsum], "cumsum", _cumsum)
register([T.cumsum_], "cumsum_", _cumsum, out_ok=False)

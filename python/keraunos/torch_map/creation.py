"""Creation ops: factories (torch.zeros, torch.full, torch.arange, torch.randn, ...), *_like ops
and Tensor.new_*. The normalizers turn torch's calling conventions (varargs sizes, size=,
device strings) into the op schemas and resolve the default device and, for factories whose
default dtype is the default float, the dtype: the printed program then names them
explicitly, e.g. `torch.randn([4], dtype=torch.float32, device=torch.device('cpu'))`, which
draws from torch's default generator exactly as the eager call does."""

import torch

from .._dtypes import to_torch_device
from ..tracer import record, where
from . import register, register_handler

T = torch.Tensor


def _default_device():
    get = getattr(torch, "get_default_device", None)
    return get() if get is not None else torch.device("cpu")


def _device(device):
    # torch.device(...) called while tracing reaches the tracer's TorchFunctionMode: build
    # devices with torch functions disabled.
    with torch._C.DisableTorchFunction():
        if device is None:
            return _default_device()
        if isinstance(device, int) and not isinstance(device, bool):
            return torch.device("cuda", device)
        return torch.device(device)


def _device_of(a):
    if isinstance(a, torch.Tensor):
        return a.device
    with torch._C.DisableTorchFunction():
        return to_torch_device(a._p.device)


def _common(name, kwargs, *, like=False):
    """Pops the options every creation op takes; returns (dtype, device, requires_grad)."""
    kwargs = dict(kwargs)
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    requires_grad = kwargs.pop("requires_grad", False)
    layout = kwargs.pop("layout", None)
    if layout is not None and layout is not torch.strided:
        raise NotImplementedError(
            f"keraunos: torch.{name}(layout={layout}) is not supported (at {where()})"
        )
    if kwargs.pop("pin_memory", False):
        raise NotImplementedError(
            f"keraunos: torch.{name}(pin_memory=True) is not supported (at {where()})"
        )
    if "generator" in kwargs:
        if kwargs.pop("generator") is not None:
            raise NotImplementedError(
                f"keraunos: torch.{name}(generator=...) is not supported: jitted functions draw "
                f"from torch's default generator (at {where()})"
            )
    if like:
        mf = kwargs.pop("memory_format", None)
        if mf is not None and mf is not torch.preserve_format:
            raise NotImplementedError(
                f"keraunos: torch.{name}(memory_format={mf}) is not supported yet; only "
                f"torch.preserve_format (at {where()})"
            )
    if kwargs:
        raise TypeError(f"{name}() got an unexpected keyword argument '{next(iter(kwargs))}'")
    return dtype, device, requires_grad


def _size(name, args, kwargs):
    """torch.zeros(2, 3) / torch.zeros((2, 3)) / torch.zeros([]) / torch.zeros(size=(2, 3))."""
    if "size" in kwargs:
        if args:
            raise TypeError(f"{name}() got multiple values for argument 'size'")
        kwargs = dict(kwargs)
        return kwargs.pop("size"), kwargs
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return tuple(args[0]), kwargs
    return tuple(args), kwargs


def _factory(name, default_float):
    def normalize(*args, **kwargs):
        size, kwargs = _size(name, args, kwargs)
        dtype, device, rg = _common(name, kwargs)
        if dtype is None and default_float:
            dtype = torch.get_default_dtype()
        return (size,), {"dtype": dtype, "device": _device(device), "requires_grad": rg}

    return normalize


for _name in ("zeros", "ones", "empty", "rand", "randn"):
    register(getattr(torch, _name), _name, _factory(_name, True))


def _full(*args, **kwargs):
    kwargs = dict(kwargs)
    args = list(args)
    size = args.pop(0) if args else kwargs.pop("size")
    fill_value = args.pop(0) if args else kwargs.pop("fill_value")
    if args:
        raise TypeError(f"full() takes 2 positional arguments but {len(args) + 2} were given")
    if isinstance(fill_value, torch.Tensor) or hasattr(fill_value, "_p"):
        raise NotImplementedError(
            f"keraunos: torch.full with a tensor fill_value is not supported yet (at {where()})"
        )
    dtype, device, rg = _common("full", kwargs)
    return (size, fill_value), {"dtype": dtype, "device": _device(device), "requires_grad": rg}


register(torch.full, "full", _full)


def _arange(*args, **kwargs):
    kwargs = dict(kwargs)
    start = kwargs.pop("start", None)
    end = kwargs.pop("end", None)
    step = kwargs.pop("step", 1)
    if len(args) == 1:
        # arange(end), or arange(start, end=...)
        if end is None:
            end = args[0]
        else:
            if start is not None:
                raise TypeError("arange() got multiple values for argument 'start'")
            start = args[0]
    elif len(args) == 2:
        start, end = args
    elif len(args) == 3:
        start, end, step = args
    elif len(args) > 3:
        raise TypeError(
            f"arange() takes from 1 to 3 positional arguments but {len(args)} were given"
        )
    if end is None:
        raise TypeError("arange() missing required argument 'end'")
    if start is None:
        start = 0
    dtype, device, rg = _common("arange", kwargs)
    return (start, end, step), {"dtype": dtype, "device": _device(device), "requires_grad": rg}


register(torch.arange, "arange", _arange)


def _like(name, nvalues):
    def normalize(a, *args, **kwargs):
        kwargs = dict(kwargs)
        values = list(args)
        if nvalues and not values and "fill_value" in kwargs:
            values = [kwargs.pop("fill_value")]
        if len(values) != nvalues:
            raise TypeError(
                f"{name}() takes {1 + nvalues} positional arguments but {1 + len(values)} were given"
            )
        dtype, device, rg = _common(name, kwargs, like=True)
        kw = {"dtype": dtype, "requires_grad": rg}
        if device is not None:
            kw["device"] = _device(device)
        return (a, *values), kw

    return normalize


for _name in ("zeros_like", "ones_like", "empty_like", "rand_like", "randn_like"):
    register(getattr(torch, _name), _name, _like(_name, 0))
register(torch.full_like, "full_like", _like("full_like", 1))


def _new(name, op, nvalues):
    """Tensor.new_zeros(size) etc.: dtype and device default to the tensor's."""

    def normalize(a, *args, **kwargs):
        kwargs = dict(kwargs)
        args = list(args)
        if nvalues:
            if len(args) >= 2:
                size, value = args[0], args[1]
                args = args[2:]
            else:
                size = args.pop(0) if args else kwargs.pop("size")
                value = kwargs.pop("fill_value")
            if args:
                raise TypeError(
                    f"{name}() takes 3 positional arguments but {len(args) + 3} were given"
                )
            size = tuple(size) if isinstance(size, (tuple, list, torch.Size)) else (size,)
            extra = (value,)
        else:
            size, kwargs = _size(name, tuple(args), kwargs)
            extra = ()
        dtype, device, rg = _common(name, kwargs)
        return (size, *extra), {
            "dtype": a.dtype if dtype is None else dtype,
            "device": _device_of(a) if device is None else _device(device),
            "requires_grad": rg,
        }

    return normalize


def _register_new(func, op, nvalues):
    # Tensor methods arrive with the tracer's TorchFunctionMode active, where building a
    # torch.device would be intercepted: normalize and record with torch functions disabled.
    name = func.__name__
    normalize = _new(name, op, nvalues)

    def handler(tr, args, kwargs):
        with torch._C.DisableTorchFunction():
            a, kw = normalize(*args, **kwargs)
            return record(op, f"torch.Tensor.{name}", a, kw)

    register_handler(func, handler)


_register_new(T.new_zeros, "zeros", 0)
_register_new(T.new_ones, "ones", 0)
_register_new(T.new_empty, "empty", 0)
_register_new(T.new_full, "full", 1)


def _make_device(tr, args, kwargs):
    """torch.device(...) while tracing (user code, Proxy.device, dtype/device conversions run
    with the tracer's mode active) builds the device itself."""
    with torch._C.DisableTorchFunction():
        return torch.device(*args, **kwargs)


register_handler(torch.device, _make_device)


def _tensor(tr, args, kwargs):
    """torch.tensor(data): data are Python constants of the traced function. The constant is
    built once, passed as an input, and cloned on every call (each call gets a fresh tensor,
    as in eager)."""
    from ..tracer import Proxy

    def has_proxy(x):
        if isinstance(x, Proxy):
            return True
        return isinstance(x, (list, tuple)) and any(has_proxy(e) for e in x)

    if has_proxy(args[0] if args else kwargs.get("data")):
        raise NotImplementedError(
            f"keraunos: torch.tensor() of traced tensors is not supported; use torch.stack (at {where()})"
        )
    if kwargs.get("requires_grad"):
        raise NotImplementedError(
            f"keraunos: torch.tensor(requires_grad=True) is not supported (at {where()})"
        )
    with torch._C.DisableTorchFunction():
        t = torch.tensor(*args, **kwargs)
    return record("clone", "torch.tensor", (tr.lift(t),), {})


register_handler([torch.tensor], _tensor)

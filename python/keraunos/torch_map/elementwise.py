"""Elementwise math, comparisons, logical/bitwise ops, activations and casts."""

import torch

from ..tracer import record
from . import register, register_handler, swap

F = torch.nn.functional
T = torch.Tensor

_UNARY = [
    "abs",
    "neg",
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
    "floor",
    "ceil",
    "round",
    "trunc",
    "sign",
    "isnan",
    "isinf",
    "isfinite",
    "logical_not",
    "bitwise_not",
    "relu",
    "nan_to_num",
    "clamp",
    "lerp",
    "addcmul",
    "addcdiv",
    "where",
]
_BINARY = [
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
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
]
_NO_INPLACE = {"isnan", "isinf", "isfinite", "maximum", "minimum", "where"}

for name in _UNARY + _BINARY:
    register([getattr(torch, name, None), getattr(T, name, None)], name)
    if name not in _NO_INPLACE:
        inplace = name + "_"
        register([getattr(T, inplace, None), getattr(torch, inplace, None)], inplace, out_ok=False)

# Aliases.
register([torch.absolute, T.absolute], "abs")
register([T.absolute_], "abs_", out_ok=False)
register([torch.negative, T.negative], "neg")
register([T.negative_], "neg_", out_ok=False)
register([torch.special.expit, F.sigmoid if hasattr(F, "sigmoid") else None], "sigmoid")
register([torch.special.erf], "erf")
register([torch.special.expm1], "expm1")
register([torch.special.log1p], "log1p")
register([F.tanh if hasattr(F, "tanh") else None], "tanh")
register([torch.clip, T.clip], "clamp")
register([T.clip_], "clamp_", out_ok=False)
register([torch.true_divide, T.true_divide], "div")
register([torch.multiply, T.multiply], "mul")
register([torch.subtract, T.subtract], "sub")
register([torch.greater, T.greater], "gt")
register([torch.greater_equal, T.greater_equal], "ge")
register([torch.less, T.less], "lt")
register([torch.less_equal, T.less_equal], "le")
register([torch.not_equal, T.not_equal], "ne")
register([torch.special.round], "round")
register([torch.fix, T.fix], "trunc")
register([torch.clamp_min, T.clamp_min], "clamp", lambda a, m: ((a, m, None), {}))
register([torch.clamp_max, T.clamp_max], "clamp", lambda a, m: ((a, None, m), {}))

# Operators.
register(T.__add__, "add")
register(T.__radd__, "add", swap)
register(T.__iadd__, "add_")
register(T.__sub__, "sub")
register(T.__rsub__, "sub", swap)
register(torch.rsub, "sub", lambda a, b, alpha=1: ((b, a), {"alpha": alpha}))
register(T.__isub__, "sub_")
register(T.__mul__, "mul")
register(T.__rmul__, "mul", swap)
register(T.__imul__, "mul_")
register([T.__truediv__, T.__div__], "div")
register([T.__rtruediv__, T.__rdiv__], "div", swap)
register([T.__itruediv__, T.__idiv__], "div_")
register(T.__floordiv__, "floor_divide")
register(T.__rfloordiv__, "floor_divide", swap)
register(T.__ifloordiv__, "floor_divide_")
register(T.__mod__, "remainder")
register(T.__rmod__, "remainder", swap)
register(T.__imod__, "remainder_")
register(T.__pow__, "pow")
register(T.__rpow__, "pow", swap)
register(T.__ipow__, "pow_")
register(T.__and__, "bitwise_and")
register(T.__rand__, "bitwise_and", swap)
register(T.__iand__, "bitwise_and_")
register(T.__or__, "bitwise_or")
register(T.__ror__, "bitwise_or", swap)
register(T.__ior__, "bitwise_or_")
register(T.__xor__, "bitwise_xor")
register(T.__rxor__, "bitwise_xor", swap)
register(T.__ixor__, "bitwise_xor_")
register(T.__invert__, "bitwise_not")
register(T.__neg__, "neg")
register(T.__abs__, "abs")
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(getattr(T, f"__{_n}__"), _n)


def _pos(tr, args, kwargs):
    (a,) = args
    if a.dtype == torch.bool:
        raise TypeError("The `+` operator, on a bool tensor is not supported.")
    return a


register_handler([T.__pos__, torch.positive, T.positive], _pos)


def _is_floating_point(tr, args, kwargs):
    """torch.is_floating_point(x): metadata, concrete while tracing (torch's own function
    refuses anything that is not a torch.Tensor)."""
    (a,) = args
    return a.dtype.is_floating_point


register_handler([torch.is_floating_point], _is_floating_point)


# Activations.
def _act(op, inplace_op, params):
    """F.<act>(x, *params, inplace=False)."""

    def handler(tr, args, kwargs):
        kwargs = dict(kwargs)
        inplace = kwargs.pop("inplace", False)
        n = len(params)
        if len(args) > 1 + n:
            inplace = args[1 + n]
            args = args[: 1 + n]
        return record(inplace_op if inplace else op, f"torch.nn.functional.{op}", args, kwargs)

    return handler


register_handler(F.relu, _act("relu", "relu_", []))
register_handler(F.silu, _act("silu", "silu_", []))
register_handler(F.leaky_relu, _act("leaky_relu", "leaky_relu_", ["negative_slope"]))
register_handler(F.elu, _act("elu", "elu_", ["alpha"]))
register_handler(F.hardtanh, _act("hardtanh", "hardtanh_", ["min_val", "max_val"]))
register(F.relu6, "hardtanh", lambda a, inplace=False: ((a, 0.0, 6.0), {}))
register([F.relu_], "relu_")
register([F.leaky_relu_], "leaky_relu_")
register([F.elu_], "elu_")
register([F.hardtanh_], "hardtanh_")
register(F.gelu, "gelu")
register(F.softplus, "softplus")
register(
    [torch.nn.functional.dropout],
    "dropout",
    lambda a, p=0.5, training=True, inplace=False: (
        ((a, p, training), {}) if not inplace else _no_inplace_dropout()
    ),
)
register([torch.dropout], "dropout", lambda a, p, train: ((a, p, train), {}))


def _no_inplace_dropout():
    raise NotImplementedError("keraunos: F.dropout(inplace=True) is not supported yet")


def _clone(a, memory_format=torch.preserve_format):
    if memory_format is not torch.preserve_format:
        raise NotImplementedError("keraunos: clone(memory_format=...) is not supported yet")
    return (a,), {}


register([torch.clone, T.clone], "clone", _clone, out_ok=False)


# Casts.
def _to(a, *args, **kwargs):
    """Tensor.to(dtype) / to(device) / to(device, dtype) / to(other) / to(dtype=, device=)."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    copy = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    if kwargs.pop("memory_format", torch.preserve_format) is not torch.preserve_format:
        raise NotImplementedError("keraunos: Tensor.to(memory_format=...) is not supported yet")
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    rest = list(args)
    if (
        rest
        and hasattr(rest[0], "dtype")
        and hasattr(rest[0], "device")
        and not isinstance(rest[0], torch.dtype)
    ):
        other = rest.pop(0)
        device, dtype = other.device, other.dtype
    while rest:
        x = rest.pop(0)
        if isinstance(x, torch.dtype):
            dtype = x
        elif isinstance(x, (str, torch.device, int)):
            device = torch.device(x) if not isinstance(x, int) else torch.device("cuda", x)
        elif isinstance(x, bool):
            copy = x if rest == [] else copy
        else:
            raise TypeError(f"to() received an invalid combination of arguments: {x!r}")
    return (a,), {"device": device, "dtype": dtype, "copy": copy}


register(T.to, "to", _to, out_ok=False)
# type_as is to(other.options()): other's dtype and device (a move between devices raises).
register(
    T.type_as,
    "to",
    lambda a, other: ((a,), {"device": other.device, "dtype": other.dtype}),
    out_ok=False,
)
for _name, _dt in [
    ("float", torch.float32),
    ("double", torch.float64),
    ("half", torch.float16),
    ("bfloat16", torch.bfloat16),
    ("long", torch.int64),
    ("int", torch.int32),
    ("short", torch.int16),
    ("char", torch.int8),
    ("byte", torch.uint8),
    ("bool", torch.bool),
]:
    register(getattr(T, _name), "to", lambda a, _d=_dt: ((a,), {"dtype": _d}), out_ok=False)


def _type(a, dtype=None, non_blocking=False, **kw):
    if dtype is None:
        raise NotImplementedError(
            "keraunos: Tensor.type() without a dtype returns a string; not supported"
        )
    if isinstance(dtype, str):
        raise NotImplementedError(
            "keraunos: Tensor.type('...') with a type string is not supported"
        )
    return (a,), {"dtype": dtype}


register(T.type, "to", _type, out_ok=False)

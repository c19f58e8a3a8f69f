"""The prims run through torch. Generated programs of prim-level traces call these (the tests
run every decomposition this way against eager). Prims are strict: elementwise results keep
their operands' dtype, as the C++ meta functions say."""

import operator

import torch


def _dt(*xs):
    for x in xs:
        if isinstance(x, torch.Tensor):
            return x.dtype
    raise AssertionError("prim without a tensor operand")


def _keep(op):
    def f(a, b):
        d = _dt(a, b)
        if not isinstance(a, torch.Tensor):
            a = torch.scalar_tensor(a, dtype=d, device=b.device)
        return op(a, b).to(d)

    return f


add = _keep(operator.add)
sub = _keep(operator.sub)
mul = _keep(operator.mul)
maximum = _keep(lambda a, b: torch.maximum(a, torch.as_tensor(b, dtype=a.dtype, device=a.device)))
minimum = _keep(lambda a, b: torch.minimum(a, torch.as_tensor(b, dtype=a.dtype, device=a.device)))
floor_divide = _keep(operator.floordiv)
remainder = _keep(operator.mod)
fmod = _keep(torch.fmod)
bitwise_and = _keep(operator.and_)
bitwise_or = _keep(operator.or_)
bitwise_xor = _keep(operator.xor)


def div(a, b):
    d = _dt(a, b)
    if d.is_floating_point:
        return _keep(operator.truediv)(a, b)
    return _keep(lambda x, y: torch.div(x, y, rounding_mode="trunc"))(a, b)


def pow(a, b):
    d = _dt(a, b)
    if not isinstance(a, torch.Tensor):
        a = torch.scalar_tensor(a, dtype=d, device=b.device)
    return torch.pow(a, b).to(d)


def _cmp(op):
    def f(a, b):
        if not isinstance(a, torch.Tensor):
            a = torch.scalar_tensor(a, dtype=b.dtype, device=b.device)
        return op(a, b)

    return f


eq = _cmp(operator.eq)
ne = _cmp(operator.ne)
lt = _cmp(operator.lt)
le = _cmp(operator.le)
gt = _cmp(operator.gt)
ge = _cmp(operator.ge)
logical_and = _cmp(torch.logical_and)
logical_or = _cmp(torch.logical_or)
logical_xor = _cmp(torch.logical_xor)


def where(c, a, b):
    d = _dt(a, b)
    return torch.where(c, a, b).to(d)


def convert_element_type(a, dtype):
    return a.to(dtype)


def broadcast_in_dim(a, shape, broadcast_dims):
    v = a
    for i in range(len(shape)):
        if i not in broadcast_dims:
            v = v.unsqueeze(i)
    return v.expand(shape)


def reshape(a, shape):
    return a.reshape(shape).clone(memory_format=torch.contiguous_format)


def reshape_view(a, shape):
    # Where the program cannot tell a view from a copy (fused_program.cpp: view_reshapes); the
    # result is contiguous either way, as the kernels that read it expect.
    return a.view(shape) if a.is_contiguous() else a.reshape(shape).contiguous()


def permute(a, dims):
    return a.permute(dims)


def slice(a, start, end, strides):
    idx = tuple(builtins_slice(s, e, st) for s, e, st in zip(start, end, strides))
    return a[idx]


builtins_slice = __builtins__["slice"] if isinstance(__builtins__, dict) else __builtins__.slice


def squeeze(a, dims):
    return a.squeeze(tuple(dims)) if dims else a


def diagonal(a, offset, dim1, dim2):
    return torch.diagonal(a, offset, dim1, dim2)


def cat(tensors, dim):
    return torch.cat(tensors, dim)


def take(a, index, dim, error=0):
    out = torch.index_select(a, dim, index.reshape(-1))
    return out.reshape(a.shape[:dim] + index.shape + a.shape[dim + 1 :])


def gather(a, dim, index, error=3):
    return torch.gather(a, dim, index)


def index_put(a, indices, values, accumulate):
    return torch.index_put(a, tuple(indices), values, accumulate)


def index_copy(a, dim, index, src):
    return torch.index_copy(a, dim, index, src)


def _red(fn):
    def f(a, dims):
        if not dims:
            return a.clone()
        return fn(a, dims)

    return f


sum = _red(lambda a, d: torch.sum(a, d).to(a.dtype))
amax = _red(torch.amax)
amin = _red(torch.amin)


def prod(a, dims):
    out = a
    for d in sorted(dims, reverse=True):
        out = torch.prod(out, d)
    return out.to(a.dtype) if dims else a.clone()


def var(a, dims, correction):
    return torch.var(a, dims, correction=correction)


def argmax(a, dim):
    return torch.argmax(a, dim)


def argmin(a, dim):
    return torch.argmin(a, dim)


def cumsum(a, dim):
    return torch.cumsum(a, dim).to(a.dtype)


def full(shape, value, *, dtype, device):
    return torch.full(shape, value, dtype=dtype, device=device)


def iota(length, start, step, *, dtype, device):
    return torch.arange(start, start + length * step, step, dtype=dtype, device=device)[:length]


def uniform(shape, low, high, *, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device).uniform_(low, high)


def normal(shape, mean, std, *, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device).normal_(mean, std)


def as_strided(storage, size, stride, offset):
    return torch.as_strided(storage, size, stride, storage.storage_offset() + offset).clone()


def as_strided_scatter(storage, src, size, stride, offset):
    out = storage.clone()
    torch.as_strided(out, size, stride, out.storage_offset() + offset).copy_(src)
    return out

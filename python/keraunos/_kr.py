"""Helpers the torch executor's generated programs call where torch has no one-to-one
function for a keraunos op (reflected operands, canonical argument orders)."""

import contextlib
import functools
import operator
import sys

import torch

from . import _C

_F = torch.nn.functional


def add(a, b, *, alpha=1):
    return operator.add(a, b) if alpha == 1 else torch.add(a, b, alpha=alpha)


def sub(a, b, *, alpha=1):
    return operator.sub(a, b) if alpha == 1 else torch.sub(a, b, alpha=alpha)


def div(a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return operator.truediv(a, b)
    if not isinstance(a, torch.Tensor):
        a = torch.scalar_tensor(
            a, dtype=torch.result_type(b, a) if isinstance(b, torch.Tensor) else None
        )
    return torch.div(a, b, rounding_mode=rounding_mode)


mul = operator.mul
floor_divide = operator.floordiv
remainder = operator.mod
pow = operator.pow
bitwise_and = operator.and_
bitwise_or = operator.or_
bitwise_xor = operator.xor
eq = operator.eq
ne = operator.ne
lt = operator.lt
le = operator.le
gt = operator.gt
ge = operator.ge


# torch.matmul of CPU tensors with its result in the CPU buffer pool
# (csrc/keraunos/python/cpu_pool.h); the program writer picks it for results of 64 KiB or more.
cpu_matmul = _C.cpu_matmul


def fmod(a, b):
    if not isinstance(a, torch.Tensor):
        a = torch.scalar_tensor(a, dtype=torch.result_type(b, a))
    return torch.fmod(a, b)


def to(a, *, device=None, dtype=None, copy=False):
    return a.to(device=device, dtype=dtype, copy=copy)


def silu_(a):
    return _F.silu(a, inplace=True)


def leaky_relu_(a, negative_slope=0.01):
    return _F.leaky_relu(a, negative_slope, inplace=True)


def elu_(a, alpha=1.0):
    return _F.elu(a, alpha, inplace=True)


def hardtanh_(a, min_val=-1.0, max_val=1.0):
    return _F.hardtanh(a, min_val, max_val, inplace=True)


def flat_storage(a, perm):
    """The elements of a dense tensor in storage order, as a 1-D tensor."""
    return a.permute(perm).reshape(-1)


def gather_strided(storage, size, stride, offset):
    """Elements of a 1-D storage value at offset + sum(i * stride): a view, never written."""
    return torch.as_strided(storage, size, stride, storage.storage_offset() + offset)


def batch_norm_functional(x, running_mean, running_var, weight, bias, momentum, eps):
    """F.batch_norm in training mode on copies of the running statistics: returns the output
    and the new statistics without writing the originals."""
    rm, rv = running_mean.clone(), running_var.clone()
    out = torch.nn.functional.batch_norm(x, rm, rv, weight, bias, True, momentum, eps)
    return out, rm, rv


def scatter_strided(storage, src, size, stride, offset):
    """A new 1-D storage value: `storage` with `src` written at offset + sum(i * stride)."""
    out = storage.clone()
    torch.as_strided(out, size, stride, out.storage_offset() + offset).copy_(src)
    return out


def restride(a, stride):
    """A copy of `a` with the given strides."""
    out = torch.empty_strided(a.shape, stride, dtype=a.dtype, device=a.device)
    return out.copy_(a)


def fallback(fid, name, inputs, outputs, no_grad=()):
    """A torch call with no op-table entry (keraunos.fallback). (`no_grad` tells autodiff which
    inputs the call's backward gives no gradient.)"""
    from .fallback import run

    return run(fid, name, inputs, outputs)


def check_index(index, size, dim, error):
    """Before a CPU kernel gathers by `index`: the error eager's op raises for an index outside
    [0, size). `error` names the op (prims.def, prim_take)."""
    if index.numel() == 0:
        return
    lo, hi = torch.aminmax(index)
    lo, hi = int(lo), int(hi)
    if lo >= 0 and hi < size:
        return
    bad = lo if lo < 0 else hi
    if error == 0:
        raise RuntimeError(f"INDICES element is out of DATA bounds, id={bad} axis_dim={size}")
    if error == 1:
        raise IndexError("index out of range in self")
    if error == 2:
        raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")
    if error == 4:
        raise IndexError(f"Target {bad} is out of bounds.")
    raise RuntimeError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def seed(device):
    """The seed of a kernel's random draws (prims.def, prim_seed): drawn from torch's generator
    of `device`, so torch.manual_seed makes a program's draws reproducible and each call draws
    new ones (on CUDA without a host synchronization)."""
    return torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64, device=device)


def manual_seed(seed):
    torch.manual_seed(seed)


def set_rng_state(state):
    torch.set_rng_state(state)


def _vjp_leaves(a, want, leaves, seen, grad=True):
    """`a` with the tensors at positions `want` (counted in order) replaced by detached leaves
    (that require grad when `grad`), appended to `leaves`. (A module function: a recursive
    closure would make a reference cycle that keeps the leaves, and the memory they share
    with the program's tensors, until the cyclic garbage collector runs.)"""
    if isinstance(a, torch.Tensor):
        i = seen[0]
        seen[0] += 1
        if i in want:
            t = a.detach().requires_grad_(grad)
            leaves.append(t)
            return t
        return a
    if isinstance(a, (list, tuple)):
        return type(a)(_vjp_leaves(e, want, leaves, seen, grad) for e in a)
    return a


def _flat_tensors(a, out):
    if isinstance(a, torch.Tensor):
        out.append(a)
    elif isinstance(a, (list, tuple)):
        for e in a:
            _flat_tensors(e, out)
    return out


def _torch_call(op, args):
    return fallback(*args) if op == "torch_fallback" else _op_call(op)(args)


def _tensors(out):
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [o for o in outs if isinstance(o, torch.Tensor)]


def torch_vjp_record(op, args, wrt):
    """An op that runs through torch, in the forward of a program autograd records (prims
    torch_vjp_record): its tensor outputs (detached), its float outputs with their autograd
    graph, and the graph's leaves (the tensors of `args` at positions `wrt`). torch_vjp hands
    the graph to torch.autograd.grad in the backward.

    Where saved-tensor hooks are active (torch.utils.checkpoint, save_on_cpu), the saved
    tensors may come back as copies without their graph: nothing is recorded (the leaves do
    not require grad) and torch_vjp runs the op again instead."""
    record = torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    leaves = []
    args = _vjp_leaves(list(args), set(wrt), leaves, [0], record)
    with torch.enable_grad() if record else contextlib.nullcontext():
        outs = _tensors(_torch_call(op, args))
    return [
        *(o.detach() for o in outs),
        *(o for o in outs if o.is_floating_point()),
        *leaves,
    ]


def torch_vjp(op, args, graph, grads, wrt):
    """The backward of an op that runs through torch (prims torch_vjp): the gradients of the
    tensors of `args` (in order) at positions `wrt`, the leaves torch_vjp_record made, given
    `grads`, the gradients of its float outputs `graph`. Where the forward recorded no graph,
    the op runs again on `args` under autograd."""
    leaves = [t for i, t in enumerate(_flat_tensors(args, [])) if i in wrt]
    if not all(t.requires_grad and t.is_leaf for t in leaves):
        leaves = []
        args = _vjp_leaves(list(args), set(wrt), leaves, [0])
        with torch.enable_grad():
            graph = [o for o in _tensors(_torch_call(op, args)) if o.is_floating_point()]
    pairs = [(o, g) for o, g in zip(graph, grads) if o.requires_grad]
    gs = [None] * len(leaves)
    if pairs:
        gs = torch.autograd.grad(
            [o for o, _ in pairs],
            leaves,
            [g for _, g in pairs],
            allow_unused=True,
            retain_graph=torch._C._autograd._get_current_graph_task_keep_graph(),
        )
    return [torch.zeros_like(t) if g is None else g for g, t in zip(gs, leaves)]


@functools.cache
def _op_call(op):
    """A callable taking an op's canonical arguments (the op table's schema order) and calling
    its torch function, with keyword-only arguments by name."""
    info = _C.op_info(op)
    fn = info["torch_fn"]
    parts = fn.split(".")
    target = torch if parts[0] == "torch" else sys.modules[__name__]
    for p in parts[1:]:
        target = getattr(target, p)
    params = info["schema"][info["schema"].index("(") + 1 : info["schema"].rindex(") ->")]
    names, npos = [], None
    depth, cur = 0, ""
    for ch in params + ",":
        if ch == "," and depth == 0:
            cur = cur.strip()
            if cur == "*":
                npos = len(names)
            elif cur:
                names.append(cur.split("=")[0].split()[-1])
            cur = ""
            continue
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        cur += ch
    npos = len(names) if npos is None else npos

    def call(args):
        return target(*args[:npos], **dict(zip(names[npos:], args[npos:])))

    return call

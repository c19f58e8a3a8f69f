"""Torch fallback: a torch call with no entry in the mapping table runs through torch.

While tracing, the call runs once on fake tensors (torch's FakeTensorMode) that have the
proxies' dtypes, devices, shapes, strides and storage sharing. That gives

- the outputs' metadata (the C++ symbol `torch_fallback` makes proxies from it);
- which arguments the call writes (the aten ops it dispatches to, with their schemas' alias
  annotations): the symbol takes copies of them and returns their new contents, which the
  frontend writes back with `copy_`, so functionalization sees an ordinary write;
- which outputs are views of an input (they share its fake storage): recorded as
  `as_strided` views of that input, so later writes through them reach the input as in eager;
- whether it draws random numbers (`nondeterministic_seeded` aten ops): then the symbol is
  ordered with every other random op and never merged or dropped.

The call's non-tensor arguments stay in a closure in `_FALLBACKS`; the trace names it by id.
What cannot be right is refused by name: outputs whose shape depends on tensor values
(`nonzero`, `x[mask]`, `unique`), values read back into Python (`.item()`), calls that resize
or re-point a tensor, and writes into memory that another argument of the same call reads.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading

import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from .tracer import Proxy, callable_name, record, where

_fake_log = logging.getLogger("torch._subclasses.fake_tensor")

# id -> the runtime closure (`_kr.fallback` calls it with the input tensors).
_FALLBACKS: dict[int, object] = {}
_ids = itertools.count()
_lock = threading.Lock()

# Calls that act outside tensor values: running them on fake tensors at trace time would
# silently drop their effect.
_REFUSED_NAMES = (
    "backward",
    "register_hook",
    "register_post_accumulate_grad_hook",
    "retain_grad",
    "requires_grad_",
    "resize_",
    "resize_as_",
    "set_",
    "share_memory_",
    "record_stream",
    "untyped_storage",
    "storage",
    "data_ptr",
    "tolist",
    "item",
    "numpy",
    "pin_memory",
)


class _Watch(TorchDispatchMode):
    """Sees the aten ops a call dispatches to: which storages they write, whether they draw
    random numbers."""

    def __init__(self):
        super().__init__()
        self.written: set = set()
        # Written by an op that changes values (not only metadata, as t_ or squeeze_ do).
        self.data_written: set = set()
        self.random = False
        self.inplace_view = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            v = args[i] if i < len(args) else kwargs.get(a.name)
            for t in pytree.tree_leaves(v):
                if isinstance(t, torch.Tensor):
                    self.written.add(StorageWeakRef(t.untyped_storage()))
                    if torch.Tag.inplace_view not in func.tags:
                        self.data_written.add(StorageWeakRef(t.untyped_storage()))
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random = True
        if torch.Tag.inplace_view in func.tags:
            self.inplace_view = True  # squeeze_, t_, as_strided_: the tensor's metadata changes
        return func(*args, **kwargs)


def _fake_mode(tr):
    mode = getattr(tr, "_fake_mode", None)
    if mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=False)
        tr._fake_mode = mode
    return mode


def _storage_extent(p) -> int:
    if any(s == 0 for s in p.shape):
        return p.storage_offset
    return p.storage_offset + 1 + sum((n - 1) * st for n, st in zip(p.shape, p.strides))


def _fakes(proxies, requires_grad=()):
    """Fake tensors with the proxies' metadata; proxies of one storage share a fake storage
    (the float storage of a proxy whose index is in requires_grad is a leaf that requires
    grad)."""
    groups: dict[tuple, int] = {}
    for p in proxies:
        key = (p.storage_id, p.dtype) if p.storage_id >= 0 else (id(p), p.dtype)
        groups[key] = max(groups.get(key, 0), _storage_extent(p))
    from ._dtypes import KR_TO_TORCH, to_torch_device

    bases = {}
    fakes = []
    grad_keys = {
        (p.storage_id, p.dtype) if p.storage_id >= 0 else (id(p), p.dtype)
        for i, p in enumerate(proxies)
        if i in requires_grad
    }
    for p in proxies:
        key = (p.storage_id, p.dtype) if p.storage_id >= 0 else (id(p), p.dtype)
        base = bases.get(key)
        if base is None:
            base = torch.empty(
                groups[key], dtype=KR_TO_TORCH[p.dtype], device=to_torch_device(p.device)
            )
            if key in grad_keys and base.is_floating_point():
                base.requires_grad_(True)
            bases[key] = base
        fakes.append(base.as_strided(list(p.shape), list(p.strides), p.storage_offset))
    return fakes


def _refuse(name, why):
    e = NotImplementedError(f"keraunos: {name} {why} (at {where()})")
    e._kr_final = True
    raise e


def _dense(t) -> bool:
    """Offset 0 and its elements fill memory without gaps or overlaps (any dim order)."""
    if t.storage_offset() != 0:
        return False
    expected = 1
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1)
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def call(tr, func, args, kwargs, autocast=(), closure_of=None, random=False, enable_grad=False):
    """Records `func(*args, **kwargs)` as a torch fallback symbol and returns its outputs
    (proxies where they are tensors). `autocast`: the autocast regions ((device_type, dtype,
    cache_enabled), ...) the call runs in, while tracing and in the program. `enable_grad`: it
    runs in a torch.enable_grad() region (one inside a call made under no_grad). `closure_of`: a
    function whose closures (and theirs) may hold traced tensors `func` reads (a function
    given to torch.vmap): they become inputs too."""
    from .tracer import user_function_modes

    captured = _captured_proxies(closure_of) if closure_of is not None else []
    modes = user_function_modes()
    # Fake tensors are tensor subclasses: with the tracer's mode on, their methods would be
    # traced too. The user's own torch function modes (say transformers' TransformGetItemToIndex
    # around a vmap) stay, in the program too.
    with _only_modes(modes):
        return _call(tr, func, args, kwargs, autocast, captured, modes, random, enable_grad)


@contextlib.contextmanager
def _only_modes(modes):
    """Runs with exactly `modes` on the torch function mode stack (the tracer's removed)."""
    saved = []
    while torch._C._len_torch_function_stack() > 0:
        saved.append(torch._C._pop_torch_function_stack())
    try:
        for m in modes:
            torch._C._push_on_torch_function_stack(m)
        yield
    finally:
        while torch._C._len_torch_function_stack() > 0:
            torch._C._pop_torch_function_stack()
        for m in reversed(saved):
            torch._C._push_on_torch_function_stack(m)


def _captured_proxies(fn, seen=None):
    """(cell, proxy) for every traced tensor held by a closure cell of `fn`, of the functions
    its cells hold, and so on (tuples, lists and dicts of functions included)."""
    seen = set() if seen is None else seen
    out = []

    def visit(obj, depth):
        if depth > 8 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            for a in (obj.func, *obj.args, *obj.keywords.values()):
                if isinstance(a, Proxy):
                    _refuse(callable_name(fn), "reads a traced tensor bound by functools.partial")
                visit(a, depth + 1)
            return
        if isinstance(obj, (tuple, list)):
            for e in obj:
                visit(e, depth + 1)
            return
        if isinstance(obj, dict):
            for e in obj.values():
                visit(e, depth + 1)
            return
        f = getattr(obj, "__func__", obj)  # bound methods
        for cell in getattr(f, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(v, Proxy):
                out.append((cell, v))
            else:
                visit(v, depth + 1)
        wrapped = getattr(f, "__wrapped__", None)
        if wrapped is not None:
            visit(wrapped, depth + 1)

    visit(fn, 0)
    return out


@contextlib.contextmanager
def _cells_holding(captured, values):
    old = [cell.cell_contents for cell, _ in captured]
    try:
        for (cell, _), v in zip(captured, values):
            cell.cell_contents = v
        yield
    finally:
        for (cell, _), v in zip(captured, old):
            cell.cell_contents = v


def _contiguous_strides(shape):
    strides, n = [], 1
    for s in reversed(shape):
        strides.append(n)
        n *= max(s, 1)
    return strides[::-1]


def _call(tr, func, args, kwargs, autocast, captured, modes, random, enable_grad):
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    name = callable_name(func)
    short = name.rsplit(".", 1)[-1]
    if short in _REFUSED_NAMES:
        _refuse(name, "is not supported inside a jitted function: it acts outside tensor values")

    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensor_pos = []
    proxies = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and not isinstance(leaf, Proxy):
            if leaf.layout is not torch.strided or leaf.is_complex():
                _refuse(name, f"with a {leaf.layout} {leaf.dtype} tensor argument is not supported")
            leaf = tr.lift(leaf)
            leaves[i] = leaf
        if isinstance(leaf, Proxy):
            tensor_pos.append(i)
            proxies.append(leaf)
        elif isinstance(leaf, torch.Generator):
            _refuse(
                name,
                "with generator= is not supported: jitted functions draw from "
                "torch's default generator",
            )

    n_args = len(proxies)
    proxies.extend(p for _, p in captured)
    mode = _fake_mode(tr)
    watch = _Watch()
    cps = [p._p for p in proxies]
    log_level = _fake_log.level
    _fake_log.setLevel(logging.CRITICAL)  # it logs every error it raises; we re-raise them
    data_dependent = False
    try:
        with mode:
            fakes = _fakes(cps)
            before = [(tuple(f.shape), f.stride(), f.storage_offset()) for f in fakes]
            fake_leaves = list(leaves)
            for i, f in zip(tensor_pos, fakes):
                fake_leaves[i] = f
            fa, fk = pytree.tree_unflatten(fake_leaves, spec)
            with watch, _cells_holding(captured, fakes[n_args:]):
                out = func(*fa, **fk)
    except (DataDependentOutputException, DynamicOutputShapeException):
        data_dependent = True
    except UnsupportedOperatorException as e:
        raise NotImplementedError(
            f"keraunos: {name} is not supported: {e} has no shape function (at {where()})"
        ) from None
    except Exception as e:
        # Eager's own error for these arguments: the same type, naming the call and the line.
        if e.args and isinstance(e.args[0], str):
            e.args = (f"{e.args[0]} (in {name} at {where()})", *e.args[1:])
        raise
    finally:
        _fake_log.setLevel(log_level)
    if data_dependent:
        return _point(name, func, args, kwargs, captured, autocast)
    storages = [StorageWeakRef(f.untyped_storage()) for f in fakes]
    after = [(tuple(f.shape), f.stride(), f.storage_offset()) for f in fakes]

    # Which inputs the call writes.
    mutated = [i for i, s in enumerate(storages) if s in watch.written]
    if (
        watch.inplace_view
        and len(mutated) == 1
        and mutated[0] < n_args
        and storages[mutated[0]] not in watch.data_written
        and out is fakes[mutated[0]]
    ):
        # Only the tensor's metadata changed (t_, squeeze_, as_strided_).
        return _inplace_view(tr, name, proxies[mutated[0]], after[mutated[0]])
    for i in mutated:
        if before[i] != after[i]:
            if not watch.inplace_view and name.endswith("_") and before[i][0] != after[i][0]:
                # An in-place op whose result does not fit its input: eager raises here (fake
                # tensors resize instead).
                raise RuntimeError(
                    f"output with shape {list(before[i][0])} doesn't match the broadcast shape "
                    f"{list(after[i][0])} (in {name} at {where()})"
                )
            _refuse(name, "resizes or re-strides a tensor in place; this is not supported")
    seen_storage = {}
    for i, s in enumerate(storages):
        seen_storage.setdefault(s, []).append(i)
    first_of = {}
    for i in mutated:
        if len(seen_storage[storages[i]]) > 1:
            # The copy the call writes would not be seen by the other argument's view.
            _refuse(
                name,
                "writes memory that another of its tensor arguments reads; this is not supported",
            )
        first_of[storages[i]] = i
    for s, idx in seen_storage.items():
        first_of.setdefault(s, idx[0])

    # Outputs: fresh tensors, views of inputs, or Python values.
    out_leaves, out_spec = pytree.tree_flatten(out)
    kinds = []  # ("fresh", k) | ("view", input index) | ("alias", earlier leaf) | ("const", v)
    fresh_meta = []
    fresh_dense = []
    out_storages = {}
    from ._dtypes import to_kr_dtype

    for j, o in enumerate(out_leaves):
        if isinstance(o, torch.Tensor):
            if o.layout is not torch.strided or o.is_complex():
                _refuse(name, f"returns a {o.layout} {o.dtype} tensor; this is not supported")
            to_kr_dtype(o.dtype, f"{name} output dtype")
            s = StorageWeakRef(o.untyped_storage())
            same = next((i for i, f in enumerate(fakes) if o is f), None)
            if same is not None:
                kinds.append(("self", same))  # the argument itself (an in-place op's result)
            elif s in first_of:
                if o.dtype != fakes[first_of[s]].dtype:
                    _refuse(
                        name,
                        "returns a view with another dtype (reinterpreting bits); "
                        "this is not supported",
                    )
                kinds.append(("view", first_of[s]))
            elif s in out_storages:
                kinds.append(("alias", out_storages[s]))
            else:
                out_storages[s] = j
                dense = _dense(o)
                strides = list(o.stride()) if dense else _contiguous_strides(o.shape)
                kinds.append(("fresh", len(fresh_meta)))
                fresh_meta.append([o.dtype, o.device, list(o.shape), strides])
                fresh_dense.append(dense)
        elif isinstance(o, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return _point(name, func, args, kwargs, captured, autocast)
        else:
            kinds.append(("const", o))

    if enable_grad and (mutated or any(k not in ("fresh", "const") for k, _ in kinds)):
        _refuse(
            name,
            "writes or returns a view of a tensor inside torch.enable_grad() in a call made "
            "under no_grad; this is not supported yet",
        )
    # The symbol: fresh outputs, then the new contents of the written inputs.
    meta = list(fresh_meta)
    for i in mutated:
        f = fakes[i]
        meta.append([f.dtype, f.device, list(f.shape), list(f.stride())])
    call_leaves = [None if i in set(tensor_pos) else v for i, v in enumerate(leaves)]
    fid = _register(
        func,
        call_leaves,
        spec,
        tensor_pos,
        mutated,
        kinds,
        len(fresh_meta),
        autocast,
        captured,
        modes,
        enable_grad,
    )
    op = "torch_fallback_random" if watch.random or random else "torch_fallback"
    call_proxies = list(proxies)
    probe = None
    if fresh_meta and tr.needs_grad and torch.is_grad_enabled():
        written = {k for i in mutated for k in seen_storage[storages[i]]}
        # Program inputs that do not require grad do not here either (native_batch_norm's
        # running statistics cannot); values computed in the program may.
        grad_args = [
            i
            for i, px in enumerate(proxies)
            if i not in written and (id(px) not in tr.input_index or px._p.requires_grad)
        ]
        probe = _grad_probe(mode, cps, grad_args, leaves, tensor_pos, spec, func, captured, n_args)
    no_grad = []
    if probe is not None:
        if any(probe[0]) and len(probe[1]) == len(probe[2]):
            # No argument gets a gradient, yet the outputs require grad (norm with p=0): the
            # arguments stay attached and autodiff gives them no gradient through the call.
            no_grad = list(probe[1])
        else:
            # Arguments eager's backward gives no gradient (hinge_embedding_loss's target)
            # are passed detached: their .grad stays None, as in eager.
            for i in probe[1]:
                call_proxies[i] = record("detach", "torch.Tensor.detach", (proxies[i],), {})
    args = (fid, name, call_proxies, meta) + ((no_grad,) if no_grad else ())
    res = record(op, name, args, {}) if meta else ()
    res = list(res)
    fresh_out = res[: len(fresh_meta)]
    if probe is not None:
        # Outputs that eager never makes require grad (native_layer_norm's mean and rstd)
        # are detached: autograd must not see a gradient path through them.
        for (kind, v), o, d in zip(kinds, out_leaves, probe[0]):
            if kind == "fresh" and not d and o.is_floating_point():
                fresh_out[v] = record("detach", "torch.Tensor.detach", (fresh_out[v],), {})
    for i, new in zip(mutated, res[len(fresh_meta) :]):
        record("copy_", name, (proxies[i], new), {})

    # The result, with proxies in place of the fake tensors.
    result = []
    for j, (kind, v) in enumerate(kinds):
        if kind == "fresh":
            result.append(fresh_out[v])
        elif kind == "self":
            result.append(proxies[v])
        elif kind == "const":
            result.append(v)
        else:
            o = out_leaves[j]
            base = proxies[v] if kind == "view" else result[v]
            result.append(
                record(
                    "as_strided",
                    name,
                    (base, list(o.shape), list(o.stride()), o.storage_offset()),
                    {},
                )
            )
    return pytree.tree_unflatten(result, out_spec)


def _grad_probe(mode, cps, grad_args, leaves, tensor_pos, spec, func, captured, n_args):
    """Runs the call on fake tensors whose float arguments grad_args (indices into cps) require
    grad: (per output leaf, whether eager makes it require grad; the indices of grad_args that
    eager's backward gives no gradient; the indices of grad_args that require grad), or None
    when that cannot be learned."""
    log_level = _fake_log.level
    _fake_log.setLevel(logging.CRITICAL)
    try:
        with mode:
            fakes = _fakes(cps, requires_grad=set(grad_args))
            fake_leaves = list(leaves)
            for i, f in zip(tensor_pos, fakes):
                fake_leaves[i] = f
            fa, fk = pytree.tree_unflatten(fake_leaves, spec)
            with torch.enable_grad(), _cells_holding(captured, fakes[n_args:]):
                out = func(*fa, **fk)
                outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
                flags = [
                    isinstance(o, torch.Tensor) and o.requires_grad for o in pytree.tree_leaves(out)
                ]
                diff = [o for o in outs if o.requires_grad]
                wrt = [i for i in grad_args if fakes[i].requires_grad]
                unused = []
                if diff and wrt:
                    gs = torch.autograd.grad(
                        diff,
                        [fakes[i] for i in wrt],
                        [torch.ones_like(o) for o in diff],
                        allow_unused=True,
                    )
                    unused = [i for i, g in zip(wrt, gs) if g is None]
    except Exception:
        return None
    finally:
        _fake_log.setLevel(log_level)
    return flags, unused, wrt


def _inplace_view(tr, name, px, meta):
    """An in-place view op (t_, squeeze_, unsqueeze_, transpose_, as_strided_): the proxy now
    stands for the view with the new metadata; an input of the program gets that metadata
    when the program returns (jit.py), as eager's tensor does."""
    if tr.segmenter is not None or tr.needs_grad:
        _refuse(
            name,
            "changes a tensor's metadata in place; this is supported only in programs that "
            "autograd does not record and that have no data-dependent points",
        )
    size, stride, offset = meta
    v = record("as_strided", name, (px, list(size), list(stride), offset), {})
    px._p = v._p
    px._shape = None
    tr.proxies[v._p.name] = px
    index = tr.input_index.get(id(px))
    if index is not None:
        tr.metadata_updates[index] = (list(size), list(stride), offset)
    return px


def _point(name, func, args, kwargs, captured, autocast):
    """An op whose output's shape (or a returned number) depends on tensor values: the program
    is split there and torch runs the op on the tensors (split.py)."""
    from . import split

    if captured:
        _refuse(name, "has an output whose shape or value depends on tensor values")
    return split.point(f"{name} (its output depends on tensor values)", func, args, kwargs)


def _register(
    func, leaves, spec, tensor_pos, mutated, kinds, n_fresh, autocast, captured, modes, enable_grad
) -> int:
    """The closure the program calls: rebuilds the call from the runtime tensors, runs it on
    copies of the tensors it writes, returns its fresh outputs (with the traced strides) and
    the copies."""
    fresh_leaf = [j for j, (k, _) in enumerate(kinds) if k == "fresh"]
    mutated_set = set(mutated)

    def run(inputs, meta):
        if enable_grad:
            with torch.enable_grad():
                return run_(inputs, meta)
        return run_(inputs, meta)

    def run_(inputs, meta):
        inputs = list(inputs)
        for i in mutated_set:
            t = inputs[i]
            inputs[i] = torch.empty_strided(
                t.shape, t.stride(), dtype=t.dtype, device=t.device
            ).copy_(t)
        call_leaves = list(leaves)
        for i, t in zip(tensor_pos, inputs):
            call_leaves[i] = t
        a, k = pytree.tree_unflatten(call_leaves, spec)
        if autocast or captured or modes:
            with contextlib.ExitStack() as ctx:
                for device_type, dtype, cache in autocast:
                    ctx.enter_context(torch.autocast(device_type, dtype=dtype, cache_enabled=cache))
                for m in modes:
                    ctx.enter_context(m)
                ctx.enter_context(_cells_holding(captured, inputs[len(tensor_pos) :]))
                out = func(*a, **k)
        else:
            out = func(*a, **k)
        out_leaves = pytree.tree_leaves(out) if fresh_leaf else ()
        res = []
        for j, m in zip(fresh_leaf, meta[:n_fresh]):
            o = out_leaves[j]
            if list(o.stride()) != m[3] or o.storage_offset() != 0:
                o = torch.empty_strided(m[2], m[3], dtype=o.dtype, device=o.device).copy_(o)
            res.append(o)
        res.extend(inputs[i] for i in mutated)
        return res

    with _lock:
        fid = next(_ids)
        _FALLBACKS[fid] = run
    return fid


def run(fid, name, inputs, meta):
    """What the program's `_kr.fallback(id, name, inputs, outputs)` does."""
    return _FALLBACKS[fid](inputs, meta)

"""Data-dependent points in keraunos.jit: the program is split there, as Dynamo's graph breaks
split a frame, and the rest is traced for the value the tensors have.

A jitted function that asks for a tensor's value while it is traced (`if x.sum() > 0`,
`x.item()`, `int(n)`) or calls an op whose output shape depends on values (`nonzero`,
`masked_select`, `unique`, boolean-mask indexing) becomes a tree of programs:

    segment 0 --(value at the first point)--> segment 1 --(value at the second)--> ...

Each segment is a whole keraunos program (traced, functionalized, fused) that returns every
traced tensor the Python code can still reach at the point; the point itself runs eagerly on
those tensors (torch computes the bool, the item, the nonzero), and its result picks the next
segment. A result not seen before traces the function again from the start: the points already
passed in this call are answered with this call's results (no program runs twice), the next
segment is traced from there and compiled, and so on to the return. Results that are Python
values are guarded (each distinct value has its own next segment: a value that changes on
every call compiles on every call, and says so); results that are tensors become inputs of the
next segment, guarded on their shapes and strides. Where autograd records the call, each
segment is a compiled forward + backward pair (an autograd Function, as a whole program is):
the tensors one segment hands the next carry its backward, so autograd chains them.

What the Python code can reach at a point is what is alive: every proxy the trace made that
has not been freed (after a garbage collection, so that the same code always gives the same
set). Inside a torch.no_grad / autocast region, under a torch function mode pushed by the
function, or inside torch.vmap, a point is refused by name, as before.

`keraunos.explain(jf)` shows the tree: each point (where, what), each value seen, and the
programs."""

from __future__ import annotations

import gc
import math
import time
import warnings

import torch
import torch.utils._pytree as pytree

from .tracer import Proxy, current, user_location

# Distinct results at one point after which each new one also warns.
RECOMPILE_WARN = 8


class NeedsSplit(BaseException):
    """Raised by a point met while the function is traced the ordinary way (one program): the
    jitted function then becomes a SplitProgram. A BaseException, so that the user's
    `except Exception` does not swallow it."""


class SplitRefused(RuntimeError):
    pass


def _loc() -> str:
    file, line, _ = user_location()
    return f"{file}:{line}"


def point(what: str, func, args, kwargs=None):
    """A data-dependent point: `func(*args, **kwargs)` needs tensor values. Returns its result
    (with proxies for tensors) while a SplitProgram traces; raises NeedsSplit during an
    ordinary trace, and a named error where no split is possible."""
    tr = current()
    seg = getattr(tr, "segmenter", None) if tr is not None else None
    why = _why_not(tr)
    if why is not None:
        raise SplitRefused(
            f"keraunos: data-dependent control flow: {what} of a traced tensor at {_loc()} "
            f"{why}; keraunos splits a program at such points only outside these. Use "
            "torch.where, or compute the value outside the jitted function."
        )
    if seg is None:
        raise NeedsSplit(what)
    return seg.point(what, func, args, kwargs or {})


def _why_not(tr) -> str | None:
    if tr is None:
        return "outside tracing"
    if getattr(tr, "split_ok", None) is False:
        return "in a program that cannot be split (a torch.compile region)"
    if (
        torch.is_grad_enabled() != tr.grad_at_start
        or torch.is_inference_mode_enabled() != tr.inference_at_start
    ):
        return "inside a region that changes grad mode (torch.no_grad, enable_grad, inference_mode)"
    from .tracer import _autocast_state, user_function_modes

    if _autocast_state() != tr.autocast_at_start:
        return "inside a torch.autocast region"
    if len(user_function_modes()) != tr.modes_at_start:
        return "inside a torch function mode the function entered"
    if torch._C._functorch.maybe_current_level() is not None:
        return "inside a functorch transform (torch.vmap, grad)"
    return None


# ---- keys ----------------------------------------------------------------------------------


def _leaf_key(v):
    if isinstance(v, torch.Tensor):
        return (
            "tensor",
            tuple(v.shape),
            tuple(v.stride()),
            v.storage_offset(),
            v.dtype,
            v.device,
            v.requires_grad,
        )
    if isinstance(v, float):
        # NaN compares unequal to itself; -0.0 equals 0.0 but prints and divides differently.
        return ("float", "nan" if math.isnan(v) else v, math.copysign(1.0, v))
    return (type(v).__name__, v)


def result_key(res):
    leaves, spec = pytree.tree_flatten(res)
    return (str(spec), tuple(_leaf_key(v) for v in leaves))


def describe_key(key) -> str:
    spec, leaves = key
    parts = []
    for lk in leaves:
        parts.append(f"tensor{list(lk[1])}" if lk[0] == "tensor" else repr(lk[1]))
    return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"


# ---- the tree ------------------------------------------------------------------------------


class Point:
    """Where a segment ends: what is asked, and how to ask it of the segment's outputs."""

    def __init__(self, what, where, func, leaves, spec, positions):
        self.what = what
        self.where = where
        self.func = func
        self.leaves = leaves  # the call's pytree leaves, None where an output goes
        self.spec = spec
        self.positions = positions  # leaf index -> index into the segment's outputs

    def evaluate(self, outs):
        leaves = list(self.leaves)
        for i, j in self.positions.items():
            leaves[i] = outs[j]
        a, k = pytree.tree_unflatten(leaves, self.spec)
        return self.func(*a, **k)


class Node:
    """One segment: its program, and either the point it ends at (with the next segment for
    each result seen) or the function's return."""

    def __init__(self, program, lifted, traces, n_alive):
        self.program = program
        self.lifted = lifted
        self.traces = traces
        self.n_alive = n_alive
        self.point: Point | None = None
        self.children: dict = {}
        self.labels: dict = {}  # key -> how explain prints the value
        self.post = None  # final: the output tree (None: a single leaf)
        self.warned = False

    def run(self, env):
        """The segment's outputs: a list (the live tensors) for a segment that ends at a point;
        the program's result as it is for the last."""
        out = self.program(*env, *self.lifted)
        return out if self.point is None else list(out)


def next_env(outs, n_alive, res):
    return [*outs[:n_alive], *(v for v in pytree.tree_leaves(res) if isinstance(v, torch.Tensor))]


class SplitProgram:
    """What the dispatcher caches for a jitted function with data-dependent points (one input
    signature): the tree of segments. Called with the flat input tensors, like a program."""

    def __init__(self, jf, sids, template_args, template_kwargs):
        self.jf = jf
        self.sids = sids
        self.template = (template_args, template_kwargs)
        self.root: Node | None = None

    def __call__(self, *tensors):
        node = self.root
        env = list(tensors)
        path = []  # (node, key) passed in this call
        results = []
        envs = [env]
        while node is not None:
            outs = node.run(env)
            if node.point is None:
                return _finish(node, outs)
            res = node.point.evaluate(outs)
            key = result_key(res)
            path.append((node, key))
            results.append(res)
            env = next_env(outs, node.n_alive, res)
            envs.append(env)
            node = node.children.get(key)
        return Segmenter(self, tensors, path, results, envs).trace()

    def describe(self) -> str:
        lines = []

        def walk(node, depth, label):
            pad = "  " * depth
            if node.point is None:
                lines.append(f"{pad}{label}segment: runs to the return")
                return
            p = node.point
            lines.append(f"{pad}{label}segment: ends at {p.where}: {p.what}")
            for key, child in node.children.items():
                walk(child, depth + 1, f"= {node.labels.get(key, '?')}: ")

        if self.root is None:
            return "(no segment compiled yet)"
        walk(self.root, 0, "")
        return "\n".join(lines)

    def nodes(self):
        out = []

        def walk(node):
            out.append(node)
            for c in node.children.values():
                walk(c)

        if self.root is not None:
            walk(self.root)
        return out


def _finish(node, out):
    return out if node.post is None else node.post(out)


class Segmenter:
    """One trace of the function from the start: the points this call has passed are answered
    from its results, the rest are traced, compiled and run as they are met."""

    def __init__(self, sp: SplitProgram, tensors, path, results, envs):
        self.sp = sp
        self.tensors = tensors
        self.path = path
        self.results = results
        self.envs = envs
        self.k = 0  # points met so far in this trace
        self.tracer = None
        self.proxies: list = []  # weak references, in creation order

    # Called by the tracer for every proxy it makes.
    def made(self, px):
        import weakref

        self.proxies.append(weakref.ref(px))

    def trace(self):
        jf = self.sp.jf
        t_start = time.perf_counter()
        tracer, pargs, pkwargs = jf._start_trace(
            self.tensors, self.sp.sids, *self.sp.template, segmenter=self
        )
        self.tracer = tracer
        with tracer:
            out = jf._trace_call(pargs, pkwargs)
            ret = jf._returned(out)
        program, traces = jf._build(
            tracer, ret[0], t_start, autograd=True if ret[1] is None else "list"
        )
        node = Node(program, tuple(tracer.lifted), traces, 0)
        node.post = ret[1]
        self._attach(node)
        return _finish(node, node.run(self.envs[-1]))

    def _attach(self, node):
        if not self.path:
            self.sp.root = node
            return
        parent, key = self.path[-1]
        parent.children[key] = node
        parent.labels[key] = describe_key(key)
        n = len(parent.children)
        if n > RECOMPILE_WARN and not parent.warned:
            parent.warned = True
            warnings.warn(
                f"keraunos: {parent.point.what} at {parent.point.where} has had {n} different "
                "values; each compiles another program. If the value changes on every call, "
                "compute it outside the jitted function.",
                RuntimeWarning,
                stacklevel=4,
            )

    def _alive(self):
        gc.collect()
        alive = []
        for r in self.proxies:
            px = r()
            if px is not None:
                alive.append(px)
        return alive

    def point(self, what, func, args, kwargs):
        tr = self.tracer
        where = _loc()
        alive = self._alive()
        index = {id(px): j for j, px in enumerate(alive)}
        k = self.k
        self.k += 1
        if k < len(self.results):
            # Passed already in this call: its result, and the tensors after it.
            node = self.path[k][0]
            if (node.n_alive, node.point.where, node.point.what) != (len(alive), where, what):
                raise RuntimeError(
                    f"keraunos: the function traced differently on a second pass: at {where}, "
                    f"{what} with {len(alive)} live tensors, where the first pass met "
                    f"{node.point.what} at {node.point.where} with {node.n_alive}; a jitted "
                    "function must do the same for the same tensor values"
                )
            res = self.results[k]
        else:
            leaves, spec = pytree.tree_flatten((args, kwargs))
            positions = {}
            call_leaves = list(leaves)
            for i, v in enumerate(leaves):
                if isinstance(v, Proxy):
                    positions[i] = index[id(v)]
                    call_leaves[i] = None
            t_start = time.perf_counter()
            program, traces = self.sp.jf._build(
                tr, [px._p for px in alive], t_start, autograd="list"
            )
            node = Node(program, tuple(tr.lifted), traces, len(alive))
            node.point = Point(what, where, func, call_leaves, spec, positions)
            self._attach(node)
            with _outside(tr):
                outs = node.run(self.envs[-1])
                res = node.point.evaluate(outs)
            key = result_key(res)
            self.path.append((node, key))
            self.results.append(res)
            self.envs.append(next_env(outs, len(alive), res))
        # The next segment: the live proxies, then the result's tensors, are its inputs.
        new = iter(self.sp.jf._restart(tr, alive, self.envs[k + 1]))
        return pytree.tree_map(lambda v: next(new) if isinstance(v, torch.Tensor) else v, res)


class _outside:
    """Runs eager code in the middle of a trace: no tracer, no torch function modes."""

    def __init__(self, tr):
        self.tr = tr

    def __enter__(self):
        from . import tracer as T

        self.prev = T._state.tracer
        T._state.tracer = None
        self.saved = []
        while torch._C._len_torch_function_stack() > 0:
            self.saved.append(torch._C._pop_torch_function_stack())
        return self

    def __exit__(self, *exc):
        from . import tracer as T

        for m in reversed(self.saved):
            torch._C._push_on_torch_function_stack(m)
        T._state.tracer = self.prev
        return False

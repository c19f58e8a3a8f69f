"""keraunos.jit: the user-facing entry point. The call path is the C++ Dispatcher (signature
-> cached program); a miss comes back here to trace, run the pipeline and build the program."""

from __future__ import annotations

import functools
import time
import warnings

import torch
import torch.utils._pytree as pytree

from . import _C, split
from ._dtypes import to_kr_dtype
from .tracer import Proxy, Tracer, to_c

# Tests set this to a set to collect the names of the ops that acquired traces contain.
OP_COVERAGE: set | None = None


class ProgramTrace:
    """The final stage: the program the executors run, printed as Python (kernel calls by
    name; `kernels` holds the kernel objects, each with its kernel IR and generated source)."""

    def __init__(self, trace, source: str, ms: float, kernels=()):
        self.trace = trace
        self.source = source
        self.kernels = list(kernels)
        self.stage = "fusion executors" if self.kernels else "torch executor"
        self.ms = ms

    def __str__(self):
        s = f"# Constructed by {self.stage} ({self.ms:.3f} ms)\n"
        for k in self.kernels:
            s += "\n".join("# " + line for line in k.ir.splitlines()) + "\n"
        return s + self.source

    __repr__ = __str__


_PROGRAM_GLOBALS = None


def _program_globals():
    global _PROGRAM_GLOBALS
    if _PROGRAM_GLOBALS is None:
        import importlib

        from . import _kr, _prims

        _PROGRAM_GLOBALS = {"torch": torch, "_kr": _kr, "_prims": _prims}
        # Helper modules of op families, by the prefix their torch callables use.
        for alias, mod in (("_shape", "_shape_impl"), ("_nn", "_nn_impl")):
            try:
                _PROGRAM_GLOBALS[alias] = importlib.import_module(f"{__package__}.{mod}")
            except ModuleNotFoundError:
                pass
    return _PROGRAM_GLOBALS


_warned_no_compiler = False


def _fusion_default() -> bool:
    return _C.option("fusion")


def _dump_options() -> set[str]:
    """What KERAUNOS_DUMP asks to print (comma-separated)."""
    return {s.strip() for s in _C.option("dump").split(",")}


def build_program(
    trace, name="program", prims=False, fusion=False, kernels_out=None, boxed=False, donatable=()
):
    """Python source of `trace` and the function it defines. With `fusion`, regions on CPU
    tensors become generated kernels (the program calls them by name; `kernels_out`, a list,
    receives the kernel objects); without a C++ compiler, a warning and torch runs them.
    `boxed`: the function takes its inputs as one list, which it empties (it then holds the
    only references and frees each input at its last use); `donatable`: per input, whether a
    kernel may take its memory after its last read (a backward's saved intermediates)."""
    global _warned_no_compiler
    if prims:
        trace = trace.flatten_to_prims()
    kernels = []
    src = None
    if fusion:
        from . import _cuda

        _cuda.configure()  # where NVRTC is, for CUDA regions
        check_cuda = _C.option("check_cuda_codegen")
        try:
            src, kernels = _C.fused_program(
                trace,
                name,
                True,
                True,
                check_cuda,
                "kernels" in _dump_options(),
                boxed,
                list(donatable),
            )
        except _C.CpuCompilerUnavailable as e:
            if not _warned_no_compiler:
                _warned_no_compiler = True
                warnings.warn(
                    f"keraunos: no usable C++ compiler ({e}); fusion regions run through torch",
                    RuntimeWarning,
                    stacklevel=2,
                )
    if src is None:
        src = trace.torch_program(name, boxed)
    ns = dict(_program_globals())
    for k in kernels:
        ns[k.name] = k
    if kernels_out is not None:
        kernels_out.extend(kernels)
    exec(compile(src, f"<keraunos {name}>", "exec"), ns)
    return src, ns[name]


def _storage_ids(groups):
    firsts = {g for g in groups if g >= 0}
    return [g if g >= 0 else (i if i in firsts else -1) for i, g in enumerate(groups)]


def _replace_tensors(obj, proxies):
    """Same traversal order as the C++ dispatcher's signature walk."""
    if isinstance(obj, (torch.Tensor, _Slot)):
        return next(proxies)
    if isinstance(obj, tuple):
        return tuple(_replace_tensors(e, proxies) for e in obj)
    if isinstance(obj, list):
        return [_replace_tensors(e, proxies) for e in obj]
    if isinstance(obj, dict):
        return {k: _replace_tensors(v, proxies) for k, v in obj.items()}
    return obj


class Stats:
    def __init__(self):
        self.compiles = 0
        self.compile_ms = 0.0
        self.last_pass_ms: dict[str, float] = {}
        # Why the last compile of a program that autograd records runs through torch, or None.
        self.grad_fallback: str | None = None


class JittedFunction(_C.Dispatcher):
    """The callable `keraunos.jit(fn)` returns. Calls go straight to the C++ dispatcher."""

    def __init__(self, fn, fusion_type=None, fusion=None):
        if fusion_type is None:
            fusion_type = _C.option("fusion_type")
        if fusion_type not in ("consecutive", "dataflow"):
            raise ValueError(
                f"fusion_type must be 'consecutive' or 'dataflow', got {fusion_type!r}"
            )
        super().__init__(torch.Tensor, self._compile)
        self._fn = fn
        self._fusion_type = fusion_type
        self._fusion = _fusion_default() if fusion is None else bool(fusion)
        self._traces = None
        self._split = None  # the SplitProgram of the last signature that has data-dependent points
        self._stats = Stats()
        functools.update_wrapper(self, fn, updated=())

    def _trace_fn(self, proxies_args, proxies_kwargs):
        return self._fn(*proxies_args, **proxies_kwargs)

    def _compile(self, tensors, groups, args, kwargs):
        t_start = time.perf_counter()
        sids = _storage_ids(groups)
        tracer, pargs, pkwargs = self._start_trace(tensors, sids, args, kwargs)
        try:
            with tracer:
                out = self._trace_call(pargs, pkwargs)
                ret, post = self._returned(out)
        except split.NeedsSplit:
            # A data-dependent point: the function becomes a tree of programs, traced on
            # this call (the dispatcher calls the program right away) with the values met.
            slot = _Slot()
            template = (
                _replace_tensors(args, iter(lambda: slot, None)),
                _replace_tensors(kwargs, iter(lambda: slot, None)),
            )
            sp = split.SplitProgram(self, sids, *template)
            self._split = sp
            return sp, (), None
        program, _ = self._build(tracer, ret, t_start, autograd=True if post is None else "list")
        if tracer.metadata_updates:
            program = _with_metadata_updates(program, sorted(tracer.metadata_updates.items()))
        return program, tuple(tracer.lifted), post

    def _start_trace(self, tensors, sids, args, kwargs, segmenter=None):
        """A tracer with an input proxy per tensor, and the arguments with proxies in place of
        the tensors (or of the _Slot placeholders of a SplitProgram's template)."""
        default_float = to_kr_dtype(torch.get_default_dtype())
        tracer = Tracer(_C.Builder(default_float), segmenter)
        proxies = tracer.add_inputs(tensors, sids)
        it = iter(proxies)
        return tracer, _replace_tensors(args, it), _replace_tensors(kwargs, it)

    def _restart(self, tracer, alive, env):
        """After a data-dependent point: a new builder whose inputs are `env`'s tensors; the
        live proxies (env's first tensors) now stand for its first inputs; new proxies for the
        others are returned."""
        default_float = to_kr_dtype(torch.get_default_dtype())
        tracer.reset(_C.Builder(default_float))
        with torch._C.DisableTorchFunction():
            proxies = tracer.add_inputs(env, _storage_ids(_C.alias_groups(env)), reuse=alive)
        return proxies[len(alive) :]

    def _trace_call(self, pargs, pkwargs):
        try:
            return self._trace_fn(pargs, pkwargs)
        except TypeError as e:
            _unbound_method_error(e)
            raise

    def _returned(self, out):
        """The traced function's result -> (what the builder returns, the post-processing
        that rebuilds the result's structure, or None for a single leaf)."""
        _register_dataclasses(out)
        out = _object_nodes(out)
        leaves, spec = pytree.tree_flatten(out)
        c_leaves = []
        for leaf in leaves:
            if (
                isinstance(leaf, (Proxy, torch.Tensor, torch.dtype, torch.device))
                or leaf is None
                or isinstance(leaf, (bool, int, float, str))
            ):
                c_leaves.append(to_c(leaf))
            else:
                raise TypeError(
                    f"keraunos: cannot return a value of type {type(leaf).__name__} from a jitted function"
                )
        if spec.is_leaf():
            return c_leaves[0], None
        return c_leaves, functools.partial(_unflatten, spec)

    def _build(self, tracer, ret, t_start, autograd=None):
        """The program of what `tracer` recorded, returning `ret`: passes, fusion, codegen.
        With `autograd` (True: `ret` is one leaf, "list": a list of leaves), a program that
        autograd must record becomes a compiled forward and backward pair (grad.py)."""
        builder = tracer.builder
        builder.set_return(ret)
        acquired = builder.finish()
        if OP_COVERAGE is not None:
            OP_COVERAGE.update(acquired.symbol_names())
        acquire_ms = (time.perf_counter() - t_start) * 1e3
        acquired.ms = acquire_ms
        default_float = to_kr_dtype(torch.get_default_dtype())
        traces = _C.run_pipeline(acquired, self._fusion_type, _C.option("verify"), default_float)
        t_cg = time.perf_counter()
        kernels = []
        st = self._stats
        recorded = torch.is_grad_enabled() and tracer.needs_grad
        st.grad_fallback = None
        if recorded:
            write = _C.recorded_write(traces[0])
            if write is not None:
                # Autograd must see this write as eager's does: the program runs as recorded,
                # in place, through torch.
                st.grad_fallback = write
                src, program = build_program(traces[0])
                cg_ms = (time.perf_counter() - t_cg) * 1e3
                self._traces = [*traces, ProgramTrace(traces[0], src, cg_ms)]
                self._record_stats(traces, t_start, cg_ms)
                return program, self._traces
        if recorded and self._fusion:
            if autograd and not tracer.metadata_updates:
                try:
                    pair = self._grad_program(
                        traces, autograd is True, default_float, t_start, t_cg
                    )
                except NotImplementedError as e:
                    st.grad_fallback = str(e)
                else:
                    if pair is not None:
                        return pair
            else:
                st.grad_fallback = (
                    "keraunos: a program with in-place view ops on its inputs (t_, squeeze_, "
                    "as_strided_) runs through torch when autograd records it"
                )
        # A program that autograd records and that the autodiff pass refused runs through
        # torch (compile_stats(jf)["grad_fallback"] says why). The dispatcher's cache key
        # includes grad mode.
        fusion = self._fusion and not recorded
        src, program = build_program(traces[-1], fusion=fusion, kernels_out=kernels)
        cg_ms = (time.perf_counter() - t_cg) * 1e3
        self._traces = [*traces, ProgramTrace(traces[-1], src, cg_ms, kernels)]
        self._record_stats(traces, t_start, cg_ms)
        return program, self._traces

    def _grad_program(self, traces, single, default_float, t_start, t_cg):
        """The forward and backward programs of the functional trace, run as one autograd
        Function; None when no output is differentiable (no backward to run)."""
        from .grad import GradProgram

        functional = traces[-2]  # after functionalize, DCE and CSE; before partition
        joint, fwd, bwd, leaves, _, donatable = _C.autodiff(functional, traces[0], default_float)
        if not any(info[0] == "tensor" and info[1] for info in leaves):
            return None
        verify = _C.option("verify")
        kf, kb = [], []
        fwd_traces = _C.run_pipeline(fwd, self._fusion_type, verify, default_float)
        bwd_traces = _C.run_pipeline(bwd, self._fusion_type, verify, default_float)
        src_f, prog_f = build_program(fwd_traces[-1], "forward", fusion=True, kernels_out=kf)
        src_b, prog_b = build_program(
            bwd_traces[-1], "backward", fusion=True, kernels_out=kb, boxed=True, donatable=donatable
        )
        cg_ms = (time.perf_counter() - t_cg) * 1e3
        program = GradProgram(prog_f, prog_b, leaves, single)
        self._traces = [
            *traces[:-1],
            joint,
            fwd_traces[-1],
            ProgramTrace(fwd_traces[-1], src_f, cg_ms, kf),
            bwd_traces[-1],
            ProgramTrace(bwd_traces[-1], src_b, cg_ms, kb),
        ]
        self._record_stats([*traces[:-1], joint, fwd_traces[-1], bwd_traces[-1]], t_start, cg_ms)
        return program, self._traces

    def _record_stats(self, traces, t_start, cg_ms):
        st = self._stats
        st.compiles += 1
        st.last_pass_ms = {"acquire": traces[0].ms}
        for t in traces[1:]:
            st.last_pass_ms[t.stage] = st.last_pass_ms.get(t.stage, 0.0) + t.ms
        st.last_pass_ms["codegen"] = cg_ms
        st.compile_ms += (time.perf_counter() - t_start) * 1e3
        dump = _dump_options()
        if "traces" in dump:
            for t in self._traces:
                print(t)
        if "kernels" in dump:
            for pt in self._traces:
                for k in getattr(pt, "kernels", ()):
                    for stage, listing in k.stages:
                        print(f"# kernel {k.name} after {stage}")
                        print(listing)


def _with_metadata_updates(program, updates):
    """The program, then the in-place view ops' new metadata on the inputs they changed."""

    def run(*tensors):
        out = program(*tensors)
        for i, (size, stride, offset) in updates:
            tensors[i].as_strided_(size, stride, offset)
        return out

    return run


class _Slot:
    """Where a tensor argument goes in a SplitProgram's argument template."""


def _register_dataclasses(out, depth=0):
    """Dataclass outputs (a model's output record) become pytree nodes, so their tensor fields
    are outputs of the program and the object is rebuilt around them on every call."""
    import dataclasses

    if depth > 16:
        return
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        cls = type(out)
        if cls not in pytree.SUPPORTED_NODES:
            pytree.register_dataclass(cls)
        for f in dataclasses.fields(out):
            _register_dataclasses(getattr(out, f.name, None), depth + 1)
    elif isinstance(out, (tuple, list)):
        for e in out:
            _register_dataclasses(e, depth + 1)
    elif isinstance(out, dict):
        for e in out.values():
            _register_dataclasses(e, depth + 1)


class _ObjectNode:
    """Stands, inside the output tree, for a Python object that holds traced tensors in its
    attributes (a Hugging Face cache, a user's record): its tensors are outputs of the program,
    and every call rebuilds a copy of the object around the new ones."""

    def __init__(self, obj):
        self.template = obj
        self.children = []
        _collect(obj, self.children, 0)


def _holds_tensors(v, depth=0) -> bool:
    if isinstance(v, (Proxy, torch.Tensor)):
        return True
    if depth > 8:
        return False
    if isinstance(v, (list, tuple)):
        return any(_holds_tensors(e, depth + 1) for e in v)
    if isinstance(v, dict):
        return any(_holds_tensors(e, depth + 1) for e in v.values())
    d = getattr(v, "__dict__", None)
    return isinstance(d, dict) and any(_holds_tensors(e, depth + 1) for e in d.values())


def _collect(v, out, depth):
    if isinstance(v, (Proxy, torch.Tensor)):
        out.append(v)
    elif depth > 8:
        return
    elif isinstance(v, (list, tuple)):
        for e in v:
            _collect(e, out, depth + 1)
    elif isinstance(v, dict):
        for e in v.values():
            _collect(e, out, depth + 1)
    elif isinstance(getattr(v, "__dict__", None), dict):
        for e in vars(v).values():
            _collect(e, out, depth + 1)


def _rebuild(v, it, depth=0):
    import copy

    if isinstance(v, (Proxy, torch.Tensor)):
        return next(it)
    if depth > 8 or not _holds_tensors(v):
        return v
    if isinstance(v, list):
        return [_rebuild(e, it, depth + 1) for e in v]
    if isinstance(v, tuple):
        items = [_rebuild(e, it, depth + 1) for e in v]
        return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
    if isinstance(v, dict):
        new = copy.copy(v)
        for k, e in v.items():
            new[k] = _rebuild(e, it, depth + 1)
        return new
    new = copy.copy(v)
    for k, e in vars(v).items():
        if _holds_tensors(e):
            setattr(new, k, _rebuild(e, it, depth + 1))
    return new


pytree.register_pytree_node(
    _ObjectNode,
    lambda n: (n.children, n.template),
    lambda children, template: _rebuild(template, iter(children)),
)


class _SizeNode:
    """A torch.Size in the output tree (pytree would give back a plain tuple)."""

    def __init__(self, size):
        self.dims = list(size)


pytree.register_pytree_node(_SizeNode, lambda n: (n.dims, None), lambda dims, _: torch.Size(dims))


def _object_nodes(out):
    """Output leaves that pytree does not know but that hold tensors become _ObjectNodes;
    torch.Size values become _SizeNodes."""
    leaves, spec = pytree.tree_flatten(out, is_leaf=lambda x: isinstance(x, torch.Size))
    if not any(_unknown_holder(leaf) or isinstance(leaf, torch.Size) for leaf in leaves):
        return out
    return pytree.tree_unflatten(
        [
            _ObjectNode(leaf)
            if _unknown_holder(leaf)
            else _SizeNode(leaf)
            if isinstance(leaf, torch.Size)
            else leaf
            for leaf in leaves
        ],
        spec,
    )


def _unknown_holder(leaf) -> bool:
    return not isinstance(leaf, (Proxy, torch.Tensor)) and _holds_tensors(leaf)


def _unbound_method_error(e: TypeError):
    """`torch.Tensor.add_(x, y)` on a traced tensor: CPython's method descriptor refuses the
    proxy before torch sees the call. Say so by name, with the user's line."""
    import re
    import traceback

    m = re.search(r"descriptor '(\w+)' for '[\w.]+' objects doesn't apply to a 'Proxy'", str(e))
    if m is None:
        return
    where = "<unknown>"
    for fr in reversed(traceback.extract_tb(e.__traceback__)):
        if "/keraunos/" not in fr.filename and "/torch/" not in fr.filename:
            where = f"{fr.filename}:{fr.lineno}"
            break
    raise NotImplementedError(
        f"keraunos: the unbound method call torch.Tensor.{m.group(1)}(x, ...) on a traced "
        f"tensor is not supported (at {where}); write x.{m.group(1)}(...) instead"
    ) from None


def _unflatten(spec, flat):
    return pytree.tree_unflatten(list(flat), spec)


class JittedModule:
    """keraunos.jit(module): parameters and buffers are inputs of the trace."""

    def __init__(self, module: torch.nn.Module, fusion_type=None, fusion=None):
        self.module = module
        self._jf = JittedFunction(self._forward, fusion_type, fusion)
        self._names = None

    def _forward(self, params, buffers, training, *args, **kwargs):
        mods = dict(self.module.named_modules())
        saved = []
        try:
            for (name, _), p in zip(self.module.named_parameters(), params):
                mod_name, _, attr = name.rpartition(".")
                m = mods[mod_name]
                saved.append((m._parameters, attr, m._parameters[attr]))
                m._parameters[attr] = p
            for (name, _), b in zip(self.module.named_buffers(), buffers):
                mod_name, _, attr = name.rpartition(".")
                m = mods[mod_name]
                saved.append((m._buffers, attr, m._buffers[attr]))
                m._buffers[attr] = b
            return self.module(*args, **kwargs)
        finally:
            for d, attr, v in reversed(saved):
                d[attr] = v

    def __call__(self, *args, **kwargs):
        m = self.module
        return self._jf(tuple(m.parameters()), tuple(m.buffers()), m.training, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.module, name)


def jit(fn=None, *, fusion_type: str | None = None, fusion: bool | None = None):
    """Compiles `fn` (a function or an nn.Module) on its first call for each input signature.

    fusion_type: "consecutive" fuses runs of adjacent fusible ops in program order;
    "dataflow" may merge any fusible neighbours whose merge creates no cycle (default: the
    "fusion_type" option, "dataflow", as the torch.compile backend).
    fusion: generate kernels for fusion regions (default: the "fusion" option, on unless
    KERAUNOS_FUSION=0); False runs every region through torch. keraunos.options() lists them.
    """
    if fn is None:
        return functools.partial(jit, fusion_type=fusion_type, fusion=fusion)
    if isinstance(fn, torch.nn.Module):
        return JittedModule(fn, fusion_type, fusion)
    if not callable(fn):
        raise TypeError(f"keraunos.jit expects a function or an nn.Module, got {type(fn).__name__}")
    return JittedFunction(fn, fusion_type, fusion)


def _jitted(jf) -> JittedFunction:
    if isinstance(jf, JittedModule):
        return jf._jf
    if isinstance(jf, JittedFunction):
        return jf
    raise TypeError(f"expected a function returned by keraunos.jit, got {type(jf).__name__}")


def last_traces(jf):
    """Every stage of the most recent compilation: acquisition, each pass, the program."""
    j = _jitted(jf)
    if j._traces is None:
        raise RuntimeError(
            "keraunos.last_traces: the function has not been compiled yet (call it first)"
        )
    return list(j._traces)


def compile_stats(jf) -> dict:
    """Cache hits and misses, number of compilations and time spent per pass (last compile)."""
    j = _jitted(jf)
    return {
        "hits": j.hits,
        "misses": j.misses,
        "cache_size": j.size,
        "compiles": j._stats.compiles,
        "compile_ms_total": j._stats.compile_ms,
        "last_pass_ms": dict(j._stats.last_pass_ms),
        "grad_fallback": j._stats.grad_fallback,
    }

"""keraunos as a torch.compile backend, with graph splitting.

    torch.compile(fn, backend="keraunos")        # registered on `import keraunos` and through
                                                 # the `torch_dynamo_backends` entry point
    keraunos.compile(fn, fusion_type="dataflow") # the same, with dynamic=False

Dynamo hands the backend one FX graph per captured region of Python code (graph breaks make
several). Each node is checked against the mapping table (`keraunos.torch_map.lookup`) and the
things proxies do natively (metadata, indexing tuples, Python operators); runs of supported
nodes become regions compiled by `keraunos.jit`, runs of unsupported nodes become regions run
eagerly (torch.fx.passes.split_module, original order kept so that in-place ops run in program
order). A region whose keraunos compile is refused at trace time (NotImplementedError: something
the per-node check cannot see, such as an unsupported argument) runs eagerly from then on, with
the error recorded as its reason; so does one whose arguments the dispatcher refuses
(keraunos._C.UnsupportedCall). Nodes inside a torch.func transform that Dynamo inlined
(torch.vmap, as Hugging Face models build their causal masks; grad; jvp) run eagerly: their
tensors are functorch wrappers. `keraunos.explain(compiled)` prints the graphs, regions,
reasons and traces; `keraunos.compile_stats(compiled)` aggregates over them.
"""

from __future__ import annotations

import builtins
import functools
import io
import operator
import sys
import weakref

import torch

from . import _C, torch_map
from ._dtypes import TORCH_TO_KR
from .jit import JittedFunction, jit
from .jit import compile_stats as _jit_compile_stats
from .tracer import _METADATA, _PASSTHROUGH, callable_name

__all__ = ["compile", "explain", "compile_stats", "keraunos_backend", "KeraunosBackend"]

_DEFAULT_OPTIONS = {"fusion_type": "dataflow"}


# --------------------------------------------------------------------------------------------
# Which FX nodes keraunos supports.

# Tensor methods and attributes a Proxy answers itself (no mapping-table entry needed).
_PROXY_METHODS = {
    "size",
    "dim",
    "ndimension",
    "numel",
    "nelement",
    "stride",
    "storage_offset",
    "is_contiguous",
    "is_floating_point",
    "is_complex",
    "element_size",
}
_PROXY_ATTRS = {
    "shape",
    "dtype",
    "device",
    "is_cuda",
    "is_cpu",
    "ndim",
    "requires_grad",
    "layout",
    "is_sparse",
    "is_quantized",
    "is_nested",
    "T",
    "mT",
}

# operator.X -> (dunder on the left operand, dunder when only the right operand is a tensor).
_OPERATORS = {}
for _n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul"):
    _OPERATORS[getattr(operator, _n)] = (f"__{_n}__", f"__r{_n}__")
    _OPERATORS[getattr(operator, f"i{_n}")] = (f"__i{_n}__", None)
for _n, _d in (("and_", "and"), ("or_", "or"), ("xor", "xor")):
    _OPERATORS[getattr(operator, _n)] = (f"__{_d}__", f"__r{_d}__")
    _OPERATORS[getattr(operator, f"i{_d}")] = (f"__i{_d}__", None)
for _n, _r in (("lt", "gt"), ("le", "ge"), ("gt", "lt"), ("ge", "le"), ("eq", "eq"), ("ne", "ne")):
    _OPERATORS[getattr(operator, _n)] = (f"__{_n}__", f"__{_r}__")
for _n in ("lshift", "rshift"):
    _OPERATORS[getattr(operator, _n)] = (f"__{_n}__", f"__r{_n}__")
for _n in ("neg", "pos", "abs", "invert"):
    _OPERATORS[getattr(operator, _n)] = (f"__{_n}__", None)
_OPERATORS[operator.getitem] = ("__getitem__", None)
_OPERATORS[operator.setitem] = ("__setitem__", None)

# Leaf modules Dynamo may leave as call_module nodes: the functional form keraunos traces.
_MODULE_FUNCTIONAL = {
    torch.nn.Linear: torch.nn.functional.linear,
    torch.nn.ReLU: torch.nn.functional.relu,
    torch.nn.GELU: torch.nn.functional.gelu,
    torch.nn.SiLU: torch.nn.functional.silu,
    torch.nn.Tanh: torch.tanh,
    torch.nn.Sigmoid: torch.sigmoid,
    torch.nn.Dropout: torch.nn.functional.dropout,
    torch.nn.LayerNorm: torch.nn.functional.layer_norm,
    torch.nn.Embedding: torch.nn.functional.embedding,
    torch.nn.Softmax: torch.nn.functional.softmax,
    torch.nn.Identity: None,
}


def _example(n):
    return n.meta.get("example_value") if isinstance(n, torch.fx.Node) else n


def _is_tensor_arg(a) -> bool:
    return isinstance(_example(a), torch.Tensor)


def _dtype_reason(node) -> str | None:
    """Tensors of dtypes keraunos has no dtype for (complex, quantized, ...) stay eager."""
    vals = [_example(node)]
    vals += [_example(a) for a in node.all_input_nodes]
    for v in vals:
        for t in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(t, torch.Tensor) and t.dtype not in TORCH_TO_KR:
                return f"{_describe(node)}: dtype {t.dtype} is not supported"
    return None


def _describe(node) -> str:
    if node.op == "call_function":
        return callable_name(node.target)
    if node.op == "call_method":
        return f"torch.Tensor.{node.target}"
    return f"{node.op} {node.target}"


def unsupported_reason(node, gm) -> str | None:
    """None when keraunos can trace `node`; else why not (the split reason)."""
    if node.op in ("placeholder", "output", "get_attr"):
        return None
    reason = _op_reason(node, gm)
    return reason if reason is not None else _dtype_reason(node)


def _op_reason(node, gm) -> str | None:
    if node.op == "call_function":
        t = node.target
        if t in _OPERATORS:
            left, right = _OPERATORS[t]
            args = node.args
            if args and _is_tensor_arg(args[0]):
                dunder = left
            elif len(args) > 1 and _is_tensor_arg(args[1]) and right is not None:
                dunder = right
            else:
                return None  # Python values (ints, tuples): the Python operator itself
            if torch_map.lookup(getattr(torch.Tensor, dunder, None)) is not None:
                return None
            return f"torch.Tensor.{dunder} is not supported"
        if t is builtins.getattr:
            obj, attr = node.args[0], node.args[1]
            if not _is_tensor_arg(obj) or attr in _PROXY_ATTRS:
                return None
            return f"tensor attribute torch.Tensor.{attr} is not supported"
        if torch_map.lookup(t) is not None or t in _PASSTHROUGH or t in _METADATA:
            return None
        if t is torch._C._set_grad_enabled:
            return "grad mode change (torch.no_grad / torch.set_grad_enabled) runs eagerly"
        if getattr(t, "__module__", None) in ("_operator", "operator", "builtins", "math"):
            if not any(_is_tensor_arg(a) for a in node.all_input_nodes):
                return None
        return f"{callable_name(t)} is not supported"
    if node.op == "call_method":
        name = node.target
        if name in _PROXY_METHODS:
            return None
        attr = getattr(torch.Tensor, name, None)
        if attr is not None and torch_map.lookup(attr) is not None:
            return None
        return f"torch.Tensor.{name} is not supported"
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        kind = type(mod)
        if kind in _MODULE_FUNCTIONAL:
            fn = _MODULE_FUNCTIONAL[kind]
            if fn is None or torch_map.lookup(fn) is not None:
                return None
        return f"module {kind.__module__}.{kind.__qualname__} ({node.target}) is not supported"
    return f"FX node {node.op} is not supported"


def _functorch_nesting(node) -> int:
    """+1 for a node that enters a torch.func transform level (torch.vmap, grad, jvp, ...: Dynamo
    inlines them as `_vmap_increment_nesting` ... `_vmap_decrement_nesting`), -1 for one that
    leaves it, else 0."""
    if node.op != "call_function":
        return 0
    name = getattr(node.target, "__name__", "")
    if name.endswith("_increment_nesting"):
        return 1
    if name.endswith("_decrement_nesting"):
        return -1
    return 0


_TRANSFORMED = (
    "inside a torch.func transform (torch.vmap, grad, jvp, ...): its tensors are functorch "
    "wrappers keraunos cannot run on; runs eagerly"
)


def _neutral(node) -> bool:
    """Nodes with no tensor work (indexing a tuple, reading metadata, int arithmetic): they join
    whichever region they follow instead of starting one."""
    if node.op != "call_function":
        return False
    if node.target is builtins.getattr:
        return node.args[1] in _PROXY_ATTRS - {"T", "mT"}
    if node.target in _OPERATORS or getattr(node.target, "__module__", None) in (
        "_operator",
        "builtins",
    ):
        return not isinstance(_example(node), torch.Tensor) and not any(
            isinstance(_example(a), torch.Tensor) for a in node.args if a is not node.args[0]
        )
    return False


# --------------------------------------------------------------------------------------------
# Regions.


class _TraceRefused(Exception):
    """keraunos refused the region while tracing it (not a user error)."""


def _is_limitation(e: BaseException) -> bool:
    if isinstance(e, NotImplementedError):
        return True
    msg = str(e)
    if isinstance(e, RuntimeError) and msg.startswith("keraunos: data-dependent"):
        return True
    return isinstance(e, TypeError) and (
        msg.startswith("keraunos: unsupported argument")
        or msg.startswith("keraunos: cannot return")
    )


class _RegionJit(JittedFunction):
    """JittedFunction whose trace-time refusals are told apart from errors of the program."""

    def _compile(self, *a):
        try:
            return super()._compile(*a)
        except Exception as e:
            if _is_limitation(e):
                raise _TraceRefused(f"{type(e).__name__}: {e}") from e
            raise


class Region:
    """A run of consecutive FX nodes, compiled by keraunos or run eagerly."""

    def __init__(self, index: int, kind: str):
        self.index = index
        self.kind = kind  # "keraunos" or "eager"
        self.nodes: list[str] = []
        self.reasons: list[str] = []
        self.module: torch.fx.GraphModule | None = None
        self.jf: _RegionJit | None = None
        self.fell_back = False
        self.grad_before: bool | None = None  # grad mode set before / after the region
        self.grad_after: bool | None = None

    def build(self, module, options):
        self.module = module
        self.grad_before = self.grad_after = None
        if self.kind == "keraunos":
            self._strip_grad_mode()
            self.jf = _RegionJit(module.forward, **options)

    def _strip_grad_mode(self):
        """split_module opens each partition inside a `with torch.no_grad()` (or closes one)
        with torch._C._set_grad_enabled calls: they are done here, around the region."""
        g = self.module.graph
        body = [n for n in g.nodes if n.op not in ("placeholder", "output")]

        def grad_node(n):
            return (
                n.op == "call_function"
                and n.target is torch._C._set_grad_enabled
                and not n.users
                and len(n.args) == 1
                and isinstance(n.args[0], bool)
            )

        changed = False
        if body and grad_node(body[0]):
            self.grad_before = body[0].args[0]
            g.erase_node(body.pop(0))
            changed = True
        if body and grad_node(body[-1]):
            self.grad_after = body[-1].args[0]
            g.erase_node(body.pop())
            changed = True
        if changed:
            self.module.recompile()

    def __call__(self, *args):
        if self.grad_before is not None:
            torch._C._set_grad_enabled(self.grad_before)
        try:
            if self.kind == "keraunos":
                try:
                    return self.jf(*args)
                except _TraceRefused as e:
                    self.kind = "eager"
                    self.fell_back = True
                    self.reasons.append(f"keraunos refused it while tracing: {e}")
                except _C.UnsupportedCall as e:
                    # Refused by the dispatcher before anything ran (say, a tensor without
                    # storage): eager from now on.
                    self.kind = "eager"
                    self.fell_back = True
                    self.reasons.append(f"keraunos refused its arguments: {e}")
            return self.module(*args)
        finally:
            if self.grad_after is not None:
                torch._C._set_grad_enabled(self.grad_after)

    def describe(self) -> str:
        names = ", ".join(self.nodes[:12]) + (", ..." if len(self.nodes) > 12 else "")
        head = f"region {self.index} [{self.kind}] {len(self.nodes)} nodes: {names}"
        if self.jf is not None:
            head += f"  (compiles: {self.jf._stats.compiles})"
        lines = [head]
        for r in self.reasons:
            lines.append(f"    reason: {r}")
        return "\n".join(lines)


class _RegionModule(torch.nn.Module):
    """Stands in for a split submodule inside the stitching GraphModule."""

    def __init__(self, region: Region):
        super().__init__()
        self._region = region

    def forward(self, *args):
        return self._region(*args)


class CompiledGraph:
    """What the backend returns for one Dynamo graph."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, options: dict, index: int):
        self.index = index
        self.gm = gm
        self.options = options
        self.regions: list[Region] = []
        self.reason: str | None = None  # why the whole graph runs eagerly
        self.n_nodes = sum(1 for n in gm.graph.nodes if n.op not in ("placeholder", "output"))
        self._run = gm.forward
        # A graph with symbolic shapes (dynamic=True, or Dynamo's automatic dynamic shapes
        # after a shape change) is compiled too: at each call its sizes arrive as ints, and
        # keraunos.jit specializes on them (one keraunos compile per concrete signature).
        self._split()

    def _split(self):
        gm = self.gm
        assign: dict[torch.fx.Node, int] = {}
        depth = 0  # torch.func transform levels entered (their bodies run eagerly)
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "get_attr", "output"):
                continue
            nesting = _functorch_nesting(node)
            depth = max(depth + min(nesting, 0), 0)
            if depth > 0 and nesting == 0:
                reason = _TRANSFORMED
                kind = "eager"
            elif _neutral(node) and self.regions:
                reason = None
                kind = self.regions[-1].kind
            else:
                reason = unsupported_reason(node, gm)
                kind = "eager" if reason else "keraunos"
            depth += max(nesting, 0)
            if not self.regions or self.regions[-1].kind != kind:
                self.regions.append(Region(len(self.regions), kind))
            region = self.regions[-1]
            region.nodes.append(node.name)
            if reason and reason not in region.reasons:
                region.reasons.append(reason)
            assign[node] = region.index
        if not self.regions:  # nothing to compute: the graph returns its inputs
            return
        if len(self.regions) == 1:
            region = self.regions[0]
            region.build(gm, self.options)
            self._run = region
            return
        from torch.fx.passes.split_module import split_module

        split = split_module(
            gm, gm, lambda n: assign[n], keep_original_order=True, keep_original_node_name=True
        )
        for region in self.regions:
            name = f"submod_{region.index}"
            sub = getattr(split, name, None)
            if sub is None:  # split_module dropped an empty partition
                continue
            region.build(sub, self.options)
            setattr(split, name, _RegionModule(region))
        self.split_gm = split
        self._run = split

    def __call__(self, *args):
        return self._run(*args)

    def describe(self) -> str:
        head = f"graph {self.index}: {self.n_nodes} nodes"
        if self.reason:
            return f"{head}, runs eagerly\n  reason: {self.reason}"
        head += f", {len(self.regions)} region(s)"
        return "\n".join([head] + ["  " + r.describe().replace("\n", "\n  ") for r in self.regions])


# --------------------------------------------------------------------------------------------
# The backend and its bookkeeping per compiled function.


class _Record:
    def __init__(self, name):
        self.name = name
        self.graphs: list[CompiledGraph] = []


# The torch.compile'd callable's original function (Dynamo's compile_wrapper closes over it)
# -> the graphs compiled while it ran.
_RECORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RECORDS_BY_ID: dict[int, tuple[object, _Record]] = {}
_UNOWNED = _Record("<unknown>")


def _owner():
    """The Dynamo context (one per torch.compile call) whose compile_wrapper is running: the
    innermost one on the stack."""
    f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code.co_name == "compile_wrapper" and code.co_filename.endswith("eval_frame.py"):
            loc = f.f_locals
            ctx = loc.get("self")
            if ctx is not None:
                return ctx, loc.get("fn")
        f = f.f_back
    return None, None


def _record_for(owner, create=True, fn=None) -> _Record | None:
    if owner is None:
        return _UNOWNED if create else None
    try:
        rec = _RECORDS.get(owner)
        if rec is None and create:
            rec = _RECORDS[owner] = _Record(_name_of(fn))
        return rec
    except TypeError:  # not weak-referenceable
        hit = _RECORDS_BY_ID.get(id(owner))
        if hit is not None and hit[0] is owner:
            return hit[1]
        if not create:
            return None
        rec = _Record(_name_of(fn))
        _RECORDS_BY_ID[id(owner)] = (owner, rec)
        return rec


def _name_of(fn) -> str:
    self = getattr(fn, "__self__", None)
    if isinstance(self, torch.nn.Module):
        return type(self).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _jit_options(options) -> dict:
    opts = dict(_DEFAULT_OPTIONS)
    opts.update(options or {})
    jit(lambda: None, **opts)  # validates names and values like keraunos.jit does
    return opts


class KeraunosBackend:
    """A torch.compile backend: `torch.compile(fn, backend=KeraunosBackend(fusion_type=...))`."""

    def __init__(self, **options):
        self.options = _jit_options(options)
        self.__name__ = "keraunos"

    def __call__(self, gm, example_inputs, options=None, mode=None):
        opts = self.options if not options else _jit_options({**self.options, **options})
        ctx, fn = _owner()
        record = _record_for(ctx, fn=fn)
        graph = CompiledGraph(gm, example_inputs, opts, len(record.graphs))
        record.graphs.append(graph)
        return graph


_DEFAULT_BACKEND = KeraunosBackend()


def keraunos_backend(gm, example_inputs, options=None, mode=None):
    """The backend registered as "keraunos". `options` (torch.compile(..., options={...})) are
    keraunos.jit options; fusion_type defaults to "dataflow"."""
    return _DEFAULT_BACKEND(gm, example_inputs, options=options, mode=mode)


def compile(fn=None, *, fullgraph: bool = False, **options):
    """torch.compile(fn, backend="keraunos", dynamic=False) with keraunos.jit `options`
    (fusion_type defaults to "dataflow"). Works on functions and nn.Modules."""
    if fn is None:
        return functools.partial(compile, fullgraph=fullgraph, **options)
    backend = KeraunosBackend(**options)
    return torch.compile(fn, backend=backend, dynamic=False, fullgraph=fullgraph)


def _context(compiled):
    """The Dynamo context of a torch.compile'd function or module (what compile_wrapper closes
    over as `self`)."""
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(compiled, OptimizedModule):
        return compiled.dynamo_ctx
    code = getattr(compiled, "__code__", None)
    if getattr(compiled, "_torchdynamo_orig_callable", None) is not None and code is not None:
        cells = dict(zip(code.co_freevars, compiled.__closure__ or ()))
        if "self" in cells:
            return cells["self"].cell_contents
    raise TypeError(
        "expected a function returned by keraunos.jit, keraunos.compile or "
        f"torch.compile(..., backend='keraunos'), got {type(compiled).__name__}"
    )


def _compiled_name(compiled) -> str | None:
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(compiled, OptimizedModule):
        return type(compiled._orig_mod).__name__
    orig = getattr(compiled, "_torchdynamo_orig_callable", None)
    return getattr(orig, "__qualname__", None)


def _graphs(compiled) -> list[CompiledGraph]:
    rec = _record_for(_context(compiled), create=False)
    return list(rec.graphs) if rec is not None else []


def compile_stats(fn) -> dict:
    """keraunos.compile_stats: for keraunos.jit functions, that function's stats; for
    torch.compile'd ones, the sum over the regions of every Dynamo graph compiled for it."""
    from .jit import JittedModule

    if isinstance(fn, (JittedFunction, JittedModule)):
        return _jit_compile_stats(fn)
    graphs = _graphs(fn)
    regions = [r for g in graphs for r in g.regions]
    jfs = [r.jf for r in regions if r.jf is not None]
    out = {
        "graphs": len(graphs),
        "eager_graphs": sum(1 for g in graphs if g.reason),
        "regions": len(regions),
        "keraunos_regions": sum(1 for r in regions if r.kind == "keraunos"),
        "eager_regions": sum(1 for r in regions if r.kind == "eager"),
        "fallbacks": sum(1 for r in regions if r.fell_back),
        "hits": sum(j.hits for j in jfs),
        "misses": sum(j.misses for j in jfs),
        "cache_size": sum(j.size for j in jfs),
        "compiles": sum(j._stats.compiles for j in jfs),
        "compile_ms_total": sum(j._stats.compile_ms for j in jfs),
    }
    return out


def explain(fn, file=None, traces: str = "all") -> str:
    """Prints (to `file`, default stdout) and returns what keraunos did with a compiled function:
    each Dynamo graph, its regions (keraunos or eager, with the reasons) and the traces of each
    compiled region (`traces`: "all" stages, "last" only the program, or "none")."""
    if traces not in ("all", "last", "none"):
        raise ValueError(f"traces must be 'all', 'last' or 'none', got {traces!r}")
    from .jit import JittedFunction, JittedModule, last_traces

    out = io.StringIO()
    if isinstance(fn, (JittedFunction, JittedModule)):
        print(
            f"keraunos.explain: {getattr(fn, '__name__', type(fn).__name__)} (keraunos.jit)",
            file=out,
        )
        from .jit import _jitted

        sp = _jitted(fn)._split
        if sp is not None:
            # Data-dependent points: the program is split there (split.py).
            print(
                f"split at data-dependent points into {len(sp.nodes())} segment(s):",
                file=out,
            )
            print(sp.describe(), file=out)
            if traces != "none":
                for i, node in enumerate(sp.nodes()):
                    print(f"--- segment {i}: program ---", file=out)
                    print(node.traces[-1], file=out)
                print("--- the last compilation: traces ---", file=out)
        if traces != "none":
            ts = last_traces(fn)
            for t in ts if traces == "all" else ts[-1:]:
                print(t, file=out)
    else:
        rec = _record_for(_context(fn), create=False)
        graphs = rec.graphs if rec else []
        name = _compiled_name(fn) or (rec.name if rec else "?")
        print(
            f"keraunos.explain: {name}: {len(graphs)} Dynamo graph(s)"
            + (" (more than one: Dynamo graph breaks or recompiles)" if len(graphs) > 1 else ""),
            file=out,
        )
        if not graphs:
            print("  (not compiled yet: call it first)", file=out)
        for g in graphs:
            print(g.describe(), file=out)
            if traces == "none":
                continue
            for r in g.regions:
                if r.jf is None or r.jf._traces is None:
                    continue
                print(f"--- graph {g.index} region {r.index}: traces ---", file=out)
                ts = r.jf._traces
                for t in ts if traces == "all" else ts[-1:]:
                    print(t, file=out)
    text = out.getvalue()
    print(text, end="", file=file or sys.stdout)
    return text


def _register():
    """Registers "keraunos" with Dynamo unless the installed distribution's entry point will
    (registering both makes Dynamo's lazy entry-point load fail on a duplicate name)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            eps = distribution("keraunos").entry_points
            if any(e.group == "torch_dynamo_backends" and e.name == "keraunos" for e in eps):
                return
        except PackageNotFoundError:
            pass
    except Exception:  # pragma: no cover
        pass
    from torch._dynamo import register_backend

    try:
        register_backend(keraunos_backend, name="keraunos")
    except AssertionError:  # already registered (keraunos reloaded, or by the entry point)
        pass

"""Acquisition: runs the user's function once on proxy tensors. Every torch call reaches
`handle` (through the torch function protocol: a TorchFunctionMode for factories and calls on
real tensors, `Proxy.__torch_function__` and Proxy's methods for the rest), which looks the
callable up in the mapping table and records it through the C++ trace builder."""

from __future__ import annotations

import os
import sys
import threading

import torch
from torch.overrides import TorchFunctionMode

from . import _C
from ._dtypes import KR_TO_TORCH, to_kr_device, to_kr_dtype, to_torch_device

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_state = threading.local()


def current() -> Tracer | None:
    return getattr(_state, "tracer", None)


def user_location():
    """(file, line, function) of the innermost frame outside keraunos and torch."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not (fn.startswith(_PKG_DIR) or fn.startswith(_TORCH_DIR)):
            return fn, f.f_lineno, f.f_code.co_name
        f = f.f_back
    return "<unknown>", 0, "<unknown>"


def where() -> str:
    file, line, _ = user_location()
    return f"{file}:{line}"


_PUBLIC_NAMES: dict[int, str] | None = None


def _public_names() -> dict[int, str]:
    """id(callable) -> its public name, for the torch namespaces users call."""
    global _PUBLIC_NAMES
    if _PUBLIC_NAMES is None:
        names: dict[int, str] = {}
        spaces = [
            ("torch.Tensor", torch.Tensor),
            ("torch.nn.functional", torch.nn.functional),
            ("torch.fft", torch.fft),
            ("torch.linalg", torch.linalg),
            ("torch.special", torch.special),
            ("torch", torch),
        ]
        for prefix, ns in spaces:
            for attr in dir(ns):
                try:
                    obj = getattr(ns, attr)
                except Exception:
                    continue
                if callable(obj):
                    names.setdefault(id(obj), f"{prefix}.{attr}")
        _PUBLIC_NAMES = names
    return _PUBLIC_NAMES


def callable_name(func) -> str:
    public = _public_names().get(id(func))
    if public is not None:
        return public
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    mod = getattr(func, "__module__", None)
    if qual.startswith("TensorBase.") or qual.startswith("_TensorBase."):
        return "torch.Tensor." + qual.split(".", 1)[1]
    if qual.startswith("Tensor."):
        return "torch." + qual
    if mod in (None, "torch._C._VariableFunctions", "torch._VariableFunctionsClass"):
        return f"torch.{qual}"
    if mod and mod.startswith("torch._C._nn"):
        return f"torch.nn.functional.{qual}"
    return f"{mod}.{qual}" if mod else qual


class Proxy:
    """A tensor during tracing. Metadata are concrete; values are not."""

    __slots__ = ("_p", "_shape", "__weakref__")

    def __init__(self, p):
        self._p = p
        self._shape = None

    # Metadata (concrete).
    @property
    def shape(self):
        if self._shape is None:
            self._shape = torch.Size(self._p.shape)
        return self._shape

    def size(self, dim=None):
        if dim is None:
            return self.shape
        return self.shape[_C_wrap(dim, len(self.shape), "size")]

    @property
    def dtype(self):
        return KR_TO_TORCH[self._p.dtype]

    @property
    def device(self):
        return to_torch_device(self._p.device)

    @property
    def is_cuda(self):
        return self._p.device.type == "cuda"

    @property
    def is_cpu(self):
        return self._p.device.type == "cpu"

    @property
    def ndim(self):
        return len(self._p.shape)

    def dim(self):
        return len(self._p.shape)

    ndimension = dim

    def numel(self):
        n = 1
        for s in self._p.shape:
            n *= s
        return n

    nelement = numel

    def stride(self, dim=None):
        st = tuple(self._p.strides)
        return st if dim is None else st[_C_wrap(dim, len(st), "stride")]

    def storage_offset(self):
        return self._p.storage_offset

    def is_contiguous(self, memory_format=torch.contiguous_format):
        if memory_format is not torch.contiguous_format:
            raise NotImplementedError("keraunos: is_contiguous(memory_format=...) is not supported")
        return self._p.is_contiguous()

    def is_floating_point(self):
        return self.dtype.is_floating_point

    def is_complex(self):
        return False

    def element_size(self):
        return _C.itemsize(self._p.dtype)

    @property
    def requires_grad(self):
        return self._p.requires_grad

    @property
    def layout(self):
        return torch.strided

    @property
    def is_sparse(self):
        return False

    @property
    def is_quantized(self):
        return False

    @property
    def is_nested(self):
        return False

    @property
    def data(self):
        return handle(torch.Tensor.detach, (self,), {})

    @property
    def T(self):
        return handle(torch.Tensor.permute, (self, tuple(range(self.ndim - 1, -1, -1))), {})

    @property
    def mT(self):
        return handle(torch.Tensor.transpose, (self, -2, -1), {})

    # The conjugate transposes: for real tensors (keraunos has no complex dtypes), transposes.
    @property
    def H(self):
        if self.ndim not in (0, 2):
            raise RuntimeError(
                f"tensor.H is only supported on matrices (2-D tensors). Got {self.ndim}-D tensor."
            )
        return handle(torch.Tensor.t, (self,), {})

    @property
    def mH(self):
        if self.ndim < 2:
            raise RuntimeError(
                "tensor.mH is only supported on matrices or batches of matrices. "
                f"Got {self.ndim}-D tensor."
            )
        return self.mT

    def __len__(self):
        if not self._p.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._p.shape[0]

    def __iter__(self):
        if not self._p.shape:
            raise TypeError("iteration over a 0-d tensor")
        return iter(handle(torch.Tensor.unbind, (self, 0), {}))

    def __repr__(self):
        return f"Proxy({self._p!r})"

    __hash__ = object.__hash__

    # Values are unknown while tracing: asking for them is data-dependent.
    def _data_dependent(self, what):
        raise RuntimeError(
            f"keraunos: data-dependent control flow: {what} of a traced tensor at {where()}. "
            "keraunos traces tensor values symbolically and cannot branch on them; use "
            "torch.where or compute the condition outside the jitted function."
        )

    # A data-dependent point: the program is split there (split.py).
    def __bool__(self):
        return _point("bool()", torch.Tensor.__bool__, self)

    def __int__(self):
        return _point("int()", torch.Tensor.__int__, self)

    def __float__(self):
        return _point("float()", torch.Tensor.__float__, self)

    def __index__(self):
        return _point("using it as an index (__index__)", torch.Tensor.__index__, self)

    def item(self):
        return _point(".item()", torch.Tensor.item, self)

    def tolist(self):
        return _point(".tolist()", torch.Tensor.tolist, self)

    def numpy(self, *a, **k):
        self._data_dependent(".numpy()")

    def data_ptr(self):
        raise NotImplementedError(f"keraunos: data_ptr() of a traced tensor (at {where()})")

    def __getattr__(self, name):
        attr = getattr(torch.Tensor, name, None)
        attr = getattr(attr, "_kr_unbound_of", attr)  # the original of an unbound-call hook
        if attr is None or name.startswith("__"):
            raise AttributeError(f"'Tensor' object has no attribute '{name}'")
        if not callable(attr):
            raise NotImplementedError(
                f"keraunos: tensor attribute torch.Tensor.{name} is not supported yet (at {where()})"
            )

        def method(*args, **kwargs):
            return handle(attr, (self, *args), kwargs)

        return method

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return handle(func, args, kwargs or {})


def _point(what, func, px):
    from . import split

    return split.point(what, func, (px,))


def _C_wrap(dim, n, what):
    if not -max(n, 1) <= dim < max(n, 1):
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-max(n, 1)}, {max(n, 1) - 1}], "
            f"but got {dim})"
        )
    return dim % max(n, 1)


def _install_operators():
    """Python operators on proxies call the matching torch.Tensor dunder through `handle`."""
    names = [
        "add",
        "radd",
        "rdiv",
        "iadd",
        "sub",
        "rsub",
        "isub",
        "mul",
        "rmul",
        "imul",
        "truediv",
        "rtruediv",
        "itruediv",
        "floordiv",
        "rfloordiv",
        "ifloordiv",
        "mod",
        "rmod",
        "imod",
        "pow",
        "rpow",
        "ipow",
        "matmul",
        "rmatmul",
        "and",
        "rand",
        "iand",
        "or",
        "ror",
        "ior",
        "xor",
        "rxor",
        "ixor",
        "neg",
        "pos",
        "abs",
        "invert",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "getitem",
        "setitem",
        "lshift",
        "rshift",
    ]
    for n in names:
        dunder = f"__{n}__"
        target = getattr(torch.Tensor, dunder, None)
        if target is None:
            continue

        def make(t):
            def op(self, *args):
                return handle(t, (self, *args), {})

            return op

        setattr(Proxy, dunder, make(target))


_install_operators()


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return handle(func, args, kwargs or {})


class Tracer:
    """The state of one acquisition: the C++ builder, the proxy objects by name (so that the
    same tensor is always the same Python object), tensors lifted from closures."""

    def __init__(self, builder, segmenter=None):
        self.builder = builder
        self.proxies: dict[str, Proxy] = {}
        self.lifted: list[torch.Tensor] = []
        # An input requires grad: the program may run under autograd.
        self.needs_grad = False
        # Storages written in place under no_grad while autograd records the program.
        self.written_without_grad: set[int] = set()
        self.n_recorded = 0
        self._lifted_ids: dict[int, Proxy] = {}
        self._mode = _Mode()
        # Data-dependent points (split.py): the SplitProgram's tracer of this trace, if any,
        # and the state a split must find unchanged.
        self.segmenter = segmenter
        # In-place view ops (t_, squeeze_, as_strided_) on inputs: the new metadata each input
        # gets after the call (argument index -> (size, stride, storage offset)).
        self.input_index: dict[int, int] = {}
        self.metadata_updates: dict[int, tuple] = {}
        self.grad_at_start = torch.is_grad_enabled()
        self.inference_at_start = torch.is_inference_mode_enabled()
        self.autocast_at_start = _autocast_state()
        self.modes_at_start = len(user_function_modes())

    def new_proxy(self, p) -> Proxy:
        px = Proxy(p)
        self.proxies[p.name] = px
        if self.segmenter is not None:
            self.segmenter.made(px)
        return px

    def wrap_input(self, p) -> Proxy:
        self.needs_grad = self.needs_grad or p.requires_grad
        px = self.new_proxy(p)
        # The program's arguments are its inputs in this order (tensors, then lifted ones).
        self.input_index[id(px)] = len(self.input_index)
        return px

    def add_inputs(self, tensors, sids, reuse=()) -> list[Proxy]:
        """An input per tensor (storage groups `sids`); the first len(reuse) proxies are
        `reuse`'s, rebound to their new inputs."""
        out = []
        for i, (t, sid) in enumerate(zip(tensors, sids)):
            if type(t) not in (torch.Tensor, torch.nn.Parameter):
                raise NotImplementedError(
                    f"keraunos: tensor subclass {type(t).__name__} is not supported"
                )
            p = self.builder.add_input(
                to_kr_dtype(t.dtype, "input dtype"),
                to_kr_device(t.device),
                list(t.shape),
                list(t.stride()),
                t.storage_offset(),
                sid,
                t.requires_grad,
            )
            if i < len(reuse):
                px = reuse[i]
                px._p = p
                px._shape = None
                self.needs_grad = self.needs_grad or p.requires_grad
                self.proxies[p.name] = px
            else:
                px = self.wrap_input(p)
            out.append(px)
        return out

    def reset(self, builder):
        """A new builder: the next segment of a split program (split.py)."""
        self.builder = builder
        self.proxies = {}
        self.lifted = []
        self._lifted_ids = {}
        self.needs_grad = False
        self.written_without_grad = set()
        self.input_index = {}

    def lift(self, t: torch.Tensor) -> Proxy:
        """A real tensor met during tracing (a global, a closure variable) becomes an input."""
        px = self._lifted_ids.get(id(t))
        if px is not None:
            return px
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise NotImplementedError(
                f"keraunos: tensor subclass {type(t).__name__} is not supported (at {where()})"
            )
        with torch._C.DisableTorchFunction():
            p = self.builder.add_input(
                to_kr_dtype(t.dtype),
                to_kr_device(t.device),
                list(t.shape),
                list(t.stride()),
                t.storage_offset(),
                -1,
                t.requires_grad,
            )
        px = self.wrap_input(p)
        self.lifted.append(t)
        self._lifted_ids[id(t)] = px
        return px

    def __enter__(self):
        self._prev = current()
        _state.tracer = self
        _rng_hooks(+1)
        # The tracer's own autograd work on fake tensors (fallback.py's gradient probe) must not
        # reach the user's saved-tensor hooks: torch.utils.checkpoint's would recompute the
        # checkpointed function, this one, from inside its own trace.
        self._hooks = torch.autograd.graph.saved_tensors_hooks(_keep, _keep)
        self._hooks.__enter__()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self._hooks.__exit__(*exc)
        _rng_hooks(-1)
        _state.tracer = self._prev
        return False


def _keep(t):
    return t


# While something is traced, torch.compiler.is_compiling() is True, as under torch.compile and
# torch.export: libraries (Hugging Face transformers' attention-mask checks, for one) then
# take their compile-friendly paths instead of branching on tensor values.
# The generator's Python API is not seen by the torch function protocol. While something is
# traced, torch.manual_seed is recorded (the program replays it on every call, in order with
# the random ops around it) and the calls that read or replace the generator's state are
# refused; outside tracing (or in another thread) the originals run.
_RNG_LOCK = threading.Lock()
_rng_depth = 0
_RNG_ORIGINALS: dict = {}
_compiling_before = False


def _manual_seed_hook(seed):
    tr = current()
    if tr is None:
        return _RNG_ORIGINALS["manual_seed"](seed)
    if isinstance(seed, Proxy):
        seed._data_dependent("torch.manual_seed(tensor)")
    record("manual_seed", "torch.manual_seed", (int(seed),), {})
    return torch.default_generator


def _get_rng_state_hook():
    """The generator's state, read in the program in order with the random ops around it."""
    tr = current()
    if tr is None:
        return _RNG_ORIGINALS["get_rng_state"]()
    from . import fallback

    return fallback.call(tr, _RNG_ORIGINALS["get_rng_state"], (), {}, random=True)


def _set_rng_state_hook(new_state):
    tr = current()
    if tr is None:
        return _RNG_ORIGINALS["set_rng_state"](new_state)
    record("set_rng_state", "torch.set_rng_state", (new_state,), {})


def _refused_rng_hook(name):
    def hook(*args, **kwargs):
        if current() is None:
            return _RNG_ORIGINALS[name](*args, **kwargs)
        raise NotImplementedError(
            f"keraunos: torch.{name} is not supported inside a jitted function (at {where()}); "
            "torch.manual_seed is"
        )

    return hook


def user_function_modes() -> list:
    """The torch function modes on the stack other than tracers' (bottom first)."""
    return [
        m
        for m in (
            torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())
        )
        if not isinstance(m, _Mode)
    ]


def _vmap_hook(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None, **kw):
    """torch.vmap while tracing: the vmapped function, called on traced tensors (or reading
    traced tensors from its closures), runs through torch as one fallback call."""
    real = _RNG_ORIGINALS["vmap"](func, in_dims, out_dims, randomness, chunk_size=chunk_size, **kw)

    def vmapped(*args, **kwargs):
        from . import fallback

        tr = current()
        if tr is None:
            return real(*args, **kwargs)
        leaves = [*args, *kwargs.values()]
        if not any(isinstance(a, Proxy) for a in leaves) and not fallback._captured_proxies(func):
            return real(*args, **kwargs)  # on fake or real tensors (inside a fallback call)
        return fallback.call(tr, real, args, kwargs, closure_of=func)

    vmapped._kr_vmap_of = func
    return vmapped


def _rng_hooks(delta):
    global _rng_depth, _compiling_before
    with _RNG_LOCK:
        _rng_depth += delta
        if delta > 0 and _rng_depth == 1:
            _compiling_before = torch.compiler._is_compiling_flag
            torch.compiler._is_compiling_flag = True
            hooks = {
                "manual_seed": _manual_seed_hook,
                "get_rng_state": _get_rng_state_hook,
                "set_rng_state": _set_rng_state_hook,
            }
            for name in ("seed", "initial_seed"):
                hooks[name] = _refused_rng_hook(name)
            for name, hook in hooks.items():
                _RNG_ORIGINALS[name] = getattr(torch.random, name)
                setattr(torch, name, hook)
                setattr(torch.random, name, hook)
            _RNG_ORIGINALS["vmap"] = torch.vmap
            torch.vmap = torch.func.vmap = _vmap_hook
            _install_unbound_hooks()
        elif delta < 0 and _rng_depth == 0:
            _remove_unbound_hooks()
            torch.compiler._is_compiling_flag = _compiling_before
            torch.vmap = torch.func.vmap = _RNG_ORIGINALS.pop("vmap")
            for name, orig in _RNG_ORIGINALS.items():
                setattr(torch, name, orig)
                setattr(torch.random, name, orig)


# Unbound method calls (`torch.Tensor.add_(x, y)`): the C method descriptors of TensorBase
# check their first argument's type before torch sees the call, so a proxy would be refused
# by CPython. While something is traced, torch.Tensor gets a Python function for each of them
# (not for dunders, whose type slots would change, nor for names torch.Tensor defines itself)
# that sends a proxy to `handle` and anything else to the descriptor.
_UNBOUND_HOOKED: list[str] = []


def _unbound_hook(desc):
    def method(self, *args, **kwargs):
        if isinstance(self, Proxy):
            return handle(desc, (self, *args), kwargs)
        return desc(self, *args, **kwargs)

    method.__name__ = desc.__name__
    method.__qualname__ = f"Tensor.{desc.__name__}"
    method.__doc__ = desc.__doc__
    method._kr_unbound_of = desc
    return method


def _install_unbound_hooks():
    own = vars(torch.Tensor)
    for name, desc in list(vars(torch._C.TensorBase).items()):
        if name.startswith("__") or name in own or type(desc).__name__ != "method_descriptor":
            continue
        setattr(torch.Tensor, name, _unbound_hook(desc))
        _UNBOUND_HOOKED.append(name)


def _remove_unbound_hooks():
    for name in _UNBOUND_HOOKED:
        delattr(torch.Tensor, name)
    _UNBOUND_HOOKED.clear()


def to_c(x):
    """A Python value (with proxies) -> what the C++ binder takes."""
    if isinstance(x, Proxy):
        return x._p
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, (tuple, list, torch.Size)):
        return [to_c(e) for e in x]
    if isinstance(x, torch.dtype):
        return to_kr_dtype(x)
    if isinstance(x, torch.device):
        return to_kr_device(x)
    if isinstance(x, torch.Tensor):
        return current().lift(x)._p
    if isinstance(x, (slice, type(Ellipsis))):
        if isinstance(x, slice):
            for part in (x.start, x.stop, x.step):
                if isinstance(part, Proxy):
                    part._data_dependent("a slice bound")
        return x
    if isinstance(x, torch.memory_format):
        raise NotImplementedError(
            f"keraunos: memory_format arguments are not supported (at {where()})"
        )
    raise TypeError(f"keraunos: unsupported argument of type {type(x).__name__} (at {where()})")


def from_c(x):
    """C++ outputs -> proxies (the same Python object for the same proxy)."""
    if isinstance(x, _C.TensorProxy):
        tr = current()
        px = tr.proxies.get(x.name)
        if px is None:
            px = tr.new_proxy(x)
        return px
    if isinstance(x, tuple):
        return tuple(from_c(e) for e in x)
    return x


def handle(func, args, kwargs):
    from . import fallback
    from .torch_map import lookup

    tr = current()
    if tr is None:
        raise RuntimeError(
            f"keraunos: a traced tensor escaped its jitted function and was used by {callable_name(func)}"
        )
    if _has_proxy(args, kwargs):
        autocast = _autocast_state()
        if autocast:
            # Inside a torch.autocast region every call runs through torch, in the same region
            # when the program runs: autocast's casts are eager's own.
            return fallback.call(tr, func, args, kwargs, autocast=autocast)
        if tr.needs_grad and not tr.grad_at_start and torch.is_grad_enabled():
            # torch.enable_grad() inside a call made under no_grad: autograd records these
            # calls in eager, so torch runs them, in such a region, when the program runs.
            return fallback.call(tr, func, args, kwargs, enable_grad=True)
    entry = lookup(func)
    if entry is None:
        if func in _PASSTHROUGH or (func in _METADATA and not _has_proxy(args, kwargs)):
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        return fallback.call(tr, func, args, kwargs)
    n_before = tr.n_recorded
    try:
        return entry(tr, args, kwargs)
    except (TypeError, NotImplementedError) as e:
        # A form of the call the mapping does not take (an argument it does not know, a
        # keyword it refuses): torch runs it, or raises eager's own error for it. Only when
        # the entry recorded nothing, and not for the core's refusals of what cannot be exact.
        if getattr(e, "_kr_final", False) or tr.n_recorded != n_before:
            raise
        return fallback.call(tr, func, args, kwargs)


def _autocast_state() -> tuple:
    """((device_type, dtype, cache_enabled), ...) of the autocast regions in force."""
    with torch._C.DisableTorchFunction():
        return tuple(
            (d, torch.get_autocast_dtype(d), torch.is_autocast_cache_enabled())
            for d in ("cpu", "cuda")
            if torch.is_autocast_enabled(d)
        )


def record(op: str, display: str, args, kwargs):
    """Records one op through the C++ builder and returns proxies."""
    tr = current()
    if (
        tr.needs_grad
        and tr.grad_at_start
        and op in _INPLACE_OPS
        and args
        and isinstance(args[0], Proxy)
        and args[0]._p.requires_grad
        and not torch.is_grad_enabled()
    ):
        # An in-place op with grad mode off: autograd does not record eager's write (it is
        # allowed on a leaf). It writes through a detached alias, and so does the program's
        # write-back of an input (passes/functionalize.cpp).
        tr.written_without_grad.add(args[0]._p.storage_id)
        args = (record("detach", "torch.Tensor.detach", (args[0],), {}), *args[1:])
    file, line, fn = user_location()
    if tr.written_without_grad and torch.is_grad_enabled() and tr.grad_at_start:
        _check_no_recorded_read_after_unrecorded_write(tr, display, args, kwargs, file, line)
    try:
        out = tr.builder.call(
            op,
            [to_c(a) for a in args],
            {k: to_c(v) for k, v in kwargs.items()},
            display,
            file,
            line,
            fn,
        )
    except NotImplementedError as e:
        e._kr_final = True  # the core refuses it: no fallback would be exact either
        raise
    tr.n_recorded += 1
    res = from_c(out)
    if tr.needs_grad and tr.grad_at_start and op not in _NO_DETACH and not torch.is_grad_enabled():
        # Computed with grad mode off (torch.no_grad, set_grad_enabled(False)): eager's result
        # does not require grad, and autograd must not see through it when the program runs.
        res = _detached(res)
    return res


_NO_DETACH = {"detach", "copy_", "manual_seed", "set_rng_state"}
# The op table's in-place ops: each writes its first tensor argument.
_INPLACE_OPS = frozenset(n for n in _C.op_names() if _C.op_info(n)["inplace"])


def _check_no_recorded_read_after_unrecorded_write(tr, display, args, kwargs, file, line):
    """Eager's autograd sees a tensor written under no_grad as the tensor it was (a leaf stays
    the leaf); a functional program sees a new value computed from the old one. Until the
    program can express that, autograd-recorded reads of such a tensor are refused."""

    def proxies(a):
        if isinstance(a, Proxy):
            yield a
        elif isinstance(a, (list, tuple)):
            for e in a:
                yield from proxies(e)

    for a in (*args, *kwargs.values()):
        for px in proxies(a):
            if px._p.requires_grad and px._p.storage_id in tr.written_without_grad:
                raise NotImplementedError(
                    f"keraunos: {display} reads a tensor that requires grad after an in-place "
                    f"write to it under torch.no_grad, with autograd recording (at {file}:{line}); "
                    "this is not supported yet: move the write after its last use, or read "
                    "x.detach()"
                )


def _detached(res):
    if isinstance(res, Proxy):
        return record("detach", "torch.Tensor.detach", (res,), {})
    if isinstance(res, tuple):
        return tuple(_detached(r) for r in res)
    return res


def _has_proxy(args, kwargs):
    return any(isinstance(a, Proxy) for a in args) or any(
        isinstance(v, Proxy) for v in kwargs.values()
    )


# Metadata of real tensors (globals, closures) may be read while tracing.
_METADATA = {
    torch.Tensor.size,
    torch.Tensor.dim,
    torch.Tensor.stride,
    torch.Tensor.numel,
    torch.Tensor.is_contiguous,
    torch.Tensor.element_size,
    torch.Tensor.is_floating_point,
    torch.Tensor.storage_offset,
    torch.Tensor.__len__,
}
for _name in (
    "shape",
    "dtype",
    "device",
    "ndim",
    "requires_grad",
    "is_cuda",
    "is_cpu",
    "layout",
    "is_sparse",
    "is_quantized",
    "is_nested",
    "grad_fn",
    "names",
    "is_leaf",
):
    _attr = getattr(torch.Tensor, _name, None)
    if _attr is not None and hasattr(_attr, "__get__"):
        _METADATA.add(_attr.__get__)

# Torch calls that touch no tensor data and are fine to run as they are.
_PASSTHROUGH = {
    torch.is_tensor,
    torch.get_default_dtype,
    torch.is_grad_enabled,
    torch.is_floating_point,
    torch.Tensor.__format__,
    torch.Size,
}

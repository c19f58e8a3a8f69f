"""keraunos: a tracing JIT compiler for PyTorch programs."""

from . import (
    _C,  # noqa: F401
    torch_map,  # noqa: F401  (registers the mapping table)
)
from .dynamo import compile, compile_stats, explain
from .jit import jit, last_traces
from .options import options, set_option

__all__ = ["jit", "last_traces", "compile_stats", "compile", "explain", "options", "set_option"]
__version__ = "0.1.0"

from .dynamo import _register  # noqa: E402

_register()  # torch.compile(fn, backend="keraunos")
del _register

"""keraunos: a tracing JIT compiler for PyTorch programs."""

from . import (
    _C,  # noqa: F401
    torch_map,  # noqa: F401  (registers the mapping table)
)
from .jit import compile_stats, jit, last_traces

__all__ = ["jit", "last_traces", "compile_stats"]
__version__ = "0.1.0"

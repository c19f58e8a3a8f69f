"""keraunos: a tracing JIT compiler for PyTorch programs."""

from . import (
    _C,  # noqa: F401
    torch_map,  # noqa: F401  (registers the mapping table)
)
from .dynamo import compile, compile_stats, explain
from .jit import jit, last_traces
from .options import options, set_option

__all__ = [
    "jit",
    "last_traces",
    "compile_stats",
    "compile",
    "explain",
    "options",
    "set_option",
    "empty_cpu_pool",
]
__version__ = "0.1.0"


def empty_cpu_pool() -> None:
    """Releases the memory keraunos keeps for reuse on the CPU: the buffers of 64 KiB or more
    its CPU programs made (kernel outputs, matmul results) that no tensor uses any more (the
    `cpu_pool` option; csrc/keraunos/python/cpu_pool.h). Tensors still alive keep theirs."""
    _C.empty_cpu_pool()


from .dynamo import _register  # noqa: E402

_register()  # torch.compile(fn, backend="keraunos")
del _register

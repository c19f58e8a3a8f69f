"""NVRTC and the CUDA driver from Python: where the `nvidia-cuda-nvrtc` wheel put libnvrtc.

The C++ loader (csrc/keraunos/runtime/nvrtc.cpp) does not guess site-packages; this module
tells it which folders of the installed `nvidia` packages to try, on first use. Everything
else is the C++ functions of `keraunos._C`, re-exported with that set-up done first.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from . import _C

# Folders of the NVIDIA wheels that hold libnvrtc: CUDA 13's wheels share `nvidia/cu13`,
# CUDA 12's `nvidia-cuda-nvrtc-cu12` has its own `nvidia/cuda_nvrtc`.
_NVRTC_SUBDIRS = ("cu13/lib", "cuda_nvrtc/lib")


def nvrtc_search_dirs() -> list[str]:
    """Library folders of the installed `nvidia` wheels that contain a libnvrtc."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for base in spec.submodule_search_locations:  # a namespace package: maybe several roots
        for sub in _NVRTC_SUBDIRS:
            d = os.path.join(base, sub)
            if os.path.isdir(d) and any(f.startswith("libnvrtc.so") for f in os.listdir(d)):
                dirs.append(d)
    return dirs


@functools.cache
def configure() -> None:
    """Hands the wheel folders to the C++ loader; runs once per process (the cache)."""
    _C.set_nvrtc_search_dirs(nvrtc_search_dirs())


def nvrtc_available() -> tuple[bool, str]:
    """(True, "") when NVRTC loads; else (False, why not)."""
    configure()
    return _C.nvrtc_available()


def nvrtc_version() -> tuple[int, int]:
    configure()
    return _C.nvrtc_version()


def compile_cuda(
    source: str, name: str, arch: int = 90, options: list[str] | None = None, cache: bool = True
) -> bytes:
    """CUDA C++ -> CUBIN for sm_<arch>, through the kernel cache unless `cache=False`."""
    configure()
    return _C.compile_cuda(source, name, arch, options or [], cache)


def cuda_driver_available() -> tuple[bool, str]:
    """(True, "") when libcuda loads and sees a device; else (False, why not)."""
    return _C.cuda_driver_available()

"""The runtime layer under the CUDA fusion executor: NVRTC compiles header-free CUDA C++ to
CUBIN (on CPU-only CI too), the CUBIN disk cache, and the CUDA driver (launches on a GPU)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest
import torch

from keraunos import _C, _cuda

NVRTC_OK, NVRTC_WHY = _cuda.nvrtc_available()
needs_nvrtc = pytest.mark.skipif(not NVRTC_OK, reason=f"NVRTC unavailable: {NVRTC_WHY}")
if not NVRTC_OK:  # say why in the log, not only in the skip reason
    print(f"[test_nvrtc] skipping NVRTC compilation: {NVRTC_WHY}", file=sys.stderr)

KERNEL = textwrap.dedent("""\
    extern "C" __global__ void k(float* y, const float* x, long n) {
      long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
      if (i < n) y[i] = x[i] * 2.0f + 1.0f;
    }
""")


def run_python(code: str, **env: str) -> dict:
    """Runs `code` in a fresh interpreter (a fresh process-wide cache and loader) and returns
    the JSON it prints last."""
    full_env = dict(os.environ, **env)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_nvrtc
def test_compiles_header_free_kernel_to_cubin():
    cubin = _cuda.compile_cuda(KERNEL, "k", 90, cache=False)
    assert cubin[:4] == b"\x7fELF"
    assert _cuda.nvrtc_version() >= (12, 0)


@needs_nvrtc
def test_warnings_are_returned_in_the_log():
    src = KERNEL + "__device__ int unused() { int a; return 0; }\n"
    cubin, log = _C.compile_cuda_log(src, "warn", 90)
    assert cubin[:4] == b"\x7fELF"
    assert "declared but never referenced" in log


@needs_nvrtc
def test_syntax_error_raises_with_log_and_source():
    src = 'extern "C" __global__ void broken(float* y) { y[0] = 1.0f +; }\n'
    with pytest.raises(AssertionError) as info:  # an internal error: we generated the source
        _cuda.compile_cuda(src, "broken_kernel", 90, cache=False)
    msg = str(info.value)
    assert "NVRTC failed to compile the generated kernel 'broken_kernel'" in msg
    assert "expected an expression" in msg  # the NVRTC log
    assert "y[0] = 1.0f +;" in msg  # the source
    assert "--gpu-architecture=sm_90" in msg


@needs_nvrtc
def test_bad_arch_is_a_value_error():
    with pytest.raises(ValueError, match="sm_arch"):
        _cuda.compile_cuda(KERNEL, "k", 9, cache=False)


@needs_nvrtc
def test_disk_cache_hits_and_rebuilds_corrupt_files(tmp_path):
    code = textwrap.dedent(f"""\
        import glob, json, os
        from keraunos import _C, _cuda
        src = {KERNEL!r}
        first = _cuda.compile_cuda(src, "k")
        again = _cuda.compile_cuda(src, "k")          # memory
        _C.kernel_cache_clear_memory()
        from_disk = _cuda.compile_cuda(src, "k")      # disk
        (path,) = glob.glob(os.path.join(_C.kernel_cache_stats()["dir"], "*.cubin"))
        size = os.path.getsize(path)
        with open(path, "r+b") as f:                  # truncate: a crash mid-copy
            f.truncate(size - 100)
        _C.kernel_cache_clear_memory()
        after_truncate = _cuda.compile_cuda(src, "k")
        with open(path, "r+b") as f:                  # flip a payload byte: a disk error
            f.seek(size - 7)
            b = f.read(1)
            f.seek(size - 7)
            f.write(bytes([b[0] ^ 0xFF]))
        _C.kernel_cache_clear_memory()
        after_flip = _cuda.compile_cuda(src, "k")
        with open(path, "rb") as f:
            header = f.read(4)
        meta = open(path[: -len(".cubin")] + ".meta").read()
        print(json.dumps(dict(
            stats=_C.kernel_cache_stats(), path=path, size=size, final_size=os.path.getsize(path),
            header=header == b"\x7fELF", meta=meta,
            same=first == again == from_disk == after_truncate == after_flip,
            elf=first[:4] == b"\\x7fELF")))
    """)
    r = run_python(code, KERAUNOS_CACHE_DIR=str(tmp_path))
    s = r["stats"]
    assert r["same"] and r["elf"]
    assert s["dir"] == str(tmp_path / "cuda")
    assert os.path.dirname(r["path"]) == str(tmp_path / "cuda")
    assert s["memory_hits"] == 1 and s["disk_hits"] == 1
    assert s["corrupt_files"] == 2 and s["misses"] == 3  # the first compile + two rebuilds
    # The CUBIN itself (the one cache's format: the artifact and its .meta), rewritten whole.
    assert r["header"] and r["final_size"] == r["size"]
    assert r["meta"].startswith(f"keraunos-cache-meta 1\nsize {r['size']}\n")
    assert s["write_failures"] == 0

    # Another process finds the CUBIN on disk: no compile.
    code2 = textwrap.dedent(f"""\
        import json
        from keraunos import _C, _cuda
        _cuda.compile_cuda({KERNEL!r}, "other_name")
        print(json.dumps(_C.kernel_cache_stats()))
    """)
    s2 = run_python(code2, KERAUNOS_CACHE_DIR=str(tmp_path))
    assert s2["disk_hits"] == 1 and s2["misses"] == 0

    # Different options or architecture: a different key.
    code3 = textwrap.dedent(f"""\
        import json
        from keraunos import _C, _cuda
        _cuda.compile_cuda({KERNEL!r}, "k", 90, ["--use_fast_math"])
        _cuda.compile_cuda({KERNEL!r}, "k", 80)
        print(json.dumps(_C.kernel_cache_stats()))
    """)
    s3 = run_python(code3, KERAUNOS_CACHE_DIR=str(tmp_path))
    assert s3["misses"] == 2 and s3["disk_hits"] == 0


def test_missing_nvrtc_is_reported_not_a_crash():
    code = textwrap.dedent("""\
        import json
        from keraunos import _cuda
        ok, why = _cuda.nvrtc_available()
        try:
            _cuda.compile_cuda('extern "C" __global__ void k() {}', "k")
            err = None
        except RuntimeError as e:
            err = str(e)
        print(json.dumps(dict(ok=ok, why=why, err=err)))
    """)
    r = run_python(code, KERAUNOS_NVRTC_LIBRARY="/nonexistent/libnvrtc.so.13")
    assert not r["ok"]
    assert "/nonexistent/libnvrtc.so.13" in r["why"]
    assert r["err"] is not None and "CUDA kernels need NVRTC" in r["err"]


def test_search_dirs_come_from_the_nvidia_wheels():
    dirs = _cuda.nvrtc_search_dirs()
    assert all(os.path.isdir(d) for d in dirs)
    if NVRTC_OK and "KERAUNOS_NVRTC_LIBRARY" not in os.environ and dirs:
        assert os.path.dirname(_C.nvrtc_library_path()) in dirs


def test_cuda_driver_unavailable_without_gpu():
    ok, why = _cuda.cuda_driver_available()
    if torch.cuda.is_available():
        assert ok, why
        return
    assert not ok
    assert why  # e.g. "the CUDA driver (libcuda.so.1) was not found: ..."


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@needs_nvrtc
def test_launch_cubin_on_torch_stream():
    major, minor = _C.cuda_compute_capability(torch.cuda.current_device())
    cubin = _cuda.compile_cuda(KERNEL, "k", major * 10 + minor, cache=False)
    n = 100_003
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    module = _C.CudaModule(cubin, torch.cuda.current_device())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        args = struct.pack("QQq", y.data_ptr(), x.data_ptr(), n)  # (float*, const float*, long)
        module.launch(
            "k", ((n + 255) // 256, 1, 1), (256, 1, 1), args,
            stream=torch.cuda.current_stream().cuda_stream,
        )  # fmt: skip
    stream.synchronize()
    torch.testing.assert_close(y, x * 2 + 1)
    with pytest.raises(RuntimeError, match="cuModuleGetFunction"):
        module.launch("missing", (1, 1, 1), (1, 1, 1), b"")

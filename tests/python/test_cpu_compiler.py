"""The CPU compile-and-load runtime (runtime/cpu_compiler.h): kernels of the void** ABI compiled
by the system C++ compiler, run on torch tensors' memory, cached in memory and on disk; a
corrupt cache entry, several processes compiling at once, compile errors and a machine without
a compiler."""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

import pytest
import torch

from keraunos import _C

AFFINE = r"""
#include <cstdint>
// y[i] = x[i] * 2 + 1 over n floats
extern "C" void affine(void** ptrs, const int64_t* args) {
  const float* x = static_cast<const float*>(ptrs[0]);
  float* y = static_cast<float*>(ptrs[1]);
  const int64_t n = args[0];
#pragma omp parallel for if (n > 4096)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 2.0f + 1.0f;
}
"""


# Decided without probing (which would write to the user's cache folder at collection).
needs_compiler = pytest.mark.skipif(
    not any(
        shutil.which(c)
        for c in (os.environ.get("CXX", "").split()[:1] or ["c++"]) + ["g++", "clang++"]
    ),
    reason="no C++ compiler",
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh KERAUNOS_CACHE_DIR and a runtime that reads it (and nothing cached in memory)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("KERAUNOS_CACHE_DIR", str(root))
    monkeypatch.delenv("KERAUNOS_CXXFLAGS", raising=False)
    _C._cpu_reset()
    yield root / "cpu"
    _C._cpu_reset()


def run_affine(lib, x):
    y = torch.empty_like(x)
    lib.call("affine", [x.data_ptr(), y.data_ptr()], [x.numel()])
    return y


def entry_files(lib):
    base = lib.path[: -len(".so")]
    return base + ".so", base + ".cpp", base + ".meta"


def replace_file(path, data):
    # A new inode: writing in place into a file some process has mapped could crash it.
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)


@needs_compiler
def test_compile_and_run(cache_dir):
    info = _C.cpu_compiler_info()
    print(f"\ncompiler: {info['path']} ({info['identity']}), flags: {' '.join(info['flags'])}")
    assert info["cache_dir"] == str(cache_dir)
    lib = _C.cpu_compile(AFFINE, "affine")
    for n in (1, 1000, 100_000):  # the last one runs in OpenMP threads when available
        x = torch.randn(n)
        assert torch.equal(run_affine(lib, x), x * 2 + 1)
    so, cpp, meta = entry_files(lib)
    assert os.path.dirname(so) == str(cache_dir)
    assert open(cpp).read().startswith(AFFINE)  # then the cache stamp
    assert open(meta).read().startswith("keraunos-cache-meta 1\n")
    stats = _C.cpu_cache_stats()
    assert (stats["compiles"], stats["disk_hits"], stats["memory_hits"]) == (1, 0, 0)
    print(f"cold compile: {stats['compile_ms']:.1f} ms")


@needs_compiler
def test_memory_hit(cache_dir):
    a = _C.cpu_compile(AFFINE, "affine")
    b = _C.cpu_compile(AFFINE, "affine")
    assert a.path == b.path and a.symbol_address("affine") == b.symbol_address("affine")
    stats = _C.cpu_cache_stats()
    assert (stats["compiles"], stats["memory_hits"]) == (1, 1)


# Loads the extension by itself (no torch import: the child starts in ~0.1 s), optionally waits
# for a gate file so several children compile at the same moment, compiles AFFINE from a file,
# runs it on ctypes arrays and prints what happened as JSON.
CHILD = r"""
import ctypes, importlib.util, json, os, sys, time
spec = importlib.util.spec_from_file_location("keraunos._C", sys.argv[1])
_C = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_C)
source = open(sys.argv[2]).read()
gate = sys.argv[3]
if gate != "-":
    open(f"{gate}.ready.{os.getpid()}", "w").close()
    while not os.path.exists(gate):
        time.sleep(0.001)
t0 = time.perf_counter()
lib = _C.cpu_compile(source, "affine")
ms = (time.perf_counter() - t0) * 1e3
n = 10000
x = (ctypes.c_float * n)(*range(n))
y = (ctypes.c_float * n)()
lib.call("affine", [ctypes.addressof(x), ctypes.addressof(y)], [n])
print(json.dumps({"ok": all(y[i] == 2 * i + 1 for i in range(n)), "ms": ms,
                  "stats": _C.cpu_cache_stats()}))
"""


def child_command(source_file, gate="-"):
    return [sys.executable, "-c", CHILD, _C.__file__, str(source_file), str(gate)]


@needs_compiler
def test_disk_hit_in_subprocess(cache_dir, tmp_path):
    _C.cpu_compile(AFFINE, "affine")
    src = tmp_path / "affine.cpp"
    src.write_text(AFFINE)
    out = subprocess.run(child_command(src), capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["ok"]
    assert (result["stats"]["disk_hits"], result["stats"]["compiles"]) == (1, 0)
    print(
        f"\nnew process, first kernel from disk: {result['ms']:.2f} ms "
        f"(compiler --version + probe record + load)"
    )


@needs_compiler
def test_warm_load_time(cache_dir):
    """Issue 4's target is <= 5 ms per kernel loaded from the disk cache; printed, not asserted."""
    sources = [AFFINE.replace("2.0f", f"{k + 2}.0f") for k in range(12)]
    for s in sources:
        _C.cpu_compile(s, "affine")
    cold = _C.cpu_cache_stats()
    _C._cpu_reset()  # the memory map is gone; the disk cache stays
    t0 = time.perf_counter()
    libs = [_C.cpu_compile(sources[0], "affine")]
    first_ms = (time.perf_counter() - t0) * 1e3
    per_kernel = []
    for s in sources[1:]:
        t0 = time.perf_counter()
        libs.append(_C.cpu_compile(s, "affine"))
        per_kernel.append((time.perf_counter() - t0) * 1e3)
    stats = _C.cpu_cache_stats()
    assert (stats["disk_hits"], stats["compiles"]) == (len(sources), 0)
    x = torch.randn(100)
    for k, lib in enumerate(libs):
        assert torch.equal(run_affine(lib, x), x * (k + 2) + 1)
    print(
        f"\ncold compile: {cold['compile_ms'] / len(sources):.1f} ms/kernel; "
        f"warm load (disk cache): median {statistics.median(per_kernel):.3f} ms/kernel, "
        f"max {max(per_kernel):.3f} ms (verify + dlopen: "
        f"{stats['disk_load_ms'] / len(sources):.3f} ms/kernel); "
        f"first after reset (runs `c++ --version`): {first_ms:.2f} ms"
    )


@needs_compiler
@pytest.mark.parametrize("damage", ["garbage", "truncated", "no_meta", "bad_meta"])
def test_corrupt_entry_is_recompiled(cache_dir, damage):
    lib = _C.cpu_compile(AFFINE, "affine")
    so, _, meta = entry_files(lib)
    good = open(so, "rb").read()
    del lib
    _C._cpu_reset()
    if damage == "garbage":
        replace_file(so, b"\x7fELF not really" * 100)
    elif damage == "truncated":
        replace_file(so, good[: len(good) // 2])
    elif damage == "no_meta":
        os.unlink(meta)
    else:
        replace_file(meta, b"keraunos-cache-meta 1\nsize 12\nfnv1a64 0000000000000000\n")
    lib = _C.cpu_compile(AFFINE, "affine")
    stats = _C.cpu_cache_stats()
    assert (stats["disk_hits"], stats["compiles"]) == (0, 1)
    x = torch.randn(1000)
    assert torch.equal(run_affine(lib, x), x * 2 + 1)
    assert os.path.getsize(so) == len(open(so, "rb").read()) > 1000
    del lib
    _C._cpu_reset()
    _C.cpu_compile(AFFINE, "affine")  # the repaired entry is a disk hit
    assert _C.cpu_cache_stats()["disk_hits"] == 1


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@needs_compiler
def test_entry_built_from_other_code_is_not_loaded(cache_dir):
    """A `<key>.so` that is intact (its .meta matches) but was built from another source, as
    another keraunos build or version sharing the cache folder can leave there, must not run
    under this key: it is rebuilt. Before libraries carried the stamp of their key, this loaded
    the other kernel (here x * 7 + 1 instead of x * 2 + 1)."""
    lib = _C.cpu_compile(AFFINE, "affine")
    so, _, meta = entry_files(lib)
    other = _C.cpu_compile(AFFINE.replace("2.0f", "7.0f"), "affine")
    foreign = open(other.path, "rb").read()
    del lib, other
    _C._cpu_reset()  # both libraries unloaded: nothing in the process answers for the path
    replace_file(so, foreign)
    replace_file(
        meta,
        f"keraunos-cache-meta 1\nsize {len(foreign)}\nfnv1a64 {fnv1a64(foreign):016x}\n".encode(),
    )
    lib = _C.cpu_compile(AFFINE, "affine")
    x = torch.randn(1000)
    assert torch.equal(run_affine(lib, x), x * 2 + 1)
    stats = _C.cpu_cache_stats()
    assert (stats["disk_hits"], stats["compiles"]) == (0, 1)


@needs_compiler
def test_processes_compile_the_same_kernel_at_once(cache_dir, tmp_path):
    src = tmp_path / "affine.cpp"
    src.write_text(AFFINE + "// concurrent\n")
    gate = tmp_path / "go"
    n = 4
    procs = [
        subprocess.Popen(
            child_command(src, gate), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(n)
    ]
    deadline = time.time() + 60
    while len(list(tmp_path.glob("go.ready.*"))) < n and time.time() < deadline:
        time.sleep(0.005)
    gate.touch()  # all children compile from here on, into an empty cache
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert all(r["ok"] for r in results)
    assert sum(r["stats"]["compiles"] + r["stats"]["disk_hits"] for r in results) == n
    names = sorted(os.listdir(cache_dir))
    assert not [f for f in names if ".tmp." in f or f.startswith("probe")], names
    assert len([f for f in names if f.endswith(".so")]) == 1
    print(f"\n{n} processes at once: {sum(r['stats']['compiles'] for r in results)} compiled")


@needs_compiler
def test_compile_error_shows_the_compiler_output(cache_dir):
    bad = (
        '#include <cstdint>\nextern "C" void f(void** p, const int64_t* a) { undeclared_x = 1; }\n'
    )
    with pytest.raises(AssertionError, match="undeclared_x") as e:
        _C.cpu_compile(bad, "f")
    msg = str(e.value)
    assert "the C++ compiler failed" in msg
    saved = msg.split("source: ")[1].split("\n")[0]
    assert saved.startswith(str(cache_dir)) and open(saved).read().startswith(bad)
    assert not [f for f in os.listdir(cache_dir) if f.endswith(".so")]


@needs_compiler
def test_missing_symbol(cache_dir):
    with pytest.raises(AssertionError, match="symbol 'nope' not found"):
        _C.cpu_compile(AFFINE, "nope")


@needs_compiler
def test_extra_flags_are_part_of_the_key(cache_dir, monkeypatch):
    src = AFFINE.replace("2.0f", "KR_SCALE")
    monkeypatch.setenv("KERAUNOS_CXXFLAGS", "-DKR_SCALE=3.0f")
    _C._cpu_reset()
    assert _C.cpu_compiler_info()["flags"][-1] == "-DKR_SCALE=3.0f"
    a = _C.cpu_compile(src, "affine")
    monkeypatch.setenv("KERAUNOS_CXXFLAGS", "-DKR_SCALE=5.0f")
    _C._cpu_reset()
    b = _C.cpu_compile(src, "affine")
    assert a.path != b.path
    x = torch.randn(10)
    assert torch.equal(run_affine(a, x), x * 3 + 1)
    assert torch.equal(run_affine(b, x), x * 5 + 1)


def test_no_compiler(cache_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "/nonexistent")
    _C._cpu_reset()
    info = _C.cpu_compiler_info()
    if info["available"]:  # CXX is missing but c++, g++ or clang++ on PATH stands in
        assert info["path"] != "/nonexistent" and "CXX" not in info["reason"]
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    _C._cpu_reset(search_path=str(empty))
    info = _C.cpu_compiler_info()
    assert not info["available"]
    assert "no C++ compiler found" in info["reason"] and "CXX=/nonexistent" in info["reason"]
    with pytest.raises(_C.CpuCompilerUnavailable, match=re.escape("no C++ compiler found")):
        _C.cpu_compile(AFFINE, "affine")
    assert issubclass(_C.CpuCompilerUnavailable, RuntimeError)

"""Shared by benchmarks/cpu.py and benchmarks/gpu.py: the functions benchmarked, the
competitors, timing, cold/warm compile-time measurement in subprocesses, the machine
description and the markdown tables. Not a benchmark itself.

Competitors:
  eager     the function as written,
  compile   torch.compile(fn, dynamic=False): the default backend (Inductor), mode=None. Static
            shapes because keraunos specializes on shapes too, and because a second shape of the
            same function (softmax on two shapes) would otherwise make Dynamo recompile it with
            dynamic shapes, a different and usually slower kernel,
  keraunos  keraunos.jit(fn).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import keraunos

COMPETITORS = ("eager", "compile", "keraunos")
NAMES = {"eager": "eager", "compile": "torch.compile", "keraunos": "keraunos"}
RESULT_TAG = "@@bench-result "


# ---------------------------------------------------------------------------------------------
# The functions. Each takes tensors only, so every competitor sees the same call.


def chain10(x):
    """The 10-op elementwise chain of benchmarks/overhead.py: 4 transcendental ops (sin, exp,
    sqrt, tanh) among 6 cheap ones, one input read and one output written. With 4 transcendental
    ops per element it is compute-heavy on a CPU and bandwidth-bound on a GPU."""
    y = x.sin()
    y = y * 2
    y = y + 1
    y = y.exp()
    y = y - x
    y = y.abs()
    y = y.sqrt()
    y = y / 3
    y = y.tanh()
    return y.neg()


def gelu(x, y, z):
    return F.gelu(x) * y + z


def softmax(x):
    return torch.softmax(x, -1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


RMS_EPS = 1e-6


def rms_norm(x, w):
    """HF's LlamaRMSNorm.forward: statistics in float32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + RMS_EPS)
    return w * h.to(dtype)


def rms_norm_fn(x, w):
    """The same normalization through F.rms_norm (keraunos maps it: torch_map/nn.py)."""
    return F.rms_norm(x, (x.shape[-1],), w, eps=RMS_EPS)


def copy(x, y):
    return y.copy_(x)


def _rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def cross_entropy(logits, target):
    """An LM's loss over its vocabulary: log-softmax of each row and the target's logit."""
    return F.cross_entropy(logits, target)


def dropout_residual(x, residual):
    """A transformer block's `residual + dropout(h)` in training mode."""
    return residual + F.dropout(x, 0.1, training=True)


def check_dropout_residual(out, ref, inputs):
    """Draws differ between competitors (each has its own generator): every element must be
    the residual or the residual plus x / 0.9, about 10% the former."""
    x, residual = inputs
    kept = out != residual
    want = torch.where(kept, residual + x / 0.9, residual)
    rate = 1 - kept.float().mean().item()
    if abs(rate - 0.1) > 0.01:
        return f"MISMATCH: dropped {rate:.4f} of the elements, not 0.1"
    return check(out, want)


def rotary(q, k, cos, sin):
    """HF's apply_rotary_pos_emb (Llama): rotate_half is two slices and a cat."""
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def llama_layer(x, ln1, wq, wk, wv, wo, ln2, wg, wu, wd, cos, sin):
    """A LLaMA-style decoder layer's forward, as HF's LlamaDecoderLayer computes it: RMSNorm,
    q/k/v projections, rotary embeddings, grouped-query attention (repeat_kv: expand and
    reshape) through SDPA, the output projection and residual, RMSNorm, the SwiGLU MLP and
    residual."""
    b, s, h = x.shape
    d = cos.shape[-1]
    nh, nkv = wq.shape[0] // d, wk.shape[0] // d
    r = x
    x = rms_norm(x, ln1)
    q = F.linear(x, wq).view(b, s, nh, d).transpose(1, 2)
    k = F.linear(x, wk).view(b, s, nkv, d).transpose(1, 2)
    v = F.linear(x, wv).view(b, s, nkv, d).transpose(1, 2)
    q, k = rotary(q, k, cos, sin)
    k = k[:, :, None].expand(b, nkv, nh // nkv, s, d).reshape(b, nh, s, d)
    v = v[:, :, None].expand(b, nkv, nh // nkv, s, d).reshape(b, nh, s, d)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = r + F.linear(a.transpose(1, 2).reshape(b, s, h), wo)
    r = x
    x = rms_norm(x, ln2)
    return r + F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def check_close(out, ref, inputs, tol=2e-2):
    """For whole layers: reductions and matmuls round differently in every competitor (bfloat16
    intermediates), so the output must match eager's in relative norm, not elementwise."""
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    return "ok" if err <= tol else f"MISMATCH: relative error {err:.3g} > {tol}"


# ---------------------------------------------------------------------------------------------
# Cases


def _randn(shape, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, dtype=dtype, device=device, generator=g)


@dataclass
class Case:
    name: str  # what --cases selects (several cases may share one: softmax on two shapes)
    fn: Callable
    shapes: list  # one shape per input
    dtype: torch.dtype
    competitors: tuple = COMPETITORS
    # bytes moved per call, given the inputs and eager's output; default: every input read
    # once and the output written once
    nbytes: Callable | None = None
    label: str = ""
    extra: dict = field(default_factory=dict)
    # input position -> n: that input holds int64 class indices in [0, n) (a loss's target)
    ints: dict = field(default_factory=dict)
    # check(out, eager's out, inputs) -> 'ok' or why not; default: equal to eager's
    check: Callable | None = None
    # input position -> factor its random values are scaled by (weights: 1 / sqrt(fan-in))
    scales: dict = field(default_factory=dict)
    # keraunos.jit's options for this case (the label says which)
    jit_options: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.label:
            self.label = self.name

    def inputs(self, device):
        def make(i, s):
            if i in self.ints:
                g = torch.Generator(device=device).manual_seed(i + 1)
                return torch.randint(0, self.ints[i], s, device=device, generator=g)
            x = _randn(s, self.dtype, device, seed=i + 1)
            return x * self.scales[i] if i in self.scales else x

        return tuple(make(i, s) for i, s in enumerate(self.shapes))

    def describe(self):
        dt = str(self.dtype).removeprefix("torch.")
        return " ".join(f"({', '.join(map(str, s))})" for s in self.shapes) + f" {dt}"

    def bytes_moved(self, inputs, out):
        if self.nbytes is not None:
            return self.nbytes(inputs, out)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return sum(t.nbytes for t in inputs) + sum(t.nbytes for t in outs)


def select(cases, spec):
    """--cases a,b: keep cases whose name is listed, in the listed order."""
    if not spec:
        return cases
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    known = {c.name for c in cases}
    bad = [w for w in wanted if w not in known]
    if bad:
        sys.exit(f"unknown case(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
    return [c for w in wanted for c in cases if c.name == w]


def make_runner(kind, fn, jit_options=None):
    if kind == "eager":
        return fn
    if kind == "compile":
        return torch.compile(fn, dynamic=False)
    if kind == "keraunos":
        return keraunos.jit(fn, **(jit_options or {}))
    raise ValueError(kind)


def _err(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:160]


def check(out, ref):
    """'ok' or the first lines of torch.testing.assert_close's complaint (never raises)."""
    try:
        torch.testing.assert_close(out, ref)
        return "ok"
    except Exception as e:  # report, don't crash the run
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        return "MISMATCH: " + " ".join(lines[:4])[:240]


# ---------------------------------------------------------------------------------------------
# Timing


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(run, args, iters, device):
    """Seconds per call over `iters` back-to-back calls: CUDA events on a GPU (device time),
    perf_counter on the CPU."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run(*args)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t = time.perf_counter()
    for _ in range(iters):
        run(*args)
    return (time.perf_counter() - t) / iters


def bench_case(case, device, rounds, round_s, max_iters=10_000, log=print):
    """Warms up (compiles) every competitor, checks it against eager, then times them in
    interleaved rounds (so drift hits all alike); each round runs enough calls to last about
    `round_s`. Returns a dict with per-competitor median seconds, bandwidth and ratios."""
    inputs = case.inputs(device)
    ref = case.fn(*inputs)  # (copy_ mutates y, idempotently)
    sync(device)
    res = {
        "case": case.name,
        "label": case.label,
        "shapes": case.describe(),
        "bytes": case.bytes_moved(inputs, ref),
        "competitors": {},
    }
    runners = {}
    for kind in case.competitors:
        r = {}
        res["competitors"][kind] = r
        try:
            run = make_runner(kind, case.fn, case.jit_options)
            t = time.perf_counter()
            out = run(*inputs)
            sync(device)
            r["first_call_s"] = time.perf_counter() - t  # in-process, caches as they are
            if kind != "eager":
                r["check"] = case.check(out, ref, inputs) if case.check else check(out, ref)
            del out
            for _ in range(2):
                run(*inputs)
            sync(device)
            once = time_calls(run, inputs, 1, device)
            r["iters"] = max(1, min(max_iters, math.ceil(round_s / max(once, 1e-9))))
            runners[kind] = run
        except Exception as e:
            r["error"] = _err(e)
            log(f"  {NAMES[kind]}: {r['error']}")
    del ref
    samples = {k: [] for k in runners}
    for _ in range(rounds):
        for k, run in runners.items():
            samples[k].append(time_calls(run, inputs, res["competitors"][k]["iters"], device))
    for k, v in samples.items():
        r = res["competitors"][k]
        r["median_s"] = statistics.median(v)
        r["min_s"] = min(v)
        r["spread"] = (max(v) - min(v)) / r["median_s"]  # (max - min) / median over rounds
        r["bandwidth"] = res["bytes"] / r["median_s"]  # bytes/s
    med = {k: res["competitors"].get(k, {}).get("median_s") for k in COMPETITORS}
    if med["keraunos"] is not None:
        for base in ("eager", "compile"):
            if med[base] is not None:
                res[f"keraunos/{base}"] = med["keraunos"] / med[base]
    return res


def host_overhead_us(run, args, calls, device):
    """Host time per call: `calls` calls without a synchronization between them (the time is
    taken before the final synchronize, which is not counted)."""
    sync(device)
    t = time.perf_counter()
    for _ in range(calls):
        run(*args)
    dt = time.perf_counter() - t
    sync(device)
    return dt / calls * 1e6


# ---------------------------------------------------------------------------------------------
# Cold / warm compile time, each in a fresh subprocess


def cache_stats(device):
    """keraunos's kernel-cache counters for the device, or None where the binding is absent."""
    C = keraunos._C
    if device.type == "cuda":
        f = getattr(C, "cuda_cache_stats", None) or getattr(C, "kernel_cache_stats", None)
    else:
        f = getattr(C, "cpu_cache_stats", None)
    if f is None:
        return None
    try:
        return dict(f())
    except Exception:
        return None


def _delta(before, after):
    if before is None or after is None:
        return None
    out = {}
    for k, v in after.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v - before.get(k, 0)
    return out


def child_main(case, backend, device):
    """Runs in the subprocess: times the first (compiling) call of one case and the median of the
    next three (the run alone), prints one tagged JSON line for the parent."""
    inputs = case.inputs(device)
    sync(device)
    if backend == "compile":
        # Import Inductor before the clock starts, as keraunos is imported before it starts:
        # the figure is the compilation, not a one-time module import.
        import torch._inductor.compile_fx  # noqa: F401
    before = cache_stats(device) if backend == "keraunos" else None
    run = make_runner(backend, case.fn, case.jit_options)
    t = time.perf_counter()
    run(*inputs)
    sync(device)
    first = time.perf_counter() - t
    later = []
    for _ in range(3):
        t = time.perf_counter()
        run(*inputs)
        sync(device)
        later.append(time.perf_counter() - t)
    res = {"first_ms": first * 1e3, "second_ms": statistics.median(later) * 1e3}
    if backend == "keraunos":
        res["cache"] = _delta(before, cache_stats(device))
        try:
            st = keraunos.compile_stats(run)
            res["jit_compile_ms"] = st.get("compile_ms_total")
            res["pass_ms"] = st.get("last_pass_ms")
        except Exception as e:
            res["stats_error"] = _err(e)
    print(RESULT_TAG + json.dumps(res), flush=True)


def _child(script, case, backend, env_extra, child_args, timeout=600):
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, script, "--_child", backend, "--_child-case", case.label, *child_args]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {p.returncode}: " + " | ".join(tail)[:300]}


def compile_times(script, case, child_args, log=print):
    """Cold (fresh cache dir) then warm (same dir, new process) first-call times for keraunos
    and torch.compile."""
    out = {"case": case.name, "label": case.label}
    with tempfile.TemporaryDirectory(prefix="keraunos-bench-") as tmp:
        envs = {
            "keraunos": {"KERAUNOS_CACHE_DIR": os.path.join(tmp, "keraunos")},
            "compile": {
                "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor"),
                "TRITON_CACHE_DIR": os.path.join(tmp, "triton"),
            },
        }
        for backend in ("keraunos", "compile"):
            for state in ("cold", "warm"):
                r = _child(script, case, backend, envs[backend], child_args)
                out[f"{backend}_{state}"] = r
                if "error" in r:
                    log(f"  {NAMES[backend]} {state}: {r['error']}")
    return out


def add_child_args(ap):
    """The private flags a compile-time subprocess is started with."""
    ap.add_argument("--_child", choices=("keraunos", "compile"), help=argparse.SUPPRESS)
    ap.add_argument("--_child-case", help=argparse.SUPPRESS)


def run_child(args, cases, device):
    case = next(c for c in cases if c.label == args._child_case)
    child_main(case, args._child, device)


# ---------------------------------------------------------------------------------------------
# Description and output


def _git_rev(path):
    try:
        p = subprocess.run(
            ["git", "-C", path, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return p.stdout.strip() or None
    except Exception:
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def meta(device, threads=None):
    kdir = os.path.dirname(os.path.abspath(keraunos.__file__))
    m = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "torch": torch.__version__,
        "keraunos": keraunos.__version__,
        "keraunos_git": _git_rev(kdir),
        "keraunos_path": kdir,
        "python": platform.python_version(),
        "command": "python "
        + shlex.join(["benchmarks/" + os.path.basename(sys.argv[0])] + sys.argv[1:]),
    }
    if threads is not None:
        m["threads"] = threads
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        m["gpu"] = p.name
        m["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        m["cuda"] = torch.version.cuda
    return m


def header(m):
    machine = m.get("gpu") or f"{m['cpu']}, {m['cores']} cores"
    if "gpu" in m:
        machine += f" ({m['gpu_memory_gib']} GiB; host {m['cpu']}, {m['cores']} cores)"
    s = f"{m['date']}, {machine}, torch {m['torch']}"
    if m.get("cuda"):
        s += f" (CUDA {m['cuda']})"
    s += f", keraunos {m['keraunos']}"
    if m.get("keraunos_git"):
        s += f" ({m['keraunos_git']})"
    if m.get("threads") is not None:
        s += f", {m['threads']} threads"
    return s + f", `{m['command']}`:"


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def fmt(v, spec=".3f", none="–"):
    return none if v is None else format(v, spec)


def compile_rows(ctimes):
    """Rows of the compile-time table (all times ms)."""
    rows = []
    for c in ctimes:
        kc, kw = c.get("keraunos_cold", {}), c.get("keraunos_warm", {})
        tc, tw = c.get("compile_cold", {}), c.get("compile_warm", {})

        def first(r):
            return "error" if "error" in r else fmt(r.get("first_ms"), ".1f")

        cold_cache = kc.get("cache") or {}
        warm_cache = kw.get("cache") or {}
        n = cold_cache.get("compiles", cold_cache.get("misses"))
        per = None
        if n and cold_cache.get("compile_ms") is not None:
            per = cold_cache["compile_ms"] / n
        kernels = "–" if not n else f"{int(n)} × {fmt(per, '.1f')}"
        hits = warm_cache.get("disk_hits")
        load = None
        if hits and warm_cache.get("disk_load_ms") is not None:
            load = warm_cache["disk_load_ms"] / hits
        loads = "–" if not hits else f"{int(hits)} × {fmt(load, '.2f')}"
        rows.append(
            [
                c["label"],
                first(kc),
                fmt(kc.get("jit_compile_ms"), ".1f"),
                kernels,
                first(kw),
                loads,
                fmt(kw.get("second_ms"), ".1f"),
                first(tc),
                first(tw),
                fmt(tw.get("second_ms"), ".1f"),
            ]
        )
    return rows


COMPILE_HEAD = [
    "case",
    "keraunos cold ms",
    "jit compile ms",
    "kernels compiled × ms",
    "keraunos warm ms",
    "disk loads × ms",
    "keraunos later call ms",
    "torch.compile cold ms",
    "torch.compile warm ms",
    "torch.compile later call ms",
]

COMPILE_NOTE = (
    "First-call times (compile + one run) in a fresh process each: cold with an empty "
    "KERAUNOS_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR, warm in a second process with the same dir; "
    "'later call' is the median of the next 3 calls in that process (the run alone). 'jit compile ms' is "
    "keraunos.compile_stats' compile_ms_total of the cold process (trace, passes, codegen); "
    "'kernels compiled' and 'disk loads' come from keraunos's kernel-cache counters "
    "(count × ms each)."
)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, default=str)
    print(f"wrote {path}")

"""Dumps the CUDA kernels keraunos generates for a benchmark case, on a machine without a GPU.

The case is traced on CPU tensors of the benchmark's shape with KERAUNOS_CHECK_CUDA_CODEGEN=1, so
each kernel also goes through the CUDA emitter for an H200-like device (sm_90; KERAUNOS_CUDA_TUNE
applies). Writes <out>/<case>.<kernel>.cu and, when nvcc is on PATH or in /usr/local/cuda/bin,
prints ptxas's register and spill report for each.

  python scripts/dev/cuda_dump.py rms_norm rms_norm_fn --out /tmp/kr-dump [--rows 16 --cols 8192]
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ["KERAUNOS_CHECK_CUDA_CODEGEN"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_util as bu  # noqa: E402
import torch  # noqa: E402

import keraunos  # noqa: E402

FUNCS = {
    "chain10": (bu.chain10, lambda r, c: [(r, c)], torch.float32),
    "gelu": (bu.gelu, lambda r, c: [(r, c)] * 3, torch.float32),
    "softmax": (bu.softmax, lambda r, c: [(r, c)], torch.float32),
    "layer_norm": (bu.layer_norm, lambda r, c: [(r, c), (c,), (c,)], torch.float32),
    "rms_norm": (bu.rms_norm, lambda r, c: [(r, c), (c,)], torch.bfloat16),
    "rms_norm_fn": (bu.rms_norm_fn, lambda r, c: [(r, c), (c,)], torch.bfloat16),
    "dropout_residual": (bu.dropout_residual, lambda r, c: [(r, c)] * 2, torch.bfloat16),
    # rows = sequence length, cols = head dim (the benchmark: 2048, 128).
    "rotary": (
        bu.rotary,
        lambda r, c: [(4, 32, r, c), (4, 8, r, c), (r, c), (r, c)],
        torch.bfloat16,
    ),
    # HF's repeat_kv (expand + reshape: a copy) of 4 key/value heads to 16 (+ 0: a returned
    # lone reshape runs through torch).
    "repeat_kv": (
        lambda k: k[:, :, None].expand(4, 4, 4, *k.shape[2:]).reshape(4, 16, *k.shape[2:]) + 0,
        lambda r, c: [(4, 4, r, c)],
        torch.bfloat16,
    ),
}


def nvcc():
    found = shutil.which("nvcc")
    return found or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+", choices=sorted(FUNCS))
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--out", default="/tmp/kr-dump")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cc = nvcc()
    for name in a.cases:
        fn, shapes, dtype = FUNCS[name]
        # The kernel's constants come from the shapes: trace at full size, do not run it.
        args = [torch.empty(s, dtype=dtype) for s in shapes(a.rows, a.cols)]
        jf = keraunos.jit(fn)
        jf(*args)
        for k in keraunos.last_traces(jf)[-1].kernels:
            if not k.cuda_check_source:
                continue
            path = out / f"{name}.{k.name}.cu"
            path.write_text(k.cuda_check_source)
            print(f"== {path}")
            if cc:
                r = subprocess.run(
                    [
                        cc,
                        "-arch=sm_90",
                        "-cubin",
                        "-std=c++17",
                        "-Xptxas",
                        "-v",
                        "-o",
                        os.devnull,
                        str(path),
                    ],
                    capture_output=True,
                    text=True,
                )
                for line in r.stderr.splitlines():
                    if "registers" in line or "spill" in line or "error" in line:
                        print("  " + line.strip())


if __name__ == "__main__":
    main()

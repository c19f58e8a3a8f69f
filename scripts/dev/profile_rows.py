"""Profiles keraunos' and torch.compile's kernels for one benchmark case under Nsight Compute.

Run under ncu with --profile-from-start off: each function is warmed up, then called once between
cudaProfilerStart/Stop.

  ncu --profile-from-start off --section SpeedOfLight python scripts/dev/profile_rows.py rms_norm_fn
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_util as bu  # noqa: E402
import torch  # noqa: E402

import keraunos  # noqa: E402

CASES = {
    "chain10": (bu.chain10, [(2**28,)], torch.float32),
    "rms_norm": (bu.rms_norm, [(16384, 8192), (8192,)], torch.bfloat16),
    "rms_norm_fn": (bu.rms_norm_fn, [(16384, 8192), (8192,)], torch.bfloat16),
    "layer_norm": (bu.layer_norm, [(16384, 8192), (8192,), (8192,)], torch.float32),
    "softmax": (bu.softmax, [(16384, 8192)], torch.float32),
}


def main():
    fn, shapes, dtype = CASES[sys.argv[1]]
    args = [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
    for f in (keraunos.jit(fn), torch.compile(fn)):
        for _ in range(3):
            f(*args)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        f(*args)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()

"""Cold and warm compile time of one fusion region, per executor: run twice with the same fresh
KERAUNOS_CACHE_DIR (the first process compiles, the second loads from disk).
Usage: python scripts/dev/compile_time.py [cpu|cuda]"""

import os
import subprocess
import sys
import tempfile

CHILD = r"""
import time, torch, keraunos
from keraunos import _C
dev = "{dev}"
x = torch.randn(4096, 1024, device=dev)
f = lambda x: torch.softmax(x * 2, -1)
jf = keraunos.jit(f)
jf(x)  # the first call traces, runs the passes and compiles or loads the kernel
if dev == "cuda":
    torch.cuda.synchronize()
st = keraunos.compile_stats(jf)
print("codegen_ms", round(st["last_pass_ms"]["codegen"], 2))
print("cache", _C.kernel_cache_stats() if dev == "cuda" else _C.cpu_cache_stats())
"""


def main():
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, KERAUNOS_CACHE_DIR=d)
        for label in ("cold", "warm"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD.format(dev=dev)],
                env=env,
                capture_output=True,
                text=True,
            )
            print(label, dev, out.stdout.strip().replace("\n", " | "), out.stderr[-300:])


if __name__ == "__main__":
    main()

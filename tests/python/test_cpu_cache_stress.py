"""Several processes sharing one fresh kernel cache folder at once, as parallel test runs and
users' jobs do with ~/.cache/keraunos: each round starts 3 processes together, each runs the
large-output program of test_elementwise.py and a few alias-fuzzer programs, compiling into
(and loading from) the same folder. Every process must get eager's results."""

import os
import subprocess
import sys
import time

import pytest

from keraunos import _C

pytestmark = pytest.mark.skipif(
    not _C.cpu_compiler_info()["available"], reason="no C++ compiler for CPU kernels"
)

PROCESSES = 3
ROUNDS = 2
FUZZ_PROGRAMS = 3

# Waits for the gate file so that the processes compile at the same moment, runs the
# large-output program of test_elementwise.py, then `python -m keraunos.fuzz --programs N
# --fusion-type both --seed S` in the same process (one torch import per process: the test
# stays well under a minute on two busy cores).
_CHILD = r"""
import os, runpy, sys, time
gate, seed, programs = sys.argv[1:4]
import torch, keraunos
while not os.path.exists(gate):
    time.sleep(0.002)
x = torch.randn(1 << 21)
y = torch.randn(1024, 2048)
jf = keraunos.jit(lambda a, b: ((a.sin() * 2).exp(), b.t() + 1, b.softmax(-1)))
for ours, ref in zip(jf(x, y), ((x.sin() * 2).exp(), y.t() + 1, y.softmax(-1))):
    torch.testing.assert_close(ours, ref)
sys.argv = ["keraunos.fuzz", "--programs", programs, "--fusion-type", "both", "--seed", seed]
runpy.run_module("keraunos.fuzz", run_name="__main__")
"""


def test_processes_share_a_fresh_cache(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, KERAUNOS_CACHE_DIR=str(cache))
    env.pop("KERAUNOS_CXXFLAGS", None)
    for rnd in range(ROUNDS):
        gate = tmp_path / f"go{rnd}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(gate), str(100 * rnd + i), str(FUZZ_PROGRAMS)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(PROCESSES)
        ]
        time.sleep(0.5)
        gate.touch()
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, f"round {rnd}, seed {p.args[4]}:\n{out}\n{err}"
        leftovers = [f for f in os.listdir(cache / "cpu") if ".tmp." in f]
        assert not leftovers, leftovers

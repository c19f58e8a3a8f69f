"""Runs last: every torch-level op of the table was traced by some test that compared it with
eager (prims and the passes' own ops are covered through decompositions and golden traces)."""

import importlib
import os

import pytest

from keraunos import _C

# Ops that only passes emit (never traced from user code).
PASS_ONLY = {
    "return_",
    "fusion",
    "as_strided",
    "flat_storage",
    "gather_strided",
    "scatter_strided",
    "restride",
    "batch_norm_functional",
    "torch_vjp",  # the autodiff pass's backward of ops that run through torch
    "torch_vjp_record",  # and their forward under autograd
}


def test_every_op_is_tested_against_eager(request):
    if request.session.testscollected < 1000 or os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("only meaningful when the whole suite runs in one process")
    traced = importlib.import_module("keraunos.jit").OP_COVERAGE
    covered = {name.split(".", 1)[1] for name in traced if "." in name}
    ops = [n for n in _C.op_names() if not n.startswith("prim_") and n not in PASS_ONLY]
    missing = sorted(set(ops) - covered)
    assert not missing, f"ops no test traces: {missing}"

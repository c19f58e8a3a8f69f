"""The differential fuzzer in CI: random programs with views, in-place ops and aliased
inputs must agree with eager in both fusion types."""

import os

import pytest

from keraunos.fuzz import fuzz

N = int(os.environ.get("KERAUNOS_FUZZ_PROGRAMS", "300"))


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_fuzz_against_eager(fusion_type):
    failures = fuzz(N, seed=1000, fusion_type=fusion_type)
    assert not failures, f"{len(failures)} mismatches; first reproducer:\n{failures[0]}"


def test_fuzz_stops_at_its_deadline_and_counts_what_ran():
    import time

    stats: dict = {}
    assert fuzz(50, seed=7, fusion_type="consecutive", stats=stats, deadline=time.monotonic()) == []
    assert stats["programs"] == 0
    fuzz(3, seed=7, fusion_type="consecutive", stats=stats, deadline=time.monotonic() + 600)
    assert stats["programs"] == 3


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_fuzz_with_gradients(fusion_type):
    """Inputs that require grad: outputs, requires_grad flags and every input's gradient agree
    with eager, and most programs run through the compiled forward and backward."""
    n = max(N // 2, 20)
    stats: dict = {}
    failures = fuzz(n, seed=5000, fusion_type=fusion_type, stats=stats, grad=True)
    assert not failures, f"{len(failures)} mismatches; first reproducer:\n{failures[0]}"
    assert stats["compiled_grad"] >= n // 2, stats

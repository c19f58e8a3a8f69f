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

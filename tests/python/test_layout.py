"""The C++ core's layers (README, Layout): ir <- ops <- passes <- codegen <- runtime <- executors <- python.
A file includes headers of its own layer and of the layers below it only (support/, the
options registry, sits just above ir/: it raises ir's errors)."""

import pathlib
import re

CSRC = pathlib.Path(__file__).resolve().parents[2] / "csrc" / "keraunos"
LAYERS = ["ir", "support", "ops", "passes", "codegen", "runtime", "executors", "python"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"keraunos/([a-z_]+)/', re.M)


def test_includes_point_down_the_layers():
    bad = []
    files = [p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp", ".def", ".cuh")]
    assert len(files) > 50
    for p in files:
        layer = p.relative_to(CSRC).parts[0]
        assert layer in LAYERS, f"{p}: a folder the layering does not know"
        for used in INCLUDE.findall(p.read_text()):
            if LAYERS.index(used) > LAYERS.index(layer):
                bad.append(f"{p.relative_to(CSRC)} includes keraunos/{used}/")
    assert not bad, "\n".join(bad)

"""The options registry: every knob in one table (keraunos.options()), read in one place."""

import pathlib
import re

import pytest
import torch

import keraunos

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What keraunos reads from the environment that is not its own knob: the system's.
SYSTEM_VARIABLES = {"HOME", "TMPDIR", "PATH", "CUDA_HOME", "CUDA_PATH"}


def _kernels(jf):
    return keraunos.last_traces(jf)[-1].kernels


def test_every_environment_variable_is_a_registered_option():
    table = keraunos.options()
    registered = {o["env"] for o in table.values() if o["env"]}
    read = set()
    for path in (ROOT / "csrc").rglob("*.[ch]*"):
        if path.name == "options.cpp":
            continue
        text = path.read_text()
        read |= set(re.findall(r'getenv\("(\w+)"\)', text))
        assert "KERAUNOS_" not in "".join(re.findall(r"getenv\([^)]*\)", text)), path
        if "getenv(var)" in text:
            read |= {"CUDA_HOME", "CUDA_PATH"}
    for path in (ROOT / "python" / "keraunos").rglob("*.py"):
        text = path.read_text()
        assert "os.environ" not in text and "getenv" not in text, f"{path} reads the environment"
    assert read <= SYSTEM_VARIABLES, read - SYSTEM_VARIABLES
    # Every KERAUNOS_* name the sources mention (docs, messages) is registered.
    mentioned = set()
    for path in [*(ROOT / "csrc").rglob("*.[ch]*"), *(ROOT / "python" / "keraunos").rglob("*.py")]:
        mentioned |= set(re.findall(r"KERAUNOS_[A-Z_]+[A-Z]", path.read_text()))
    macros = {"KERAUNOS_FOREACH_DTYPE", "KERAUNOS_KR_CUDA_CUH"}  # a macro, an include guard
    assert mentioned - macros <= registered, (mentioned - macros) - registered
    text = str(table)
    for name, o in table.items():
        assert name in text and (o["env"] is None or o["env"] in text) and o["doc"]


def test_set_option_and_environment_select_fusion(monkeypatch):
    x = torch.randn(64)
    keraunos.set_option("fusion", False)
    try:
        assert keraunos.options()["fusion"]["value"] is False
        jf = keraunos.jit(lambda a: a.sin() * 2)
        torch.testing.assert_close(jf(x), x.sin() * 2)
        assert _kernels(jf) == []
    finally:
        keraunos.set_option("fusion", None)
    monkeypatch.setenv("KERAUNOS_FUSION", "0")
    assert keraunos.options()["fusion"]["value"] is False
    assert keraunos.jit(lambda a: a.sin())._fusion is False
    monkeypatch.setenv("KERAUNOS_FUSION", "1")
    assert keraunos.jit(lambda a: a.sin())._fusion is True
    # The jit's own argument wins.
    assert keraunos.jit(lambda a: a.sin(), fusion=False)._fusion is False


def test_fusion_type_option_is_the_jit_default():
    keraunos.set_option("fusion_type", "consecutive")
    try:
        assert keraunos.jit(lambda a: a)._fusion_type == "consecutive"
        assert keraunos.jit(lambda a: a, fusion_type="dataflow")._fusion_type == "dataflow"
    finally:
        keraunos.set_option("fusion_type", None)
    assert keraunos.jit(lambda a: a)._fusion_type == "dataflow"


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="unknown option 'fuson'"):
        keraunos.set_option("fuson", True)
    with pytest.raises(ValueError, match="fusion is on or off"):
        keraunos.set_option("fusion", "sometimes")
    with pytest.raises(ValueError, match=r"KERAUNOS_CUDA_TUNE: unknown key 'warps'"):
        keraunos.set_option("cuda_tune", "warps=4")
    with pytest.raises(ValueError, match=r"max_cluster must be a power of two in 1\.\.16"):
        keraunos.set_option("cuda_tune", "max_cluster=3")
    keraunos.set_option("cuda_tune", "max_cluster=8,reuse_values=0")
    try:
        assert keraunos.options()["cuda_tune"]["value"] == {"max_cluster": 8, "reuse_values": 0}
    finally:
        keraunos.set_option("cuda_tune", None)
    assert keraunos.options()["cuda_tune"]["value"] == {}


@pytest.mark.skipif(
    not keraunos._C.cpu_compiler_info()["available"], reason="kernels need a C++ compiler"
)
def test_dump_kernels_prints_each_kernel_pass(monkeypatch, capsys):
    # KERAUNOS_DUMP=kernels: every kernel after lowering and after each kernel pass that ran
    # (codegen/kernel_passes.h); reuse_reduced_values runs on CPU kernels only.
    monkeypatch.setenv("KERAUNOS_DUMP", "kernels")
    jf = keraunos.jit(lambda x: torch.softmax(x, -1))
    jf(torch.randn(4, 64))
    out = capsys.readouterr().out
    headers = re.findall(r"^# kernel (\w+) after (\w+)$", out, re.M)
    assert headers == [
        ("k0_0", "lower"),
        ("k0_0", "fuse_sibling_reductions"),
        ("k0_0", "reuse_reduced_values"),
        ("k0_0", "hoist_invariants"),
    ], out
    (k,) = _kernels(jf)
    assert [s for s, _ in k.stages] == [h[1] for h in headers]
    assert k.stages[-1][1] == k.ir  # the last stage is what the emitter printed
    # The reuse pass stores the exp in the reduction loop and reloads it in the pointwise one.
    assert "load out0" not in k.stages[1][1] and "load out0" in k.stages[2][1]
    # Without the option nothing is recorded.
    monkeypatch.setenv("KERAUNOS_DUMP", "")
    jf2 = keraunos.jit(lambda x: torch.softmax(x, -1) * 2)
    jf2(torch.randn(4, 64))
    assert _kernels(jf2)[0].stages == [] and capsys.readouterr().out == ""

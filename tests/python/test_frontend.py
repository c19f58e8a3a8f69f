"""The frontend: caching, signatures, modules, errors, traces."""

import pytest
import torch

import keraunos
from harness import check
from keraunos.testing import FUSED_FLOAT_TOLERANCE


def test_cache_hits_and_recompiles():
    jf = keraunos.jit(lambda x, s: x * s)
    x = torch.randn(4)
    jf(x, 2.0)
    jf(x, 2.0)
    jf(torch.randn(4), 2.0)
    st = keraunos.compile_stats(jf)
    assert (st["hits"], st["misses"], st["compiles"]) == (2, 1, 1)
    jf(x, 3.0)  # another scalar value
    jf(torch.randn(5), 2.0)  # another shape
    jf(x.double(), 2.0)  # another dtype
    jf(torch.randn(8)[::2], 2.0)  # other strides
    jf(torch.randn(4, requires_grad=True), 2.0)
    assert keraunos.compile_stats(jf)["misses"] == 6
    assert torch.equal(jf(x, 3.0), x * 3.0)


def test_aliased_inputs_are_part_of_the_key():
    def f(a, b):
        a.add_(1)
        return a + b

    jf = keraunos.jit(f)
    x = torch.zeros(3)
    y = torch.zeros(3)
    assert torch.equal(jf(x, y), torch.full((3,), 1.0))
    x = torch.zeros(3)
    out = jf(x, x)  # the same tensor twice: b sees a's update, as in eager
    assert torch.equal(out, torch.full((3,), 2.0))
    assert keraunos.compile_stats(jf)["misses"] == 2


def test_kwargs_nested_and_constants():
    def f(x, *, scale=1.0, pair=(None, None)):
        a, b = pair
        return {"out": x * scale + a, "n": 3, "b": b}

    x, a, b = torch.randn(3), torch.randn(3), torch.randn(3)
    out = keraunos.jit(f)(x, scale=2.0, pair=(a, b))
    assert set(out) == {"out", "n", "b"} and out["n"] == 3 and out["b"] is b
    assert torch.equal(out["out"], x * 2.0 + a)


def test_returning_inputs_keeps_identity():
    jf = keraunos.jit(lambda x, y: (y, x, x))
    x, y = torch.randn(2), torch.randn(2)
    out = jf(x, y)
    assert out[0] is y and out[1] is x and out[2] is x


def test_captured_global_tensor_is_an_input():
    w = torch.randn(3)

    def f(x):
        return x * w

    jf = keraunos.jit(f)
    x = torch.randn(3)
    assert torch.equal(jf(x), x * w)
    w.mul_(2)  # the program reads the live tensor, not a snapshot
    assert torch.equal(jf(x), x * w)


def test_module_parameters_are_inputs():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))
            self.register_buffer("steps", torch.zeros(()))

        def forward(self, x):
            self.steps.add_(1)
            return (x * self.w).exp()

    m = M()
    jm = keraunos.jit(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        out = jm(x)
        torch.testing.assert_close(out, (x * m.w).exp())
        m.w.mul_(0.5)  # a parameter update is seen by the next call
        torch.testing.assert_close(jm(x), (x * m.w).exp())
    assert m.steps.item() == 2.0
    assert isinstance(m.w, torch.nn.Parameter)  # parameters are restored after tracing


def test_unsupported_op_names_the_function_and_line():
    def f(x):
        return torch.fft.fft(x)  # unsupported

    with pytest.raises(NotImplementedError, match=r"torch\.fft\.fft.*test_frontend\.py:\d+"):
        keraunos.jit(f)(torch.randn(4))


def test_data_dependent_control_flow_splits_the_program():
    # (tests/python/test_split.py has the details.)
    def f(x):
        if x * 2 > 0:
            return x
        return -x

    jf = keraunos.jit(f)
    for v in (1.0, -1.0, 2.0):
        x = torch.tensor([v])
        torch.testing.assert_close(jf(x), f(x))
    x = torch.randn(1)
    torch.testing.assert_close(keraunos.jit(lambda x: (x * 2).item())(x), (x * 2).item())
    torch.testing.assert_close(keraunos.jit(lambda x: float(x.exp()))(x), float(x.exp()))
    # What cannot split still says so, with the line.
    with pytest.raises(RuntimeError, match=r"data-dependent control flow.*test_frontend\.py:\d+"):
        keraunos.jit(lambda x: torch.manual_seed(x))(torch.tensor(3))


def test_user_errors_name_the_line():
    def f(x, y):
        return x + y

    with pytest.raises(RuntimeError, match=r"must match the size.*test_frontend\.py:\d+"):
        keraunos.jit(f)(torch.randn(3), torch.randn(4))
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        keraunos.jit(lambda x: torch.add(x, x, bogus=1))(torch.randn(3))


def test_bad_fusion_type():
    with pytest.raises(ValueError, match="fusion_type"):
        keraunos.jit(lambda x: x, fusion_type="greedy")


def test_last_traces_every_stage_ends_with_return():
    jf = keraunos.jit(lambda x: (x.sin() + 1, x.sin() * 2))
    jf(torch.randn(3))
    traces = keraunos.last_traces(jf)
    assert [t.stage for t in traces] == [
        "acquire",
        "functionalize",
        "dce",
        "cse",
        "grouped_query_attention",
        "dce",
        "partition",
        "fusion executors" if FUSED_FLOAT_TOLERANCE else "torch executor",
    ]
    for t in traces:
        lines = [ln for ln in str(t).strip().splitlines() if not ln.strip().startswith("#")]
        assert lines[-1].strip().startswith("return")
    # CSE merged the two sin calls
    assert str(traces[3]).count("ltorch.sin") == 1
    st = keraunos.compile_stats(jf)
    assert set(st["last_pass_ms"]) >= {"acquire", "dce", "cse", "codegen"}


def test_exact_acquired_trace():
    def f(x, y):
        return torch.relu(x * 2 + y)

    jf = keraunos.jit(f)
    jf(torch.randn(2, 3), torch.randn(3))
    body = str(keraunos.last_traces(jf)[0]).split("\n", 1)[1]
    body = "\n".join(
        ln.split("  # ")[0].rstrip() if "at /" in ln else ln for ln in body.splitlines()
    )
    assert (
        body
        == """def computation(t0, t1):
  # t0: cpu f32[2, 3]
  # t1: cpu f32[3]
  t2 = ltorch.mul(t0, 2)
    # t2 = prims.mul(t0, 2)  # t2: cpu f32[2, 3]
  t4 = ltorch.add(t2, t1)
    # t3 = prims.broadcast_in_dim(t1, [2, 3], [1])  # t3: cpu f32[2, 3] strides=[0, 1]
    # t4 = prims.add(t2, t3)  # t4: cpu f32[2, 3]
  t6 = ltorch.relu(t4)
    # t5 = prims.gt(t4, 0)  # t5: cpu b8[2, 3]
    # t6 = prims.where(t5, t4, 0)  # t6: cpu f32[2, 3]
  return t6"""
    )


def test_inplace_on_inputs_both_fusion_types():
    def f(x, y):
        x.mul_(2)
        y.add_(x)
        return x * y

    for ft in ("consecutive", "dataflow"):
        check(f, torch.randn(4), torch.randn(4), fusion_type=ft)


def test_random_matches_eager_with_seed():
    def f(x):
        return x + torch.randn(x.shape), torch.nn.functional.dropout(x, 0.5)

    check(f, torch.randn(8), seed=123)

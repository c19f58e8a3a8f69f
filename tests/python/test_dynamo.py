"""keraunos as a torch.compile backend: graph splitting, mutation and aliasing through Dynamo
graphs, guards and recompiles, the alias fuzzer through this path, a transformer block."""

from __future__ import annotations

import io

import pytest
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import keraunos
from keraunos.fuzz import fuzz
from keraunos.testing import alias_pattern, clone_args, compare, differences


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def check_compile(fn, *args, entry="compile", fusion_type="dataflow", atol=0.0, rtol=0.0):
    """fn eagerly vs through torch.compile with the keraunos backend, on copies of the same
    arguments: outputs, inputs after the call, aliasing; twice (the second call is cached)."""
    if entry == "compile":
        compiled = keraunos.compile(fn, fusion_type=fusion_type)
    else:
        compiled = torch.compile(fn, backend="keraunos", options={"fusion_type": fusion_type})
    for _ in range(2):
        eager_args, jit_args = clone_args(args), clone_args(args)
        expected = fn(*eager_args)
        actual = compiled(*jit_args)
        problem = (
            differences(actual, expected, "output", atol, rtol)
            or differences(jit_args, eager_args, "input after the call", atol, rtol)
            or (
                None
                if alias_pattern(jit_args, actual) == alias_pattern(eager_args, expected)
                else "aliasing differs from eager"
            )
        )
        assert problem is None, problem
    return compiled


def explain_text(compiled, traces="none"):
    return keraunos.explain(compiled, file=io.StringIO(), traces=traces)


# ---------------------------------------------------------------------------------------------
# Ops through the backend (a cross-section).

a46 = torch.randn(4, 6)
b6 = torch.randn(6)
m64 = torch.randn(6, 5)
i46 = torch.randint(-5, 5, (4, 6))

OPS = {
    "arith": (lambda x, y: (x + y) * 2 - y / 3, (a46, b6)),
    "promotion": (lambda x, i: x * i + i // 2, (a46, i46)),
    "unary": (lambda x: torch.tanh(x).exp().sigmoid() + x.abs().sqrt(), (a46,)),
    "compare_where": (lambda x, y: torch.where(x > y, x, y * 0.5), (a46, b6)),
    "activations": (lambda x: F.gelu(x) + F.silu(x) + F.relu(x) + F.leaky_relu(x, 0.1), (a46,)),
    "reductions": (lambda x: (x.sum(0), x.mean(-1, keepdim=True), x.amax(1), x.var(0)), (a46,)),
    "softmax": (lambda x: (x.softmax(-1), F.log_softmax(x, 0)), (a46,)),
    "matmul": (lambda x, w: x @ w + 1, (a46, m64)),
    "linear": (lambda x, w, b: F.linear(x, w, b), (a46, torch.randn(3, 6), torch.randn(3))),
    "views": (lambda x: (x.view(2, 12).t(), x[1:, ::2], x.unsqueeze(0).transpose(1, 2)), (a46,)),
    "reshape_cat": (lambda x, y: torch.cat([x.reshape(-1), y]), (a46, b6)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), (a46, b6, torch.randn(6))),
    "inplace_input": (lambda x: x.mul_(2).add_(1), (a46,)),
    "inplace_view_of_input": (lambda x: x[0].sin_(), (a46,)),
    "setitem": (lambda x, y: x.__setitem__((slice(None), 0), y[:4]), (a46, b6)),
    "return_view": (lambda x: (x.view(-1), x.t()), (a46,)),
    "return_input_and_view": (lambda x, y: (x, x[1], y.expand(4, 6)), (a46, b6)),
    "aliased_inputs": (lambda x, y: x.add_(y).mul(y), (a46, a46)),
    "overlapping_views": (lambda x, y: (x.add_(1), y.sum()), (a46[:3], a46[1:])),
    "copy_": (lambda x, y: x.copy_(y), (a46, b6)),
    "creation": (lambda x: x + torch.ones(4, 6) + torch.arange(6), (a46,)),
}


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("entry", ["compile", "backend"])
def test_ops_through_backend(name, entry):
    fn, args = OPS[name]
    compiled = check_compile(fn, *args, entry=entry, atol=1e-6, rtol=1e-6)
    stats = keraunos.compile_stats(compiled)
    assert stats["graphs"] == 1 and stats["eager_regions"] == 0, explain_text(compiled)
    assert stats["compiles"] == stats["keraunos_regions"] >= 1
    assert stats["hits"] >= 1


def test_buffer_mutation_in_module():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(3))
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            self.seen.add_(x.sum(0))
            return self.lin(x) * self.seen

    torch.manual_seed(0)
    m = Counter()
    ref = Counter()
    ref.load_state_dict(m.state_dict())
    cm = torch.compile(m, backend="keraunos")
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(cm(x), ref(x))
        torch.testing.assert_close(m.seen, ref.seen)
    assert keraunos.compile_stats(cm)["compiles"] == 1


# ---------------------------------------------------------------------------------------------
# Graph splitting.


def test_unsupported_op_splits_the_graph():
    assert keraunos.torch_map.lookup(torch.fft.fft) is None

    def f(x):
        y = x.sin() * 2
        z = torch.fft.fft(y).abs()
        x.view(-1).add_(1)  # an in-place op after the eager region, on the input
        return z + y, x[0]

    compiled = check_compile(f, torch.randn(4, 8), atol=1e-5, rtol=1e-5)
    text = explain_text(compiled, traces="all")
    assert "[eager]" in text and "[keraunos]" in text
    assert "torch.fft.fft is not supported" in text
    assert "def program(" in text  # the traces of the compiled regions
    stats = keraunos.compile_stats(compiled)
    assert stats["keraunos_regions"] == 2 and stats["eager_regions"] == 1
    assert stats["compiles"] == 2


def test_unsupported_op_and_graph_break():
    assert keraunos.torch_map.lookup(torch.linalg.svd) is None

    def f(x):
        y = x.cos() * 2
        if y.sum() > 0:  # data-dependent: Dynamo breaks the graph here
            y = y + torch.linalg.svd(x)[0].sum()
        else:
            y = y - 1
        return y.relu()

    x = torch.randn(5, 5)
    compiled = keraunos.compile(f)
    for arg in (x, -x.abs() - 10, x.abs() + 1):
        torch.testing.assert_close(compiled(arg), f(arg), atol=1e-5, rtol=1e-5)
    text = explain_text(compiled)
    assert "torch.linalg.svd is not supported" in text
    assert keraunos.compile_stats(compiled)["graphs"] >= 2


def test_trace_time_refusal_falls_back_to_eager():
    # add_ is in the mapping table, but an in-place op that reads another view of the memory
    # it writes is refused while tracing (eager's result depends on its loop order).
    def f(x):
        y = x.sin()[:, :4]  # not contiguous: eager's overlap check cannot tell, its loop decides
        y.add_(y.t())
        return y.cos()

    compiled = check_compile(f, torch.randn(4, 8))
    stats = keraunos.compile_stats(compiled)
    assert stats["fallbacks"] == 1 and stats["eager_regions"] == 1
    assert "different view" in explain_text(compiled) or "overlap" in explain_text(compiled)


def test_call_forms_outside_the_mapping_run_through_the_torch_fallback():
    # contiguous() is in the mapping table, but not with a memory_format: keraunos.jit runs
    # that call through torch inside the region.
    def f(x):
        return (x.sin().contiguous(memory_format=torch.channels_last) + 1).cos()

    compiled = check_compile(f, torch.randn(2, 3, 4, 5))
    stats = keraunos.compile_stats(compiled)
    assert stats["fallbacks"] == 0


def test_user_errors_propagate():
    def f(x, y):
        return x + y

    with pytest.raises(RuntimeError):
        keraunos.compile(f)(torch.randn(3), torch.randn(4))

    def g(x):
        return x.sum(dim=5)

    # Dynamo raises the error itself while running the graph on fake tensors (older torch
    # releases wrap it in TorchRuntimeError, a RuntimeError).
    with pytest.raises((IndexError, torch._dynamo.exc.TorchRuntimeError)):
        keraunos.compile(g)(torch.randn(3))


def test_grad_mode_inside_the_graph():
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y + x

    x = torch.randn(3, requires_grad=True)
    compiled = keraunos.compile(f)
    out = compiled(x)
    torch.testing.assert_close(out, f(x))
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3))
    stats = keraunos.compile_stats(compiled)
    assert stats["fallbacks"] == 0 and stats["keraunos_regions"] == 2


# ---------------------------------------------------------------------------------------------
# torch.func transforms and tensors without storage (Hugging Face causal LMs build their masks
# with nested torch.vmap: the dispatcher used to dereference NULL on these and kill the process).


def causal_mask_like_transformers(ids, w):
    # transformers 4.57's masking_utils: a mask function vmapped over batch, head, query and
    # key indices, then used by supported ops around it.
    b, t = ids.shape
    kv = torch.arange(t) + 0
    q = torch.arange(t)

    def allowed(bi, hi, qi, ki):
        return ki.le(qi)

    fn = allowed
    for dims in (
        (None, None, None, 0),
        (None, None, 0, None),
        (None, 0, None, None),
        (0, None, None, None),
    ):
        fn = torch.vmap(fn, in_dims=dims)
    mask = fn(torch.arange(b), torch.arange(1), q, kv)
    x = F.embedding(ids, w)
    scores = (x @ x.transpose(-1, -2)).unsqueeze(1)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


@pytest.mark.parametrize("fusion", [True, False])
def test_vmap_inside_the_graph_runs_eagerly(fusion):
    ids = torch.randint(0, 16, (2, 5))
    w = torch.randn(16, 8)
    compiled = torch.compile(
        causal_mask_like_transformers, backend="keraunos", options={"fusion": fusion}
    )
    expected = causal_mask_like_transformers(ids, w)
    for _ in range(2):
        torch.testing.assert_close(compiled(ids, w), expected)
    text = explain_text(compiled)
    assert "inside a torch.func transform" in text
    stats = keraunos.compile_stats(compiled)
    assert stats["keraunos_regions"] >= 1 and stats["fallbacks"] == 0


def test_jit_under_a_torch_func_transform_is_a_clear_error():
    def f(x, y):
        return x * y + 1

    jf = keraunos.jit(f)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with pytest.raises(keraunos._C.UnsupportedCall, match="transformed by torch.func"):
        torch.vmap(jf)(x, y)  # two tensors: the alias check used to crash here
    with pytest.raises(NotImplementedError, match="transformed by torch.func"):
        torch.vmap(jf, in_dims=(0, None))(x, y[0])
    with pytest.raises(NotImplementedError, match="transformed by torch.func"):
        torch.vmap(keraunos.jit(torch.sin))(x)  # one tensor
    with pytest.raises(NotImplementedError, match="transformed by torch.func"):
        torch.func.grad(lambda a: jf(a, a).sum())(torch.randn(3))
    # Outside the transform the same function still compiles and runs.
    torch.testing.assert_close(jf(x, y), f(x, y))
    assert torch.vmap(f)(x, y).shape == (3, 4)


def test_tensor_without_storage_is_refused_not_a_crash():
    jf = keraunos.jit(lambda u, v: u + v)
    s = torch.ones(3).to_sparse()  # data_ptr() raises: no strided storage
    with pytest.raises(keraunos._C.UnsupportedCall, match="no storage"):
        jf(s, s.clone())
    with pytest.raises(NotImplementedError, match="argument 1 .*no storage"):
        jf(torch.ones(3), s)


def test_dispatcher_refusal_falls_back_to_eager_in_a_region():
    # A region whose arguments the dispatcher refuses at call time runs eagerly from then on.
    def f(x, y):
        return (x * y).sin() + 1

    compiled = keraunos.compile(f)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(compiled(x, y), f(x, y))
    (graph,) = keraunos.dynamo._graphs(compiled)
    (region,) = graph.regions
    (out,) = torch.vmap(region)(x, y)  # Dynamo graphs return tuples
    torch.testing.assert_close(out, f(x, y))
    assert region.kind == "eager" and region.fell_back
    assert "transformed by torch.func" in explain_text(compiled)
    torch.testing.assert_close(compiled(x, y), f(x, y))


# ---------------------------------------------------------------------------------------------
# Guards and recompiles.


def test_shape_change_recompiles_once():
    def f(x):
        return x.sin() + 1

    compiled = keraunos.compile(f)
    compiled(torch.randn(4))
    compiled(torch.randn(4))
    assert keraunos.compile_stats(compiled)["compiles"] == 1
    compiled(torch.randn(5))
    compiled(torch.randn(5))
    compiled(torch.randn(4))
    stats = keraunos.compile_stats(compiled)
    assert stats["compiles"] == 2 and stats["graphs"] == 2
    assert stats["hits"] == 3 and stats["eager_graphs"] == 0


@pytest.mark.parametrize("dynamic", [True, None])
def test_symbolic_shapes_compile_per_concrete_shape(dynamic):
    """Graphs with symbolic shapes (dynamic=True, or plain torch.compile after a shape change)
    run through keraunos, which specializes on the sizes each call brings."""

    def f(x, y):
        z = x.sin() * y + x.shape[0]
        return z.view(-1).sum(0), x.mul_(2)

    compiled = torch.compile(f, backend="keraunos", dynamic=dynamic)
    for n in (3, 4, 5, 4):
        x, y = torch.randn(n, 3), torch.randn(3)
        x_eager = x.clone()
        out, ref = compiled(x, y), f(x_eager, y)
        torch.testing.assert_close(out, ref)
        assert torch.equal(x, x_eager)
    stats = keraunos.compile_stats(compiled)
    assert stats["eager_graphs"] == 0 and stats["compiles"] == 3 and stats["hits"] == 1


def test_options_and_errors():
    with pytest.raises(ValueError, match="fusion_type"):
        keraunos.compile(lambda x: x, fusion_type="bogus")
    with pytest.raises(TypeError, match="keraunos.compile"):
        keraunos.compile_stats(lambda x: x)
    assert "keraunos" in torch._dynamo.list_backends()


# ---------------------------------------------------------------------------------------------
# A peer compiler's bug report.


def test_random_inplace_without_effect_advances_rng_like_eager():
    def f():
        torch.randn(4).sin_()

    torch.manual_seed(0)
    assert keraunos.compile(f)() is None
    after_compiled = torch.randn(3)
    torch.manual_seed(0)
    f()
    after_eager = torch.randn(3)
    torch.testing.assert_close(after_compiled, after_eager, rtol=0, atol=0)


def test_inplace_on_view_of_input_changes_input():
    def f(x):
        x.view(-1).sin_()

    x = torch.randn(3, 4)
    expected = x.clone().sin_()
    assert keraunos.compile(f)(x) is None
    torch.testing.assert_close(x, expected)  # fused sin may differ from eager in the last bit


# ---------------------------------------------------------------------------------------------
# The alias fuzzer through torch.compile.


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_fuzzer_through_backend(fusion_type):
    stats: dict = {}
    failures = fuzz(150, seed=5000, fusion_type=fusion_type, via="compile", stats=stats)
    assert not failures, failures[0]
    assert stats["programs"] == 150
    # Every fuzzer op is supported: regions run eagerly only where keraunos refuses an
    # order-dependent in-place overlap (which then runs exactly like eager).
    assert stats["fell_back"] <= 10, stats


def test_compare_via_compile_reports_mismatches():
    def f(x):
        return x + 1

    assert compare(f, (torch.randn(3),), via="compile") is None
    with pytest.raises(ValueError):
        compare(f, (torch.randn(3),), via="bogus")


# ---------------------------------------------------------------------------------------------
# A small transformer block, through both entry points.


class Block(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, idx):
        x = self.emb(idx)
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(B, T, D)))
        x = x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))
        return x


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_transformer_block_both_entry_points(fusion_type):
    torch.manual_seed(0)
    block = Block().eval()
    idx = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        expected = block(idx)
        jitted = keraunos.jit(block, fusion_type=fusion_type)
        torch.testing.assert_close(jitted(idx), expected, atol=1e-5, rtol=1e-5)
        compiled = torch.compile(block, backend="keraunos", options={"fusion_type": fusion_type})
        torch.testing.assert_close(compiled(idx), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(compiled(idx), expected, atol=1e-5, rtol=1e-5)
    stats = keraunos.compile_stats(compiled)
    assert stats["graphs"] == 1 and stats["regions"] == 1 and stats["eager_regions"] == 0
    assert stats["compiles"] == 1 and stats["hits"] == 1
    text = explain_text(compiled, traces="last")
    assert "Block: 1 Dynamo graph(s)" in text
    assert "region 0 [keraunos]" in text and "scaled_dot_product_attention" in text
    # With grad: the backend keeps PyTorch's autograd.
    block.train(False)
    torch._dynamo.reset()
    compiled = keraunos.compile(block, fusion_type=fusion_type)
    out = compiled(idx)
    out.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in block.named_parameters()}
    block.zero_grad()
    block(idx).square().mean().backward()
    for n, p in block.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)

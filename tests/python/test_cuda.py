"""The torch executor on CUDA tensors (skipped without a GPU): a cross-section of the op
table, mutation through views, the bug-report programs and the fuzzer."""

import pytest
import torch

import keraunos
from harness import check
from keraunos.fuzz import fuzz

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
F = torch.nn.functional
D = "cuda"


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=D).to(dtype)


def FUNCS():  # noqa: N802  (built lazily: tensors need a GPU)
    return {
        "elementwise": (
            lambda a, b: (a.sin() * b + 1, torch.where(a > 0, a, b), a.exp().clamp(0, 2)),
            (r(4, 8), r(8)),
        ),
        "promotion": (
            lambda a, b: (a + b, a * 2.5, b // 2),
            (r(4, 8, dtype=torch.float16), torch.randint(0, 9, (8,), device=D)),
        ),
        "activations": (
            lambda a: (F.gelu(a), F.silu(a), F.relu(a), F.softplus(a), F.leaky_relu(a)),
            (r(16, 16),),
        ),
        "reductions": (
            lambda a: (a.sum(1), a.mean(0, keepdim=True), a.amax(-1), a.var(1), a.argmax(1)),
            (r(8, 33),),
        ),
        "softmax": (lambda a: (a.softmax(-1), a.log_softmax(0), a.logsumexp(1)), (r(8, 33),)),
        "norms": (
            lambda a, w, b: (F.layer_norm(a, (33,), w, b), F.rms_norm(a, (33,), w)),
            (r(8, 33), r(33), r(33)),
        ),
        "matmul": (lambda a, b: (a @ b, F.linear(a, b.t())), (r(8, 16), r(16, 4))),
        "shape": (
            lambda a: (
                a.view(-1),
                a.t().contiguous(),
                a[1:, ::2],
                a.unsqueeze(0).expand(2, 8, 16),
                a.reshape(4, 32),
            ),
            (r(8, 16),),
        ),
        "indexing": (
            lambda a, i: (a[i], a[:, i], torch.cat([a, a]), torch.stack([a, a], 1)),
            (r(8, 16), torch.tensor([0, 3, 3], device=D)),
        ),
        "inplace": (
            lambda a, b: (a.mul_(2), a.view(-1)[::3].zero_(), b.t().add_(1), a + b.t())[-1],
            (r(8, 16), r(16, 8)),
        ),
        "setitem": (
            lambda a: (a.__setitem__((slice(1, 3), 0), 5.0), a.masked_fill_(a < 0, 0.0), a)[-1],
            (r(8, 16),),
        ),
        "creation": (
            lambda a: (
                torch.zeros_like(a),
                torch.ones(3, device=D),
                torch.arange(5, device=D),
                torch.full((2,), 3.0, device=D),
            ),
            (r(4),),
        ),
        "embedding_ce": (
            lambda w, i, t: (F.embedding(i, w), F.cross_entropy(w[:4], t)),
            (
                r(10, 6),
                torch.tensor([[1, 2], [0, 9]], device=D),
                torch.tensor([1, 0, 5, 2], device=D),
            ),
        ),
    }


NAMES = [
    "activations",
    "creation",
    "elementwise",
    "embedding_ce",
    "indexing",
    "inplace",
    "matmul",
    "norms",
    "promotion",
    "reductions",
    "setitem",
    "shape",
    "softmax",
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_ops_on_cuda(name, fusion_type):
    fn, args = FUNCS()[name]
    check(fn, *args, fusion_type=fusion_type, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_bug_report_programs_on_cuda(fusion_type):
    def f():
        torch.randn(4, device="cuda").sin_()

    def g(x):
        x.view(-1).sin_()

    jf = keraunos.jit(f, fusion_type=fusion_type)
    torch.manual_seed(0)
    assert jf() is None
    state = torch.cuda.get_rng_state()
    torch.manual_seed(0)
    f()
    assert torch.equal(state, torch.cuda.get_rng_state())  # the draw happened, as in eager
    check(g, r(2, 3), fusion_type=fusion_type)


def test_random_matches_eager_on_cuda():
    check(lambda a: (a + torch.randn(a.shape, device=D), F.dropout(a, 0.3)), r(64), seed=7)


@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_fuzz_on_cuda(fusion_type):
    failures = fuzz(300, seed=77, fusion_type=fusion_type, device="cuda")
    assert not failures, failures[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_division_by_a_number_matches_eager_bitwise(dtype):
    # Eager CUDA multiplies by the divisor's reciprocal in the opmath type (a division would
    # differ in the last bit for about a third of these values); the fused kernel must too.
    x = r(1 << 16, dtype=dtype)

    def f(a):
        return a.sin() / 3, a / 7.1, (a * 2).div_(10)

    got = keraunos.jit(f)(x)
    for g, e in zip(got, f(x)):
        assert torch.equal(g, e)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cols", [8192, 262144])
def test_half_rows_cached_in_registers(dtype, cols):
    # Rows whose 16-bit bits the vector kernels keep in registers, two values to a word: the
    # block schedule (8k) and the cluster schedule with its next-row prefetch (256k).
    x, w, b = r(6, cols, dtype=dtype), r(cols, dtype=dtype), r(cols, dtype=dtype)

    def f(x, w, b):
        hf = x.float()
        hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (
            F.rms_norm(x, (cols,), w),
            F.layer_norm(x, (cols,), w, b),
            x.softmax(-1),
            w * hf.to(dtype),
        )

    check(f, x, w, b)


def test_device_moves_raise_a_clear_error():
    # type_as is to(other.options()): a CPU `other` moves the CUDA tensor, which jit does not
    # support yet; it says so instead of returning a tensor on the wrong device.
    def f(a):
        return a.type_as(torch.zeros(1, dtype=torch.int16)) + 1

    with pytest.raises(NotImplementedError, match="moving a tensor from cuda:0 to cpu"):
        keraunos.jit(f)(r(4))


@pytest.mark.parametrize("reduce", ["", "cluster_async_reduce=0"])
@pytest.mark.parametrize("cols", [262144, 262148])
def test_long_row_variance(cols, reduce, monkeypatch):
    # Rows of 256k in clusters: a variance's sum and squared deviations merge across the cluster
    # in one round (per-thread pairs, Chan's merge), on rows off zero where a sum of squares
    # would cancel; 262148 columns (threads hold unequal counts) and the barrier all-reduce
    # take two rounds.
    monkeypatch.setenv("KERAUNOS_CUDA_TUNE", reduce)
    x = r(5, cols) * 0.5 + 8
    w, b = r(cols), r(cols)
    check(
        lambda x, w, b: (x.var(1), x.std(1, keepdim=True), F.layer_norm(x, (cols,), w, b)),
        x,
        w,
        b,
        atol=1e-4,
        rtol=1e-4,
    )


def test_variance_over_nested_dims():
    # Variances over two dims of rows long enough for clusters: plain, and with a reduction
    # nested in each pass (the nests hold loops: two rounds; CudaEmitter.OneRoundMerges...).
    def f(x):
        return x.var(dim=(1, 2)), (x * 2 + x.sum(-1, keepdim=True)).var(dim=(1, 2))

    check(f, r(6, 32768, 2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 700, 5000])
def test_persistent_blocks(rows, monkeypatch):
    # block_persist=1: as many blocks as fit walk the rows (fewer, as many, more rows than
    # blocks), rms_norm's next row prefetched into registers; softmax and layer_norm too.
    monkeypatch.setenv("KERAUNOS_CUDA_TUNE", "block_persist=1")
    x, w, b = r(rows, 8192, dtype=torch.bfloat16), r(8192, dtype=torch.bfloat16), r(8192)
    check(lambda x, w: F.rms_norm(x, (8192,), w), x, w)
    xf = x.float()
    check(lambda x, w, b: (x.softmax(-1), F.layer_norm(x, (8192,), w, b)), xf, w.float(), b)


@pytest.mark.parametrize("hints", [0, 1, 2, 4, 7])
def test_cache_hints(hints, monkeypatch):
    # cache_hints (7 by default): the block schedule's vector loads and stores with L1 eviction
    # and streaming hints (rows evict first, row-invariant weights last, stores streamed); also
    # a row normalized in place (the kernel reads x, its result is copied back into x).
    monkeypatch.setenv("KERAUNOS_CUDA_TUNE", f"cache_hints={hints}")
    x, w, b = r(300, 8192, dtype=torch.bfloat16), r(8192, dtype=torch.bfloat16), r(8192)

    def rms(x, w):
        return F.rms_norm(x, (8192,), w)

    check(rms, x, w)
    jf = keraunos.jit(rms)
    jf(x, w)
    src = keraunos.last_traces(jf)[-1].kernels[0].source
    assert ("kr_load_vec_hint<1, uint16_t, 8>(in0" in src) == bool(hints & 1), src
    assert ("kr_load_vec_hint<2, uint16_t, 8>(in1" in src) == bool(hints & 2), src
    assert ("kr_store_vec_cs<unsigned, 4>(" in src) == bool(hints & 4), src
    xf = x.float()
    check(lambda x, w, b: (x.softmax(-1), F.layer_norm(x, (8192,), w, b)), xf, w.float(), b)

    def in_place(x):
        return x.sub_(x.mean(-1, keepdim=True))

    check(in_place, r(300, 4096))


@pytest.mark.parametrize("merge", [1, 0])
@pytest.mark.parametrize("cols", [262144, 262148])
def test_long_row_softmax(cols, merge, monkeypatch):
    # Rows of 256k in clusters: each thread's max and sum of exp(x - its max) merge across the
    # cluster in one round (cluster_merge_softmax=1), for even and uneven counts; rows with
    # masked (-inf) stretches longer than a thread's share, a row all -inf (NaN, as in eager),
    # a row off zero.
    monkeypatch.setenv("KERAUNOS_CUDA_TUNE", f"cluster_merge_softmax={merge}")
    x = r(6, cols) * 4
    x[1, : cols // 2] = float("-inf")
    x[2, 1000:200000] = float("-inf")
    x[3] = float("-inf")
    x[4] += 300
    check(
        lambda x: (x.softmax(-1), x.log_softmax(-1), torch.logsumexp(x, 1)),
        x,
        atol=1e-5,
        rtol=1e-4,
    )


@pytest.mark.parametrize("hoist", [0, 64, 104])
@pytest.mark.parametrize("rows", [3, 40])
def test_long_rows_with_weights_in_shared_memory(rows, hoist, monkeypatch):
    # Rows of 256k floats: persistent clusters keep the weight (64 KB per block) and the bias
    # (104: a part of it) in shared memory for every row they walk (40 rows: more rows than
    # clusters).
    monkeypatch.setenv("KERAUNOS_CUDA_TUNE", f"cluster_hoist_kb={hoist}")
    cols = 262144
    x, w, b = r(rows, cols), r(cols), r(cols)
    check(lambda x, w, b: (F.layer_norm(x, (cols,), w, b), F.rms_norm(x, (cols,), w)), x, w, b)

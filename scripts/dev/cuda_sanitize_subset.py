"""A subset of fused CUDA programs for compute-sanitizer (memcheck): pointwise with
broadcasting and strides, reductions, normalizations, f16/bf16, in-place writes."""

import torch
import torch.nn.functional as F

import keraunos

D = "cuda"
torch.manual_seed(0)
x = torch.randn(64, 300, device=D)
y = torch.randn(300, device=D)
w = torch.randn(300, device=D)
b = torch.randn(300, device=D)
cases = [
    (lambda x, y: F.gelu(x) * y + 2, (x, y)),
    (lambda x: x.t().sin() + 1, (x,)),
    (lambda x: (x.sum(0), x.amax(1), x.var(1), x.mean()), (x,)),
    (lambda x: (x.softmax(-1), x.log_softmax(0)), (x,)),
    (lambda x, w, b: F.layer_norm(x, (300,), w, b), (x, w, b)),
    (lambda x, w: F.rms_norm(x.bfloat16(), (300,), w.bfloat16()), (x, w)),
    (lambda x: (x.half() * 3).float().exp(), (x,)),
    (lambda x: torch.softmax(x, -1), (torch.randn(4, 70000, device=D),)),
    # Clusters walking several rows each (the next row's registers loaded early), and rows
    # cached in shared memory (cp.async prefetch, ragged groups).
    (lambda x: torch.softmax(x, -1), (torch.randn(300, 65536, device=D),)),
    (
        lambda x, w, b: F.layer_norm(x, (131072,), w, b),
        (
            torch.randn(40, 131072, device=D),
            torch.randn(131072, device=D),
            torch.randn(131072, device=D),
        ),
    ),
    (lambda x: torch.softmax(x, -1), (torch.randn(3, 300000, device=D),)),
    (lambda x: torch.softmax(x, -1), (torch.randn(20, 524288, device=D),)),
    # A weight kept in shared memory by persistent clusters (more rows than clusters).
    (
        lambda x, w, b: F.layer_norm(x, (262144,), w, b),
        (
            torch.randn(40, 262144, device=D),
            torch.randn(262144, device=D),
            torch.randn(262144, device=D),
        ),
    ),
    # bfloat16 rows kept in registers as packed words: block (8k) and cluster (256k) schedules.
    (
        lambda x, w: F.rms_norm(x, (8192,), w),
        (torch.randn(70, 8192, device=D).bfloat16(), torch.randn(8192, device=D).bfloat16()),
    ),
    (
        lambda x, w: F.rms_norm(x, (262144,), w),
        (torch.randn(40, 262144, device=D).bfloat16(), torch.randn(262144, device=D).bfloat16()),
    ),
]
for fn, args in cases:
    for ft in ("consecutive", "dataflow"):
        jf = keraunos.jit(fn, fusion_type=ft)
        out = jf(*args)
        ref = fn(*args)
        for a, e in zip(
            out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)
        ):
            torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)


def inplace(x):
    x.sin_()
    return x


z = torch.randn(1000, device=D)
keraunos.jit(inplace)(z.clone())
torch.cuda.synchronize()
print("sanitizer subset: all cases ran")

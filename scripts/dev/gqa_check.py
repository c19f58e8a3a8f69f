"""Which SDPA kernel grouped-query attention takes on this device, and its time: SDPA with
enable_gqa=True on the kv heads against SDPA on kv heads repeated as HF's repeat_kv does
(expand + reshape), forward + backward, bf16, the LLaMA benchmark's sizes.

    python scripts/dev/gqa_check.py
"""

import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode


class Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    b, nh, nkv, s, d = (4, 16, 4, 1024, 128) if dev == "cuda" else (2, 4, 2, 128, 64)
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    q = torch.randn(b, nh, s, d, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(b, nkv, s, d, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(b, nkv, s, d, device=dev, dtype=dt, requires_grad=True)

    def rep(t):
        return t[:, :, None].expand(b, nkv, nh // nkv, s, d).reshape(b, nh, s, d)

    def gqa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def repeated():
        return F.scaled_dot_product_attention(q, rep(k), rep(v), is_causal=True)

    g = torch.randn(b, nh, s, d, device=dev, dtype=dt)
    for name, fn in (("enable_gqa", gqa), ("repeat_kv", repeated)):
        with Log() as log:
            fn().backward(g)
        print(name, [o for o in log.ops if "attention" in o])
        for _ in range(3):
            fn().backward(g)
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            fn().backward(g)
        if dev == "cuda":
            torch.cuda.synchronize()
        print(f"  {name}: {(time.perf_counter() - t) / 20 * 1e6:.1f} us per forward + backward")
    q.grad = k.grad = v.grad = None
    gqa().backward(g)
    ga = [t.grad.clone() for t in (q, k, v)]
    q.grad = k.grad = v.grad = None
    repeated().backward(g)
    for a, t in zip(ga, (q, k, v)):
        print("  max grad difference", (a.float() - t.grad.float()).abs().max().item())


if __name__ == "__main__":
    main()

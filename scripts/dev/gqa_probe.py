"""Whether SDPA with enable_gqa=True on un-repeated key/value heads runs the same attention
kernel as on HF's repeat_kv copies, and how long each takes (CUDA; LLaMA-like heads).

  python scripts/dev/gqa_probe.py
"""

import torch
import torch.nn.functional as F

B, NH, NKV, S, D = 4, 16, 4, 1024, 128


def main():
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    q, k, v = randn(B, NH, S, D), randn(B, NKV, S, D), randn(B, NKV, S, D)

    def rep(x):
        return x[:, :, None].expand(B, NKV, NH // NKV, S, D).reshape(B, NH, S, D)

    ke, ve = rep(k), rep(v)
    runs = {
        "sdpa(repeat_kv)": lambda: F.scaled_dot_product_attention(
            q, rep(k), rep(v), is_causal=True
        ),
        "sdpa(pre-repeated)": lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True),
        "sdpa(enable_gqa)": lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        ),
    }
    for name, f in runs.items():
        for _ in range(10):
            f()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(200):
            f()
        end.record()
        end.synchronize()
        print(f"{name}: {start.elapsed_time(end) * 1e3 / 200:.1f} µs")
    diff = (runs["sdpa(repeat_kv)"]() - runs["sdpa(enable_gqa)"]()).abs().max().item()
    print("max difference, enable_gqa against repeat_kv:", diff)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        runs["sdpa(enable_gqa)"]()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    print("enable_gqa kernels:", [e.name[:80] for e in p.events() if e.device_type == cuda])


if __name__ == "__main__":
    main()

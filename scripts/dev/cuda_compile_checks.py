"""The bug-report programs through keraunos.compile (torch.compile backend) on CUDA."""

import torch

import keraunos


def f():
    torch.randn(4, device="cuda").sin_()


def g(x):
    x.view(-1).sin_()


for fusion_type in ("consecutive", "dataflow"):
    torch.manual_seed(0)
    out = keraunos.compile(f, fusion_type=fusion_type)()
    s1 = torch.cuda.get_rng_state()
    torch.manual_seed(0)
    f()
    assert out is None and torch.equal(s1, torch.cuda.get_rng_state())
    x = torch.randn(2, 3, device="cuda")
    y = x.clone()
    keraunos.compile(g, fusion_type=fusion_type)(x)
    g(y)
    assert torch.equal(x, y)
    print(f"keraunos.compile bug-report programs on CUDA ({fusion_type}): match eager")

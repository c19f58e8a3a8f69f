"""A smoke test of the torch executor through a view write (crashed once on the GPU machine:
a libstdc++ mix-up, fixed by a private static runtime and hidden symbols)."""

import torch

import keraunos


def g(x):
    x.view(-1).sin_()


jf = keraunos.jit(g)
x = torch.randn(2, 3)
jf(x)
print("ok", x)

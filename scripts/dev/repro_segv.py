import torch, keraunos
def g(x):
    x.view(-1).sin_()
jf = keraunos.jit(g)
x = torch.randn(2, 3)
jf(x)
print("ok", x)

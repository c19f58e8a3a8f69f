"""In-place ops that are not the in-place variant of an elementwise op: copy_, fill_, zero_,
setitem, masked_fill_, index_copy_, index_put_."""

import torch

from . import register

T = torch.Tensor

register(T.copy_, "copy_", lambda a, src, non_blocking=False: ((a, src), {}), out_ok=False)
register([T.fill_, getattr(torch, "fill_", None)], "fill_", out_ok=False)
register([T.zero_, getattr(torch, "zero_", None)], "zero_", out_ok=False)
register([getattr(torch, "fill", None)], "fill")

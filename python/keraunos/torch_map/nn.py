"""nn ops: linear algebra (matmul class), normalizations, embedding, losses and attention, in
their torch, torch.Tensor and torch.nn.functional forms (nn modules call these)."""

import torch

from ..tracer import Proxy, record, where
from . import register, register_handler, swap

F = torch.nn.functional
T = torch.Tensor

register([torch.matmul, T.matmul, T.__matmul__], "matmul")
register(T.__rmatmul__, "matmul", swap)
register([torch.bmm, T.bmm], "bmm")


def _addbmm_(tr, args, kwargs):
    """Tensor.addbmm_ runs through the torch fallback, except where eager resizes self to the
    result's shape (self only broadcasts to it), which keraunos does not do."""
    names = ["self", "batch1", "batch2"]
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    x, b1, b2 = (bound.get(k) for k in names)
    if all(isinstance(t, Proxy) for t in (x, b1, b2)) and b1.ndim == 3 and b2.ndim == 3:
        if tuple(x.shape) != (b1.shape[1], b2.shape[2]):
            e = NotImplementedError(
                f"keraunos: torch.Tensor.addbmm_ resizes its {list(x.shape)} self to "
                f"{[b1.shape[1], b2.shape[2]]}; this is not supported (at {where()})"
            )
            e._kr_final = True
            raise e
    raise NotImplementedError("keraunos: addbmm_ has no op of its own")  # the fallback


register_handler([T.addbmm_], _addbmm_)
register(F.linear, "linear", out_ok=False)
register(F.layer_norm, "layer_norm", out_ok=False)
if hasattr(F, "rms_norm"):
    register(F.rms_norm, "rms_norm", out_ok=False)


def _batch_norm(tr, args, kwargs):
    """F.batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
    momentum=0.1, eps=1e-5): with running stats in training mode the op also updates them."""
    names = [
        "input",
        "running_mean",
        "running_var",
        "weight",
        "bias",
        "training",
        "momentum",
        "eps",
    ]
    defaults = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}
    if len(args) > len(names):
        raise TypeError(
            f"batch_norm() takes {len(names)} positional arguments but {len(args)} were given"
        )
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"batch_norm() got an unexpected keyword argument '{k}'")
        if k in bound:
            raise TypeError(f"batch_norm() got multiple values for argument '{k}'")
        bound[k] = v
    for k in names:
        if k not in bound:
            if k not in defaults:
                raise TypeError(f"batch_norm() missing required argument '{k}'")
            bound[k] = defaults[k]
    if getattr(bound["input"], "ndim", 2) < 2:
        # Eager takes a 1-D input (only the empty one succeeds) with rules of its own; the op
        # expects (N, C, ...). Not final: the torch fallback runs eager's batch_norm.
        raise NotImplementedError("keraunos: F.batch_norm of a 0-D or 1-D input")
    if bound["momentum"] is None:
        bound["momentum"] = 0.0  # eager passes momentum=0.0 through when None reaches F.batch_norm
    update = (
        bound["training"] and bound["running_mean"] is not None and bound["running_var"] is not None
    )
    if bound["training"] and (bound["running_mean"] is None) != (bound["running_var"] is None):
        raise NotImplementedError(
            "keraunos: F.batch_norm in training mode with only one of running_mean/running_var "
            "is not supported"
        )
    if bound["input"].numel() == 0:
        # Eager's empty-input path (a copy, the running statistics untouched): through torch.
        raise NotImplementedError("keraunos: batch_norm of an empty input runs through torch")
    op = "batch_norm_update" if update else "batch_norm"
    return record(op, "torch.nn.functional.batch_norm", [bound[k] for k in names], {})


register_handler(F.batch_norm, _batch_norm)


def _embedding(
    input,
    weight,
    padding_idx=None,
    max_norm=None,
    norm_type=2.0,
    scale_grad_by_freq=False,
    sparse=False,
):
    if max_norm is not None:
        raise NotImplementedError(
            "keraunos: F.embedding(max_norm=...) renormalizes the weight in place; not supported yet"
        )
    if padding_idx is not None:
        # As F.embedding does before calling torch.embedding.
        if padding_idx > 0:
            assert padding_idx < weight.size(0), "Padding_idx must be within num_embeddings"
        elif padding_idx < 0:
            assert padding_idx >= -weight.size(0), "Padding_idx must be within num_embeddings"
            padding_idx = weight.size(0) + padding_idx
    return (input, weight, padding_idx), {}


register(F.embedding, "embedding", _embedding, out_ok=False)


def _cross_entropy(
    input,
    target,
    weight=None,
    size_average=None,
    ignore_index=-100,
    reduce=None,
    reduction="mean",
    label_smoothing=0.0,
):
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    return (input, target, weight), {
        "ignore_index": ignore_index,
        "reduction": reduction,
        "label_smoothing": label_smoothing,
    }


register(F.cross_entropy, "cross_entropy", _cross_entropy, out_ok=False)
register(F.scaled_dot_product_attention, "scaled_dot_product_attention", out_ok=False)

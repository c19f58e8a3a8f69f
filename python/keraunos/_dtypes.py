"""torch.dtype / torch.device <-> keraunos._C types."""

import torch

from . import _C

TORCH_TO_KR = {
    torch.bool: _C.DType.bool,
    torch.uint8: _C.DType.uint8,
    torch.int8: _C.DType.int8,
    torch.int16: _C.DType.int16,
    torch.int32: _C.DType.int32,
    torch.int64: _C.DType.int64,
    torch.float16: _C.DType.float16,
    torch.bfloat16: _C.DType.bfloat16,
    torch.float32: _C.DType.float32,
    torch.float64: _C.DType.float64,
}
KR_TO_TORCH = {v: k for k, v in TORCH_TO_KR.items()}


def to_kr_dtype(d: torch.dtype, what: str = "dtype"):
    try:
        return TORCH_TO_KR[d]
    except KeyError:
        raise NotImplementedError(f"keraunos: {what} {d} is not supported yet") from None


def to_kr_device(d) -> "_C.Device":
    d = torch.device(d)
    if d.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"keraunos supports cpu and cuda devices, not '{d}'")
    index = d.index
    if d.type == "cuda" and index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return _C.Device(d.type, -1 if index is None else index)


def to_torch_device(d: "_C.Device") -> torch.device:
    return torch.device("cpu") if d.type == "cpu" else torch.device("cuda", d.index)

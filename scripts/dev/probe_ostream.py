import sys
if sys.argv[1] == "torch_first":
    import torch  # noqa: F401
from keraunos import _C
b = _C.Builder()
p = b.add_input(_C.DType.float32, _C.Device("cpu", -1), [2, 3], [1, 2], 0, -1, False)
print(sys.argv[1], repr(p), flush=True)

import importlib
import os

os.environ.setdefault("KERAUNOS_VERIFY", "1")  # the verifier runs after every pass in tests


def _nvrtc_available() -> bool:
    return importlib.import_module("keraunos._cuda").nvrtc_available()[0]


# Every kernel the tests generate also goes through the CUDA emitter and NVRTC (compiled for
# sm_90, not launched), so CUDA code generation is checked on machines without a GPU.
if _nvrtc_available():
    os.environ.setdefault("KERAUNOS_CHECK_CUDA_CODEGEN", "1")

# Collect the ops that acquired traces contain, for tests/python/test_zz_op_coverage.py.
importlib.import_module("keraunos.jit").OP_COVERAGE = set()

# torchvision (test models) imports even where its C++ operators cannot load next to a CPU torch;
# transformers imports it when present, so this comes before any model import.
importlib.import_module("keraunos.testing").import_torchvision()

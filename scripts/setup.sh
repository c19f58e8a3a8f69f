#!/usr/bin/env bash
# Sets up everything keraunos needs on a fresh machine: a virtual environment with a pinned
# CPU build of torch, the build tools, and keraunos itself built from source.
# Idempotent: a second run only rebuilds keraunos.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
PY="${PYTHON:-python3}"
VENV="${KERAUNOS_VENV:-$root/.venv}"
# Pinned: an open torch range would pull a multi-GB CUDA build; 2.13.0 is the CPU build.
TORCH_SPEC="${KERAUNOS_TORCH:-torch==2.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, nanobind, scikit_build_core, pytest, ruff" 2>/dev/null; then
  echo "[setup] installing $TORCH_SPEC and build tools"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$TORCH_SPEC" numpy \
    "nanobind>=2.0" "scikit-build-core>=0.10" cmake ninja pytest ruff
fi
# NVRTC, so that CI (no GPU) compiles the generated CUDA kernels; pinned, and on local disk
# here. Optional: without it the NVRTC tests skip and say why. torch's CUDA builds bring their
# own copy (nvidia-cuda-nvrtc, or -cu12 for CUDA 12), which is kept.
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] &&
   ! "$VENV/bin/pip" show -q nvidia-cuda-nvrtc >/dev/null 2>&1 &&
   ! "$VENV/bin/pip" show -q nvidia-cuda-nvrtc-cu12 >/dev/null 2>&1; then
  echo "[setup] installing nvidia-cuda-nvrtc==13.0.88"
  "$VENV/bin/pip" install -q --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 ||
    echo "[setup] warning: nvidia-cuda-nvrtc did not install; CUDA compilation tests will skip"
fi
# The model suite (tests/models): transformers for tiny random-init Hugging Face models (no
# download), torchvision for resnet18/mobilenet_v3_small. Pinned; --no-deps for torchvision so
# that its exact torch pin does not replace the CPU build (PyPI's wheel is a CUDA build: its
# C++ ops do not load with CPU torch, which the tests work around; the models need none).
if ! "$VENV/bin/python" -c "import transformers" 2>/dev/null; then
  echo "[setup] installing transformers==4.57.6"
  "$VENV/bin/pip" install -q --disable-pip-version-check transformers==4.57.6
fi
if ! "$VENV/bin/pip" show -q torchvision >/dev/null 2>&1; then
  echo "[setup] installing torchvision==0.28.0 (for torch 2.13.0) and pillow==13.0.0"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps torchvision==0.28.0 \
    pillow==13.0.0
fi
echo "[setup] building keraunos"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps "$root"
echo "[setup] ready: $("$VENV/bin/python" -c 'import keraunos, torch; print("keraunos", keraunos.__version__, "torch", torch.__version__)')"

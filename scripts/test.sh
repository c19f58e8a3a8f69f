#!/usr/bin/env bash
# Sets up keraunos (scripts/setup.sh) and runs every test: lint, the C++ unit tests
# (GoogleTest via CTest) and the Python tests against eager PyTorch.
# Every stage runs even when an earlier one fails; the failed stages are listed at the end and
# the script then exits non-zero. (Setup failing still stops it: nothing else could run.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh"
VENV="${KERAUNOS_VENV:-$root/.venv}"
export PATH="$VENV/bin:$PATH"

failed=()
# Runs "$@" (a function below) as one stage: its failure is recorded, not fatal. The stage runs
# in a subshell with errexit on, so a failing command inside it ends that stage at once. (Not
# `( ... ) || rc=$?`: bash ignores errexit inside the left side of ||, even where it is set.)
stage() {
  local name="$1"
  shift
  echo "[test] $name"
  local rc
  set +e
  ( set -euo pipefail; "$@" )
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    echo "[test] FAILED: $name (exit code $rc)"
    failed+=("$name")
  fi
}

run_ruff() {
  ruff check python tests benchmarks examples scripts
}

run_cpp_tests() {
  if [ ! -f /usr/include/gtest/gtest.h ]; then
    echo "[test] installing GoogleTest (libgtest-dev)"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgtest-dev >/dev/null
  fi
  cmake -S "$root" -B "$root/build/cpp-tests" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKERAUNOS_BUILD_TESTS=ON -DKERAUNOS_BUILD_PYTHON=OFF >/dev/null
  cmake --build "$root/build/cpp-tests"
  # The NVRTC that setup.sh installed (the nvidia-cuda-nvrtc wheel), so that the CUDA
  # code-generation tests compile their kernels instead of skipping.
  if [ -z "${KERAUNOS_NVRTC_LIBRARY:-}" ]; then
    local nvrtc
    nvrtc="$("$VENV/bin/python" -c 'import os, keraunos._cuda as c
d = c.nvrtc_search_dirs()
libs = sorted(f for f in os.listdir(d[0]) if f.startswith("libnvrtc.so")) if d else []
print(os.path.join(d[0], libs[0]) if libs else "")' 2>/dev/null || true)"
    if [ -n "$nvrtc" ]; then export KERAUNOS_NVRTC_LIBRARY="$nvrtc"; fi
  fi
  cd "$root/build/cpp-tests" && ctest --output-on-failure
}

run_python_tests() {
  cd "$root/tests/python"  # import the installed package, not the source tree
  python -m pytest -q -p no:cacheprovider "$@" "$root/tests/python" "$root/tests/fuzz" "$root/tests/models" \
    "$root/tests/opinfo"
}

# The same Python tests against a build with AddressSanitizer and UBSan: memory errors that an
# optimized build survives by luck (or that only crash elsewhere) fail here.
run_python_tests_asan() {
  cmake -S "$root" -B "$root/build/asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" \
    -DPython_EXECUTABLE="$VENV/bin/python" >/dev/null
  cmake --build "$root/build/asan"
  rm -rf "$root/build/asan-pkg" && mkdir -p "$root/build/asan-pkg"
  cp -r "$root/python/keraunos" "$root/build/asan-pkg/"
  cp "$root"/build/asan/_C*.so "$root/build/asan-pkg/keraunos/"
  cd "$root/tests/python"
  LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  PYTHONPATH="$root/build/asan-pkg" \
    python -m pytest -q -p no:cacheprovider "$root/tests/python" "$root/tests/fuzz" \
      "$root/tests/models" -k "not models or jit and consecutive"
}

stage "ruff" run_ruff
stage "C++ unit tests" run_cpp_tests
stage "Python tests" run_python_tests "$@"
if [ "${KERAUNOS_SANITIZE:-1}" != "0" ] && command -v gcc >/dev/null; then
  stage "Python tests under ASan + UBSan" run_python_tests_asan
fi

if [ "${#failed[@]}" != 0 ]; then
  echo "[test] ${#failed[@]} stage(s) failed:"
  for s in "${failed[@]}"; do echo "[test]   - $s"; done
  exit 1
fi
echo "[test] all stages passed"

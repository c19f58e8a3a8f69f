#!/usr/bin/env bash
# Sets up keraunos (scripts/setup.sh) and runs every test: lint, the C++ unit tests
# (GoogleTest via CTest) and the Python tests against eager PyTorch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/setup.sh"
VENV="${KERAUNOS_VENV:-$root/.venv}"
export PATH="$VENV/bin:$PATH"

echo "[test] ruff"
ruff check python tests benchmarks examples

if [ ! -f /usr/include/gtest/gtest.h ]; then
  echo "[test] installing GoogleTest (libgtest-dev)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgtest-dev >/dev/null
fi
echo "[test] C++ unit tests"
cmake -S "$root" -B "$root/build/cpp-tests" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKERAUNOS_BUILD_TESTS=ON -DKERAUNOS_BUILD_PYTHON=OFF >/dev/null
cmake --build "$root/build/cpp-tests"
(cd "$root/build/cpp-tests" && ctest --output-on-failure)

echo "[test] Python tests"
cd "$root/tests/python"  # import the installed package, not the source tree
python -m pytest -q -p no:cacheprovider "$@" "$root/tests/python" "$root/tests/fuzz" "$root/tests/models"

# The same Python tests against a build with AddressSanitizer and UBSan: memory errors that an
# optimized build survives by luck (or that only crash elsewhere) fail here.
if [ "${KERAUNOS_SANITIZE:-1}" != "0" ] && command -v gcc >/dev/null; then
  echo "[test] Python tests under ASan + UBSan"
  cmake -S "$root" -B "$root/build/asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" \
    -DPython_EXECUTABLE="$VENV/bin/python" >/dev/null
  cmake --build "$root/build/asan"
  rm -rf "$root/build/asan-pkg" && mkdir -p "$root/build/asan-pkg"
  cp -r "$root/python/keraunos" "$root/build/asan-pkg/"
  cp "$root"/build/asan/_C*.so "$root/build/asan-pkg/keraunos/"
  LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  PYTHONPATH="$root/build/asan-pkg" \
    python -m pytest -q -p no:cacheprovider "$root/tests/python" "$root/tests/fuzz"
fi

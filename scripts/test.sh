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
python -m pytest -q -p no:cacheprovider "$@" "$root/tests/python" "$root/tests/fuzz"

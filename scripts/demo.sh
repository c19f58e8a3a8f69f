#!/usr/bin/env bash
# Sets up keraunos (scripts/setup.sh) and runs the demo: on the GPU when there is one,
# otherwise on the CPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
exec "${KERAUNOS_VENV:-$root/.venv}/bin/python" "$root/examples/demo.py" "$@"

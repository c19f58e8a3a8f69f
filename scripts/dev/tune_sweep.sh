#!/usr/bin/env bash
# Runs the C++ bandwidth report (tests/cpp/cuda_kernel_gpu_test.cpp) under several
# KERAUNOS_CUDA_TUNE settings on the GPU machine: the schedule parameters' measured effect.
# Usage (in the repository root, after a build of /tmp/cpp-tests): scripts/dev/tune_sweep.sh SPEC...
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
for spec in "$@"; do
  echo "=== KERAUNOS_CUDA_TUNE=$spec"
  KERAUNOS_CUDA_TUNE="$spec" timeout 60 /tmp/cpp-tests/keraunos_tests \
    --gtest_filter='CudaGpu.*' >"$OUT/sweep-${spec//[=,]/_}.log" 2>&1
  grep "\[bandwidth\]" "$OUT/sweep-${spec//[=,]/_}.log" | grep -E "cluster|rms_norm |bfloat16|rows (8192|4096|1024) " | sed 's/\[bandwidth\] //'
  grep -E "PASSED|FAILED|error" "$OUT/sweep-${spec//[=,]/_}.log" | head -3
done

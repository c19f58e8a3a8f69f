#!/usr/bin/env bash
# One batched session on the GPU machine (the `device` tool): build from source, then run the
# GPU checks and benchmarks in the foreground while CPU fuzz workers use the idle cores.
# Logs go to $OUT. Usage: scripts/dev/gpu_session.sh [steps...] (default: all)
#   env FUZZ_PER_WORKER (programs per worker), FUZZ_WORKERS (per fusion type), FUZZ_SEED0,
#   FUZZ_SECONDS (a worker stops there and reports the programs it ran); the fuzzgrad step:
#   GRAD_FUZZ_WORKERS, GRAD_FUZZ_SEED0, GRAD_FUZZ_SECONDS
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
ROOT=$(pwd)
STEPS=${*:-build fuzzcpu cudatests bugs bench sanitizer opsuite cudafuzz wait pack}
export KERAUNOS_CACHE_DIR=/tmp/kr-cache
export KERAUNOS_CHECK_CUDA_CODEGEN=0
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/timeline.txt"; }
for step in $STEPS; do
  case $step in
  build)
    stamp build
    python3 -m pip install --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
    ;;
  fuzzcpu)
    stamp "cpu fuzz workers"
    n=${FUZZ_PER_WORKER:-1500}; w=${FUZZ_WORKERS:-5}; s0=${FUZZ_SEED0:-500000}
    for ft in consecutive dataflow; do
      for i in $(seq 0 $((w - 1))); do
        (cd /tmp && KERAUNOS_CACHE_DIR=/tmp/kr-fuzz-$ft-$i timeout 560 python3 -m keraunos.fuzz \
          --programs "$n" --seed $((s0 + i * n)) --fusion-type $ft --max-lines 12 --seconds ${FUZZ_SECONDS:-520} \
          >"$OUT/fuzz-cpu-$ft-$i.log" 2>&1) &
      done
    done
    ;;
  fuzzgrad)
    # The fuzzer with gradients on the CPU (inputs require grad; every input's gradient
    # compared): GRAD_FUZZ_WORKERS per fusion type, from GRAD_FUZZ_SEED0, for GRAD_FUZZ_SECONDS.
    stamp "cpu grad fuzz workers"
    w=${GRAD_FUZZ_WORKERS:-7}; s0=${GRAD_FUZZ_SEED0:-3000000}; n=100000
    for ft in consecutive dataflow; do
      off=0; [ $ft = dataflow ] && off=5000000
      for i in $(seq 0 $((w - 1))); do
        (cd /tmp && KERAUNOS_CACHE_DIR=/tmp/kr-gfuzz-$ft-$i timeout $(( ${GRAD_FUZZ_SECONDS:-440} + 60 )) python3 -m keraunos.fuzz \
          --grad --programs $n --seed $((s0 + off + i * n)) --fusion-type $ft --max-lines 12 \
          --seconds ${GRAD_FUZZ_SECONDS:-440} >"$OUT/fuzz-grad-$ft-$i.log" 2>&1) &
      done
    done
    ;;
  cpptests)
    # The C++ GPU tests (tests/cpp/cuda_kernel_gpu_test.cpp) when GoogleTest is installed there.
    stamp "C++ GPU tests"
    if [ -f /usr/include/gtest/gtest.h ]; then
      (cmake -S . -B /tmp/cpp-tests -G Ninja -DCMAKE_BUILD_TYPE=Release -DKERAUNOS_BUILD_TESTS=ON \
         -DKERAUNOS_BUILD_PYTHON=OFF && cmake --build /tmp/cpp-tests && \
         timeout 200 /tmp/cpp-tests/keraunos_tests --gtest_filter='Cuda*:Nvrtc*') >"$OUT/cpptests.log" 2>&1
      grep -E "PASSED|FAILED|BandwidthReport|TB/s|GB/s" "$OUT/cpptests.log" | tail -30
    else
      echo "no GoogleTest on this machine" | tee "$OUT/cpptests.log"
    fi
    ;;
  sweep)
    # Schedule parameters (scripts/dev/tune_sweep.sh; needs the cpptests build): SWEEP="spec;spec".
    stamp "tuning sweep"
    IFS=';' read -r -a specs <<<"${SWEEP:-max_cluster=8}"
    OUT="$OUT" scripts/dev/tune_sweep.sh "${specs[@]}"
    ;;
  cudatests)
    stamp "test_cuda + test_nvrtc"
    (cd tests/python && timeout 300 python3 -m pytest -q -p no:cacheprovider test_cuda.py test_nvrtc.py) >"$OUT/cudatests.log" 2>&1
    tail -3 "$OUT/cudatests.log"
    ;;
  kerneltests)
    # What kernels take (cat, gathers, integer math) and the CUDA schedules, on the GPU.
    stamp "kernel tests on CUDA (xdist)"
    (cd tests/python && KERAUNOS_TEST_DEVICE=cuda timeout ${KERNELTESTS_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider \
      -n 8 --tb=short -rf test_cat_kernels.py test_gather_kernels.py test_int_kernels.py test_random_kernels.py test_index_scan_kernels.py test_cuda.py test_nvrtc.py) \
      >"$OUT/kerneltests.log" 2>&1
    grep -E "^FAILED|passed|failed" "$OUT/kerneltests.log" | cut -c1-400 | tail -30
    ;;
  bugs)
    stamp "bug-report programs"
    timeout 120 python3 scripts/dev/cuda_compile_checks.py >"$OUT/bugs.log" 2>&1; tail -4 "$OUT/bugs.log"
    ;;
  bench)
    stamp "gpu benchmark"
    timeout 300 python3 benchmarks/gpu.py --no-compile-time >"$OUT/gpu_bench.md" 2>"$OUT/gpu_bench.err"; grep -E "^\||µs" "$OUT/gpu_bench.md" | tail -30; tail -3 "$OUT/gpu_bench.err"
    ;;
  ctime)
    stamp "compile time (keraunos, CUDA)"
    timeout 60 python3 scripts/dev/compile_time.py cuda >"$OUT/compile_time.log" 2>&1; cat "$OUT/compile_time.log"
    ;;
  sanitizer)
    stamp "compute-sanitizer"
    CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -n "$CS" ]; then
      timeout ${SANITIZER_TIMEOUT:-240} "$CS" --tool memcheck --error-exitcode 9 python3 scripts/dev/cuda_sanitize_subset.py >"$OUT/sanitizer.log" 2>&1
      echo "memcheck rc=$?" >>"$OUT/sanitizer.log"; tail -5 "$OUT/sanitizer.log"
    else
      echo "no compute-sanitizer found" | tee "$OUT/sanitizer.log"
    fi
    ;;
  opsuite)
    stamp "op suite on CUDA"
    (cd tests/python && KERAUNOS_TEST_DEVICE=cuda timeout ${OPSUITE_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -n 6 \
      test_elementwise.py test_reduction.py test_nn.py test_shape.py test_mutation_basic.py test_creation.py) >"$OUT/opsuite.log" 2>&1
    tail -15 "$OUT/opsuite.log"
    ;;
  fallback)
    # The torch fallback, grad-mode, autocast and vmap tests on CUDA tensors.
    stamp "test_fallback on CUDA"
    (cd tests/python && KERAUNOS_TEST_DEVICE=cuda timeout ${FALLBACK_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider \
      test_fallback.py test_dynamo.py test_split.py) >"$OUT/fallback.log" 2>&1
    tail -8 "$OUT/fallback.log"
    ;;
  models)
    # Real models in bfloat16: eager, torch.compile, keraunos.jit, torch.compile(backend=keraunos).
    stamp "models (bf16)"
    timeout ${MODELS_TIMEOUT:-420} python3 benchmarks/models.py --device cuda --dtype bfloat16 \
      --size ${MODELS_SIZE:-small} --reps ${MODELS_REPS:-10} --models "${MODELS_LIST:-}" >>"$OUT/models_bf16.log" 2>&1
    cat "$OUT/models_bf16.log" | grep -v "^\s*$" | tail -60
    ;;
  modeltests)
    stamp "tests/models on CUDA"
    # (tests/models runs on the CPU in float32: this checks the device's torch and transformers.)
    (cd tests/python && timeout ${MODELTESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
      -n ${MODELTESTS_WORKERS:-8} --tb=line -rf -k "${MODELTESTS_K:-}" ../models) >"$OUT/modeltests.log" 2>&1
    grep -E "^FAILED|passed|failed" "$OUT/modeltests.log" | cut -c1-400 | tail -30
    ;;
  cudafuzz)
    stamp "cuda fuzz"
    (cd /tmp && timeout ${CUDA_FUZZ_TIMEOUT:-240} python3 -m keraunos.fuzz --programs ${CUDA_FUZZ_PROGRAMS:-1000} \
      --seconds $(( ${CUDA_FUZZ_TIMEOUT:-240} - 20 )) --device cuda --fusion-type both) >"$OUT/fuzz-cuda.log" 2>&1
    tail -3 "$OUT/fuzz-cuda.log"
    ;;
  cudafuzzpar)
    # CUDA fuzz workers in the background (CUDA_FUZZ_WORKERS per fusion type, CUDA_FUZZ_SEED0,
    # CUDA_FUZZ_SECONDS, CUDA_FUZZ_GRAD_WORKERS with --grad); `wait` collects them with the CPU
    # ones.
    stamp "cuda fuzz workers"
    w=${CUDA_FUZZ_WORKERS:-4}; s0=${CUDA_FUZZ_SEED0:-700000}; n=100000
    for ft in consecutive dataflow; do
      for i in $(seq 0 $((w - 1))); do
        (cd /tmp && KERAUNOS_CACHE_DIR=/tmp/kr-cfuzz-$ft-$i timeout $(( ${CUDA_FUZZ_SECONDS:-400} + 60 )) python3 -m keraunos.fuzz \
          --programs $n --seed $((s0 + i * n)) --device cuda --fusion-type $ft --max-lines 12 \
          --seconds ${CUDA_FUZZ_SECONDS:-400} >"$OUT/fuzz-cuda-$ft-$i.log" 2>&1) &
      done
      # With gradients (CUDA_FUZZ_GRAD_WORKERS per fusion type).
      for i in $(seq 0 $(( ${CUDA_FUZZ_GRAD_WORKERS:-0} - 1 ))); do
        (cd /tmp && KERAUNOS_CACHE_DIR=/tmp/kr-gfuzz-$ft-$i timeout $(( ${CUDA_FUZZ_SECONDS:-400} + 60 )) python3 -m keraunos.fuzz \
          --programs $n --seed $((s0 + 5000000 + i * n)) --device cuda --fusion-type $ft --max-lines 12 --grad \
          --seconds ${CUDA_FUZZ_SECONDS:-400} >"$OUT/fuzz-cudagrad-$ft-$i.log" 2>&1) &
      done
    done
    ;;
  gradtests)
    # Autograd through compiled programs on CUDA (tests/python/test_grad.py).
    stamp "grad tests on CUDA (xdist)"
    (cd tests/python && KERAUNOS_TEST_DEVICE=cuda timeout ${GRADTESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider \
      -n ${GRADTESTS_WORKERS:-6} --tb=short -rf test_grad.py) >"$OUT/gradtests.log" 2>&1
    grep -E "^FAILED|passed|failed" "$OUT/gradtests.log" | cut -c1-400 | tail -20
    ;;
  train)
    stamp "training step benchmark (CUDA, bf16)"
    timeout ${TRAIN_TIMEOUT:-240} python3 benchmarks/train.py --rounds ${TRAIN_ROUNDS:-5} >"$OUT/train.md" 2>"$OUT/train.err"
    grep -E "^\||^#" "$OUT/train.md"; tail -5 "$OUT/train.err"
    ;;
  peakmem)
    stamp "what is alive at the training step's peak memory (CUDA, bf16)"
    timeout ${PEAKMEM_TIMEOUT:-240} python3 scripts/dev/peak_memory.py --case ${PEAKMEM_CASE:-llama} >"$OUT/peakmem.log" 2>&1
    tail -80 "$OUT/peakmem.log"
    ;;
  proftrain)
    stamp "training step profile (CUDA, bf16)"
    timeout ${PROFTRAIN_TIMEOUT:-240} python3 scripts/dev/profile_train.py --dump "$OUT/train_programs.txt" ${PROFTRAIN_ARGS:-} >"$OUT/proftrain.log" 2>&1
    cat "$OUT/proftrain.log" | grep -v "^\[" | tail -90
    ;;
  wait)
    stamp "waiting for fuzz workers"
    wait
    grep -H "programs," "$OUT"/fuzz-*.log
    ;;
  quick)
    # A short validation + measurement pass: CUDA tests, the row-schedule benchmarks and
    # compile times.
    stamp "test_cuda (xdist)"
    (cd tests/python && timeout 90 python3 -m pytest -q -p no:cacheprovider -n 8 test_cuda.py test_nvrtc.py) >"$OUT/cudatests.log" 2>&1
    tail -3 "$OUT/cudatests.log"
    stamp "compile time"
    timeout 40 python3 scripts/dev/compile_time.py cuda >"$OUT/compile_time.log" 2>&1; cat "$OUT/compile_time.log"
    stamp "gpu benchmark (rows)"
    timeout 120 python3 benchmarks/gpu.py --no-compile-time --rounds 7 --cases softmax,layer_norm,rms_norm,rms_norm_fn >"$OUT/gpu_bench_rows.md" 2>"$OUT/gpu_bench_rows.err"; grep "^|" "$OUT/gpu_bench_rows.md"; tail -3 "$OUT/gpu_bench_rows.err"
    ;;
  pack)
    # The device tool brings back few files: one archive of every log.
    (cd "$OUT" && tar czf /tmp/logs.tar.gz --exclude=logs.tar.gz . && rm -rf ./* && mv /tmp/logs.tar.gz .)
    ;;
  esac
done
echo "[$(( $(date +%s) - t0 ))s] done"

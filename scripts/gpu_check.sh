#!/usr/bin/env bash
# The GPU checks of issue "First runs on a GPU", in one command for a machine with an NVIDIA GPU
# (the device machine: no network, a CUDA driver, compute-sanitizer, python3 with h5py and pandas).
# Run from the repository root after scripts/gpu_bundle.sh has built the CUDA build here and gathered
# what the device machine lacks into .gpu/ (the binaries in .gpu/bin, libraries in .gpu/lib, the test
# data in .gpu/data):
#   bash scripts/gpu_check.sh [BIN] [LOG_DIR] [STEPS]
# BIN: the folder with kvsim, libkvsim_cuda.so and kvsim_cuda_tests (default .gpu/bin); LOG_DIR: where logs go (default $OUT, else /tmp/gpu_check);
# STEPS: a comma list of env,parity,sanitizer,quickstart,e2e_layer,smollm2,gemma3,deadline,e2e_32,state32k,scale32k,
# e2e_floor,bench_quick,bench (default: all but gemma3, deadline, e2e_32, state32k, scale32k, e2e_floor and bench_quick,
# in that order). scale32k needs no file; gemma3 needs results/recordings/gemma3_tinystories_4096_global.h5
# carried (experiments/gemma3_gpu_4096.toml says how it is made).
# Each step runs under its own time limit, so one hang cannot eat the others' time; the summary at the
# end lists each step's exit status and seconds. Everything is appended to LOG_DIR/gpu.log.
set -u
B=${1:-.gpu/bin}
LOG=${2:-${OUT:-/tmp/gpu_check}}
STEPS=${3:-env,parity,sanitizer,quickstart,e2e_layer,smollm2,bench}
# KVSIM_GPU_DEADLINE: seconds for the whole script (default 540); each step's limit is cut to what is
# left, and a step with under 5 s left is skipped.
DEADLINE=$(($(date +%s) + ${KVSIM_GPU_DEADLINE:-540}))
# KVSIM_GPU_STEPPING: "blocked" or "per_step" for every kvsim run below ([eval] stepping; unset: the
# configs' own, blocked by default: h2o and buzz form a block's logits as one tiled product on the
# device, and on the CPU path).
X=()
[ -n "${KVSIM_GPU_STEPPING:-}" ] && X=(--set "eval.stepping=\"$KVSIM_GPU_STEPPING\"")
mkdir -p "$LOG"
ROOT=$PWD
SUMMARY=""
if [ -f .gpu/bundle.tar.gz ] && [ ! -d .gpu/bin ]; then tar -C .gpu -xzf .gpu/bundle.tar.gz; fi

# Runtime libraries: the ones gathered by gpu_bundle.sh (.gpu/lib), then the machine's cuBLAS
# (PyTorch's wheel ships it; the CUDA toolkit may too).
CUBLAS_DIR=$(dirname "$(find /usr/local/cuda* /opt /usr/lib -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$ROOT/.gpu/lib:${CUBLAS_DIR:-}:${LD_LIBRARY_PATH:-}"
export KVSIM_SHARED_DATA="$ROOT/.gpu/data"
export KVSIM_CUDA_MODULE="$ROOT/$B/libkvsim_cuda.so"

has() { [[ ",$STEPS," == *",$1,"* ]]; }
# step NAME LIMIT_S CMD...: runs CMD under `timeout`, output appended to gpu.log and echoed.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 5 ]; then
    echo "=== $name: skipped (the deadline has passed)" | tee -a "$LOG/gpu.log"
    SUMMARY+=$(printf '%-24s skipped' "$name")$'\n'
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "=== $name: $*" | tee -a "$LOG/gpu.log"
  local t0=$(date +%s%N)
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG/gpu.log"
  local rc=${PIPESTATUS[0]}
  local ms=$((($(date +%s%N) - t0) / 1000000))
  echo "=== $name: rc=$rc in $ms ms" | tee -a "$LOG/gpu.log"
  SUMMARY+=$(printf '%-24s rc=%-4s %8d ms' "$name" "$rc" "$ms")$'\n'
}

if has env; then
  step env 30 bash -c "date -u; nvidia-smi; nvcc --version | tail -2; nproc; grep -m1 'model name' /proc/cpuinfo;
    echo cublas: $CUBLAS_DIR; ldd $B/kvsim $B/libkvsim_cuda.so | grep -i 'not found' || echo 'all libraries found'"
fi
if has parity; then
  # The cases `ctest -L gpu` runs (catch_discover_tests with TEST_SPEC "[cuda]"), in one process.
  step parity 150 "$B/kvsim_cuda_tests" "[cuda]" --durations yes
  # The default is flash at head_dim 64/128 (gemm otherwise); every case again with gemm, the
  # exact-attention cases with the first version's kernel (KVSIM_CUDA_EXACT=kernel), and gemm with
  # chunks of 7 rows (many chunk edges) and of 256.
  step parity_gemm 150 env KVSIM_CUDA_EXACT=gemm "$B/kvsim_cuda_tests" "[cuda]"
  # h2o and buzz with their state in global memory (as where it does not fit in shared memory).
  step parity_state_global 150 env KVSIM_CUDA_STATE_SMEM=0 "$B/kvsim_cuda_tests" "[cuda]"
  step parity_exact_kernel 60 env KVSIM_CUDA_EXACT=kernel "$B/kvsim_cuda_tests" "cuda: exact*" --durations yes
  step parity_exact_rows7 60 env KVSIM_CUDA_EXACT=gemm KVSIM_CUDA_EXACT_ROWS=7 "$B/kvsim_cuda_tests" "cuda: exact*"
  step parity_exact_rows256 60 env KVSIM_CUDA_EXACT=gemm KVSIM_CUDA_EXACT_ROWS=256 "$B/kvsim_cuda_tests" "cuda: exact*"
fi
if has sanitizer; then
  for tool in memcheck racecheck; do
    step "sanitizer_$tool" 75 compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
      "$B/kvsim" run experiments/gpu_sanitizer.toml "${X[@]}" --device cuda --out "/tmp/gpu_sanitizer_$tool" --quiet
  done
  # h2o and buzz stepped in blocks of 7 (blocks ending between evaluated steps).
  for tool in memcheck racecheck; do
    step "sanitizer_${tool}_blocked" 75 compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
      "$B/kvsim" run experiments/gpu_sanitizer.toml --set 'eval.stepping="blocked"' --set eval.stepping_block=7 \
      --device cuda --out "/tmp/gpu_sanitizer_${tool}_blocked" --quiet
  done
  # Again with the layer's cells replayed together, through the streams uploaded once per layer.
  step sanitizer_memcheck_batch 75 env KVSIM_CUDA_LAYER_BATCH=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
    --print-limit 20 "$B/kvsim" run experiments/gpu_sanitizer.toml "${X[@]}" --device cuda --out /tmp/gpu_sanitizer_batch --quiet
fi
if has quickstart; then  # docs/performance.md's GPU example
  step quickstart_cuda 60 "$B/kvsim" run experiments/quickstart.toml "${X[@]}" --device cuda --out /tmp/quickstart_cuda
fi
if has e2e_layer; then  # one layer of the bench's end-to-end run: its metrics, GPU against CPU
  cfg=experiments/gpu_e2e_layer.toml
  step e2e_layer_cuda 90 "$B/kvsim" run "$cfg" "${X[@]}" --device cuda --out /tmp/e2e_cuda --quiet
  step e2e_layer_cpu 90 "$B/kvsim" run "$cfg" "${X[@]}" --out /tmp/e2e_cpu --quiet
  step e2e_layer_compare 60 env -u LD_LIBRARY_PATH python3 scripts/compare_results.py --atol 1e-4 --rtol 1e-4 /tmp/e2e_cpu /tmp/e2e_cuda
  cp /tmp/e2e_cuda/summary.csv "$LOG/e2e_layer_cuda_summary.csv" 2>/dev/null
fi
if has smollm2; then
  cfg=experiments/smollm2_gpu_8192.toml
  step smollm2_cuda 120 env KVSIM_CUDA_LAYER_BATCH=1 "$B/kvsim" run "$cfg" "${X[@]}" --device cuda --out /tmp/smollm2_cuda --quiet
  # The same with one replay launch per cell instead of per layer (what the layer batch gains).
  step smollm2_cuda_per_cell 120 env KVSIM_CUDA_LAYER_BATCH=0 "$B/kvsim" run "$cfg" "${X[@]}" --device cuda --out /tmp/smollm2_cuda_pc --quiet
  step smollm2_cpu 150 "$B/kvsim" run "$cfg" "${X[@]}" --out /tmp/smollm2_cpu --quiet
  step smollm2_compare 60 env -u LD_LIBRARY_PATH python3 scripts/compare_results.py --atol 1e-4 --rtol 1e-4 /tmp/smollm2_cpu /tmp/smollm2_cuda
  step smollm2_compare_per_cell 60 env -u LD_LIBRARY_PATH python3 scripts/compare_results.py /tmp/smollm2_cuda /tmp/smollm2_cuda_pc
  cp /tmp/smollm2_cuda/summary.csv "$LOG/smollm2_cuda_summary.csv" 2>/dev/null
  cp /tmp/smollm2_cpu/summary.csv "$LOG/smollm2_cpu_summary.csv" 2>/dev/null
fi
if has gemma3; then  # Gemma 3 270M's global layers at 4096 tokens (head_dim 256), GPU beside CPU
  cfg=experiments/gemma3_gpu_4096.toml
  step gemma3_cuda 120 "$B/kvsim" run "$cfg" "${X[@]}" --device cuda --out /tmp/gemma3_cuda --quiet
  step gemma3_cpu 150 "$B/kvsim" run "$cfg" "${X[@]}" --out /tmp/gemma3_cpu --quiet
  step gemma3_compare 60 env -u LD_LIBRARY_PATH python3 scripts/compare_results.py --atol 1e-4 --rtol 1e-4 /tmp/gemma3_cpu /tmp/gemma3_cuda
fi
if has deadline; then
  # KVSIM_CUDA_DEADLINE: a wait for the device past it fails the run in one line naming the cell; here
  # every wait is past a deadline of 1 ns. The step passes when the run fails that way, promptly.
  step deadline 60 bash -c "KVSIM_CUDA_DEADLINE=1e-9 $B/kvsim run experiments/gpu_e2e_layer.toml --set data.n=1024 \
      --device cuda --out /tmp/gpu_deadline --quiet > /tmp/gpu_deadline.txt 2>&1; rc=\$?; cat /tmp/gpu_deadline.txt;
    KVSIM_CUDA_DEADLINE=soon $B/kvsim run experiments/gpu_e2e_layer.toml --set data.n=1024 --device cuda \
      --out /tmp/gpu_deadline2 --quiet > /tmp/gpu_deadline2.txt 2>&1; rc2=\$?; cat /tmp/gpu_deadline2.txt;
    [ \$rc -ne 0 ] && [ \$rc2 -ne 0 ] && grep -q 'did not finish within 1e-09 s' /tmp/gpu_deadline.txt &&
      grep -q 'layer 0, KV head' /tmp/gpu_deadline.txt && [ \$(wc -l < /tmp/gpu_deadline.txt) -eq 1 ] &&
      grep -q \"KVSIM_CUDA_DEADLINE = 'soon'\" /tmp/gpu_deadline2.txt && echo 'deadline: both runs failed as expected'"
fi
if has e2e_32; then  # the 7B-shaped end-to-end run (the bench's), with the phase profile
  step e2e_32_cuda 180 env KVSIM_PROFILE=1 "$B/kvsim" run experiments/gpu_e2e_layer.toml "${X[@]}" --set data.n_layers=32 \
    --device cuda --out /tmp/e2e_32 --quiet
fi
if has state32k; then
  # h2o and buzz at the 8B shape, n = 32768, one KV head: one step at a time, then blocked; same answers.
  cfg=experiments/gpu_state_32k.toml
  step state32k_per_step 150 "$B/kvsim" run "$cfg" --set 'eval.stepping="per_step"' --device cuda --out /tmp/st32_ps --quiet
  step state32k_blocked 150 "$B/kvsim" run "$cfg" --set 'eval.stepping="blocked"' --device cuda --out /tmp/st32_bl --quiet
  step state32k_compare 30 env -u LD_LIBRARY_PATH python3 scripts/compare_results.py --atol 1e-4 --rtol 1e-4 /tmp/st32_ps /tmp/st32_bl
fi
if has scale32k; then
  # One layer of the Llama-3-8B-shaped sequence at n = 32768 (experiments/gpu_8b_32k.toml: 8 GPU
  # policies at 3 memories), with the phase profile and the device memory in use every 200 ms; its first
  # KV head (query heads 0-3) on the CPU path meanwhile, in the background on one core, and on the GPU,
  # then the two compared.
  cfg=experiments/gpu_8b_32k.toml
  timeout -k 5 $((DEADLINE - $(date +%s) > 10 ? DEADLINE - $(date +%s) : 10)) "$B/kvsim" run "$cfg" "${X[@]}" --set 'data.layers=[0]' --set 'data.heads=[0,1,2,3]' --out /tmp/s32_cpu \
    --quiet --threads 1 > "$LOG/scale32k_cpu.txt" 2>&1 &
  CPU32=$!
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$LOG/scale32k_mem.txt" 2>&1 &
  MEM=$!
  step scale32k_cuda 300 env KVSIM_PROFILE=1 "$B/kvsim" run "$cfg" "${X[@]}" --set 'data.layers=[0]' --device cuda --out /tmp/s32_cuda --quiet
  kill "$MEM" 2>/dev/null
  step scale32k_mem 10 bash -c "sort -n $LOG/scale32k_mem.txt | awk 'NR==1{lo=\$1} {hi=\$1} END{print \"device memory used: lowest sample \" lo \" MiB, peak \" hi \" MiB\"}'"
  step scale32k_cuda_kv0 240 "$B/kvsim" run "$cfg" "${X[@]}" --set 'data.layers=[0]' --set 'data.heads=[0,1,2,3]' --device cuda \
    --out /tmp/s32_cuda_kv0 --quiet
  wait "$CPU32"  # bounded by its own timeout above
  step scale32k_cpu 5 bash -c "echo 'CPU path, first KV head, in the background: exit status $?'; cat $LOG/scale32k_cpu.txt; ls /tmp/s32_cpu/results.h5"
  step scale32k_compare 60 env -u LD_LIBRARY_PATH python3 scripts/compare_results.py --atol 1e-4 --rtol 1e-4 /tmp/s32_cpu /tmp/s32_cuda_kv0
  cp /tmp/s32_cuda/summary.csv "$LOG/scale32k_cuda_summary.csv" 2>/dev/null
fi
if has bench_quick; then
  step bench_quick 90 "$B/kvsim" bench --device cuda --quick
fi
if has e2e_floor; then  # the end-to-end recording through the exact policy alone: the host's floor
  printf '%s\n' 'name = "e2e_floor"' 'seed = 1' '[data]' 'synthetic = "heavy_hitter"' 'n = 8192' 'd = 128' \
    'n_layers = 32' 'n_heads = 32' 'n_kv_heads = 32' '[eval]' 'every = 16' 'policy_precision = "float32"' \
    '[[policy]]' 'name = "exact"' > /tmp/e2e_floor.toml
  step e2e_floor_cuda 120 "$B/kvsim" run /tmp/e2e_floor.toml "${X[@]}" --device cuda --out /tmp/e2e_floor --quiet
fi
if has bench; then
  # GPU utilization every 2 s while the bench runs (its last part is the end-to-end run).
  nvidia-smi dmon -s u -d 2 > "$LOG/bench_dmon.txt" 2>&1 &
  DMON=$!
  step bench 420 "$B/kvsim" bench --device cuda
  kill "$DMON" 2>/dev/null
fi
echo "=== summary" | tee -a "$LOG/gpu.log"
printf '%s' "$SUMMARY" | tee -a "$LOG/gpu.log"

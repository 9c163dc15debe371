#!/usr/bin/env bash
# For the device machine (issue "First runs on a GPU"): the SmolLM2 batched replay with the layer
# batch's producer (KVSIM_CUDA_AHEAD=3) and without it (0), each given WAIT seconds (default 30); a run
# still going then has every thread's stack taken by cuda-gdb (bt_AHEAD.txt; the bundle keeps kvsim's
# symbol table for this) and is killed. Then one 7B-shaped layer with and without the producer.
# Run from the repository root with .gpu (scripts/gpu_bundle.sh) and the SmolLM2 recording carried:
#   WAIT=30 bash scripts/gpu_diag_hang.sh     # logs in $OUT (else /tmp/diag): diag.txt, run_*.txt, bt_*.txt
set -u
ROOT=$PWD; B=.gpu/bin; LOG=${OUT:-/tmp/diag}; mkdir -p "$LOG"
[ -d .gpu/bin ] || tar -C .gpu -xzf .gpu/bundle.tar.gz
CUBLAS_DIR=$(dirname "$(find /usr/local/cuda* /opt /usr/lib -name 'libcublas.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$ROOT/.gpu/lib:${CUBLAS_DIR:-}:${LD_LIBRARY_PATH:-}"
export KVSIM_SHARED_DATA="$ROOT/.gpu/data" KVSIM_CUDA_MODULE="$ROOT/$B/libkvsim_cuda.so" KVSIM_PROFILE=1
for AHEAD in 3 0; do
  t0=$(date +%s%N)
  env KVSIM_CUDA_AHEAD=$AHEAD KVSIM_CUDA_LAYER_BATCH=1 $B/kvsim run experiments/smollm2_gpu_8192.toml --device cuda --out /tmp/s$AHEAD --quiet > "$LOG/run_$AHEAD.txt" 2>&1 &
  pid=$!
  for i in $(seq 1 ${WAIT:-30}); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    echo "AHEAD=$AHEAD: still running after $(( ($(date +%s%N) - t0) / 1000000 )) ms: stacks" | tee -a "$LOG/diag.txt"
    timeout 60 cuda-gdb -p $pid -batch -ex "set pagination off" -ex "info threads" -ex "thread apply all bt 25" > "$LOG/bt_$AHEAD.txt" 2>&1
    kill -9 $pid; wait $pid 2>/dev/null
  else
    wait $pid; echo "AHEAD=$AHEAD: rc=$? in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$LOG/diag.txt"
  fi
done
# One layer of the end-to-end run with and without the producer (timings only).
for AHEAD in 3 0; do
  t0=$(date +%s%N)
  env KVSIM_CUDA_AHEAD=$AHEAD timeout 60 $B/kvsim run experiments/gpu_e2e_layer.toml --device cuda --out /tmp/e$AHEAD --quiet > "$LOG/e2e_layer_$AHEAD.txt" 2>&1
  echo "e2e layer AHEAD=$AHEAD: rc=$? in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$LOG/diag.txt"
done

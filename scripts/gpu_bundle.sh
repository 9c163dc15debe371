#!/usr/bin/env bash
# Prepares a run of scripts/gpu_check.sh on a machine with an NVIDIA GPU but without kvsim's build
# dependencies (the device machine: CUDA driver and runtime, no HDF5, no network). Here, on the
# development machine:
#  1. configures and builds BUILD (default build-gpu) with the CUDA module: nvcc from /usr/local/cuda,
#     cuBLAS from PyPI's nvidia-cublas wheel (Debian's CUDA 13 toolkit here ships no cuBLAS), portable
#     x86-64-v3 code instead of -march=native, no MPI, no Python module, no OpenBLAS or oneMKL (Eigen's float32
#     GEMMs, which only the float32 reference uses: the bundle and the SmolLM2 recording must fit the
#     device tool's 64 MiB together);
#  2. gathers into .gpu/bundle.tar.gz (.gpu is ignored by git through .git/info/exclude, never committed):
#     .gpu/bin   kvsim, libkvsim_cuda.so, kvsim_cuda_tests
#     .gpu/lib   the shared libraries they need beyond glibc, libstdc++ and the CUDA driver
#     .gpu/data  stories260K and the TinyStories sample from ../shared/data (the parity test reads them)
# Then, through the device tool: carry .gpu (and the SmolLM2 recording of experiments/smollm2_gpu_8192.toml)
# and run `bash scripts/gpu_check.sh`.
# Usage: bash scripts/gpu_bundle.sh [BUILD]
set -euo pipefail
B=${1:-build-gpu}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck disable=SC2046  # word-split on purpose: cublas.sh prints separate -D arguments (or none)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIM_NATIVE=OFF -DKVSIM_MPI=OFF \
  -DKVSIM_PYTHON_MODULE=OFF -DKVSIM_OPENBLAS=OFF -DKVSIM_MKL=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 $(bash scripts/cublas.sh) > /dev/null
cmake --build "$B" -j "$(nproc)" --target kvsim kvsim_cuda kvsim_cuda_tests
[ -f "$B/libkvsim_cuda.so" ] || { echo "gpu_bundle: $B/libkvsim_cuda.so was not built (is nvcc at /usr/local/cuda?)" >&2; exit 1; }

grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib .gpu/data
cp "$B/kvsim" "$B/libkvsim_cuda.so" "$(find "$B" -name kvsim_cuda_tests -type f | head -1)" .gpu/bin/
# kvsim keeps its symbol table (a stack taken on the device, e.g. by cuda-gdb -p PID, then
# names functions); the others go without.
strip --strip-unneeded .gpu/bin/libkvsim_cuda.so .gpu/bin/kvsim_cuda_tests 2>/dev/null || true
strip --strip-debug .gpu/bin/kvsim 2>/dev/null || true
# Every library the three need, except the C/C++ runtime (the device machine's is newer) and CUDA's
# driver and cuBLAS (the device machine's own); the CUDA runtime travels, it is small.
for f in .gpu/bin/*; do ldd "$f"; done | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|libresolv*|libnsl*|libutil*|libanl*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*|libcublas*) ;;
    *) cp -L "$lib" .gpu/lib/ ;;
  esac
done
SHARED=${KVSIM_SHARED_DATA:-$ROOT/../shared/data}
cp -r "$SHARED/stories260K" "$SHARED/tinystories-sample" .gpu/data/
# One compressed file travels (the device tool carries at most 64 MiB in all); gpu_check.sh unpacks it.
tar -C .gpu -czf .gpu/bundle.tar.gz bin lib data
rm -rf .gpu/bin .gpu/lib .gpu/data
du -sh .gpu/bundle.tar.gz

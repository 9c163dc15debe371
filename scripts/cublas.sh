#!/usr/bin/env bash
# Prints the CMake arguments that point kvsim's CUDA module at cuBLAS when the CUDA toolkit here
# (nvcc at /usr/local/cuda) has none: Debian's CUDA 13 toolkit ships without it, so without these the
# module (sim/cuda/) would not even be compiled. cuBLAS comes from PyPI's nvidia-cublas wheel, fetched
# once into $KVSIM_CACHE/cublas (default ~/.cache/kvsim/cublas: outside the checkout, so a fresh clone
# reuses it). Prints nothing (and the build goes on without the module, saying so) when there is no
# nvcc, the toolkit has cuBLAS already, or the wheel cannot be fetched.
# Usage: cmake ... $(bash scripts/cublas.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
NVCC=/usr/local/cuda/bin/nvcc
[ -x "$NVCC" ] || exit 0
ls /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so* > /dev/null 2>&1 && exit 0
CACHE=${KVSIM_CACHE:-$HOME/.cache/kvsim}/cublas
PY=${KVSIM_PYTHON:-.venv/bin/python}
VERSION=13.0.2.14
C=$CACHE/nvidia/cu13
if [ ! -f "$C/lib/libcublas.so.13" ]; then
  mkdir -p "$CACHE"
  if ! "$PY" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 \
      --python-version 3.11 -d "$CACHE" "nvidia-cublas==$VERSION" >&2 ||
     ! "$PY" -m zipfile -e "$CACHE"/nvidia_cublas-"$VERSION"-*.whl "$CACHE" >&2; then
    echo "cublas.sh: could not fetch nvidia-cublas $VERSION; kvsim builds without its CUDA module" >&2
    exit 0
  fi
  rm -f "$CACHE"/nvidia_cublas-*.whl  # the extracted libraries are what is kept
fi
echo "-DCMAKE_CUDA_FLAGS=-I$C/include -DCUDA_cublas_LIBRARY=$C/lib/libcublas.so.13 -DCUDA_cublasLt_LIBRARY=$C/lib/libcublasLt.so.13"

#!/usr/bin/env bash
# One-step setup for a fresh Debian 12 machine: the C++ dependencies from Debian (apt), the Python
# environment .venv from PyPI (requirements.txt, pinned), the real model files (scripts/models.tsv,
# into $KVSIM_MODELS or models/), cuBLAS for the CUDA module where nvcc is installed without it
# (scripts/cublas.sh), then configure and build kvsim in ./build (Release) with the Python module built
# for .venv's interpreter. Re-running is cheap: installed packages, the venv, fetched
# models and built objects are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/setup-venv.sh
.venv/bin/python scripts/fetch_models.py
# shellcheck disable=SC2046  # word-split on purpose: cublas.sh prints separate -D arguments (or none)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIM_PYTHON="$PWD/.venv/bin/python" $(bash scripts/cublas.sh) "$@"
cmake --build build -j "$(nproc)"

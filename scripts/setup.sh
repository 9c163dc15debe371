#!/usr/bin/env bash
# One-step setup for a fresh Debian 12 machine: install dependencies (apt), configure and build
# kvsim in ./build (Release). Re-running is cheap: installed packages and built objects are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"

#!/usr/bin/env bash
# The fuzz campaign of tests/fuzz/fuzz_inputs.py against an AddressSanitizer + UBSan build of kvsim
# (build/asan, configured with -DKVSIM_SANITIZE=ON and built here when missing or stale; only the
# kvsim binary). Usage: bash scripts/fuzz.sh [COUNT] [SEED]   (defaults 3000 inputs, seed 20261123)
# Exit 0: no findings; 1: findings (inputs copied to build/asan/fuzz_findings); 77: no python3 with h5py.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-3000}; SEED=${2:-20261123}
PY=${KVSIM_PYTHON:-$PWD/.venv/bin/python}; [ -x "$PY" ] || PY=python3
if ! "$PY" -c "import h5py, numpy" 2>/dev/null; then
  echo "SKIPPED: fuzz campaign needs python3 with h5py and numpy (scripts/setup-venv.sh installs them into .venv)"; exit 77
fi
if [ ! -f build/asan/build.ninja ]; then
  cmake -S . -B build/asan -G Ninja -DKVSIM_SANITIZE=ON -DKVSIM_CUDA=OFF -DKVSIM_NATIVE=OFF -DKVSIM_MPI=OFF -DKVSIM_PYTHON_MODULE=OFF \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1" > build/asan.configure.log
fi
cmake --build build/asan -j "$(nproc)" --target kvsim > build/asan.build.log || { tail -20 build/asan.build.log; exit 1; }
# The sanitizer build has no MPI: under a launcher of 3 ranks it must refuse in one line (exit 2)
# instead of running three copies of the same run; with 1 rank it runs (the negative control).
rc=0; out=$(OMPI_COMM_WORLD_SIZE=3 build/asan/kvsim --version 2>&1) || rc=$?
if [ $rc -ne 2 ] || ! grep -q "built without MPI" <<<"$out" || [ "$(wc -l <<<"$out")" -ne 1 ]; then
  echo "FAIL: a build without MPI under a 3-rank launcher: rc $rc, output: $out"; exit 1
fi
OMPI_COMM_WORLD_SIZE=1 build/asan/kvsim --version > /dev/null || { echo "FAIL: a 1-rank launcher was refused"; exit 1; }
echo "ok: a build without MPI refuses a 3-rank launcher: $out"
exec "$PY" tests/fuzz/fuzz_inputs.py build/asan/kvsim --count "$COUNT" --seed "$SEED" --keep build/asan/fuzz_findings

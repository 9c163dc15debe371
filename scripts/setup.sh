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
# `import kvsim` in .venv (`source .venv/bin/activate`, then plain `python`) finds the module just
# built: a .pth file naming build/python, read at start-up and appended to sys.path after
# site-packages (so a `pip install .` into .venv, as for other environments, would take precedence).
.venv/bin/python - "$PWD/build/python" <<'EOF'
import pathlib, sys, sysconfig
pathlib.Path(sysconfig.get_paths()["purelib"], "kvsim_build.pth").write_text(sys.argv[1] + "\n")
EOF

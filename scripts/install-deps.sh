#!/usr/bin/env bash
# Installs kvsim's C++ build dependencies from Debian 12 packages: the compilers and CMake/Ninja, Eigen,
# Boost, HDF5, CLI11, Catch2, toml11, nlohmann/json (budgets files), PCRE2 and OpenSSL's libcrypto (GGUF tokenizers, sha256); Open MPI for MPI-distributed runs; bc for tests/cli/resume_test.sh;
# python3-venv and python3-dev (the interpreter .venv is made from, and its C headers for the
# extension module). Every Python library comes from PyPI into .venv (scripts/setup-venv.sh), none
# from Debian's python3-* packages.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libeigen3-dev libboost-dev libhdf5-dev hdf5-tools libcli11-dev catch2 libtoml11-dev nlohmann-json3-dev libpcre2-dev libssl-dev
      python3 python3-venv python3-dev
      libopenmpi-dev openmpi-bin bc)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

#!/usr/bin/env bash
# Installs every build/test dependency of kvsim from Debian 12 packages (the Python API: python3-dev,
# pybind11-dev; its tests: python3-pandas, python3-pytest; MPI-distributed runs: Open MPI; bc for
# tests/resume_test.sh).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libeigen3-dev libboost-dev libhdf5-dev hdf5-tools libcli11-dev catch2 libtoml11-dev
      python3 python3-numpy python3-h5py python3-matplotlib
      python3-dev pybind11-dev python3-pandas python3-pytest
      libopenmpi-dev openmpi-bin bc)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

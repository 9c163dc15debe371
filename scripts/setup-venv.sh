#!/usr/bin/env bash
# Makes the Python environment .venv in the checkout (Debian's `python3 -m venv`) and installs
# requirements.txt into it, every package pinned to an exact version. pip runs only when
# requirements.txt differs from the one last installed (.venv/.kvsim-requirements), so re-running with
# unchanged pins installs nothing. pip's cache (~/.cache/pip) keeps the downloads; torch==2.13.0 comes
# from the CPU wheel these machines keep locally (pip's find-links).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
BASE_PY=/usr/bin/python3; [ -x "$BASE_PY" ] || BASE_PY=python3
if [ ! -x "$VENV/bin/python" ]; then
  "$BASE_PY" -m venv "$VENV"
fi
if cmp -s requirements.txt "$VENV/.kvsim-requirements"; then
  echo "setup-venv: .venv is up to date with requirements.txt (nothing to install)"
  exit 0
fi
rm -f "$VENV/.kvsim-requirements"
# The index warnings pip prints for this machine's extra local indexes are noise; errors still show.
"$VENV/bin/python" -m pip install --disable-pip-version-check -q -r requirements.txt 2>&1 \
  | { grep -v "^WARNING: Location 'file://" || true; }
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "setup-venv: error: pip install -r requirements.txt failed" >&2; exit 1; }
"$VENV/bin/python" -m pip check >/dev/null || { echo "setup-venv: error: pip check failed in .venv" >&2; exit 1; }
cp requirements.txt "$VENV/.kvsim-requirements"
echo "setup-venv: .venv installed from requirements.txt ($(grep -c '==' requirements.txt) pinned packages)"

#!/usr/bin/env bash
# `pip install .` into a throwaway virtual environment (Debian's python3 -m venv), then the quickstart
# through the installed `kvsim` command and through `import kvsim`: both must write the same numbers
# (scripts/compare_results.py), and the installed package must not be the build tree's.
# Usage: wheel_test.sh SOURCE_DIR     (ctest label: slow; the build takes minutes on 2 cores)
set -euo pipefail
SRC=$(cd "$1" && pwd)
BASE_PY=/usr/bin/python3; [ -x "$BASE_PY" ] || BASE_PY=python3
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
"$BASE_PY" -m venv "$TMP/venv"
echo "--- pip install $SRC (scikit-build-core)"
"$TMP/venv/bin/python" -m pip install --disable-pip-version-check -q "$SRC" 2>&1 \
  | { grep -v "^WARNING: Location 'file://" || true; }
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL: pip install $SRC"; exit 1; }
[ -x "$TMP/venv/bin/kvsim" ] || { echo "FAIL: the wheel installed no kvsim command"; exit 1; }
cd "$TMP"   # nothing of the checkout on the path
where=$("$TMP/venv/bin/python" -c "import kvsim, os; print(os.path.dirname(kvsim.__file__))")
case "$where" in "$TMP/venv/"*) echo "ok: import kvsim from $where";; *) echo "FAIL: kvsim imported from $where"; exit 1;; esac
"$TMP/venv/bin/kvsim" --version
"$TMP/venv/bin/kvsim" run "$SRC/experiments/quickstart.toml" --out "$TMP/cli" --threads 2 --quiet
"$TMP/venv/bin/python" -c "import kvsim, sys; kvsim.run(sys.argv[1], out=sys.argv[2], threads=2)" \
  "$SRC/experiments/quickstart.toml" "$TMP/py"
"$PY" "$SRC/scripts/compare_results.py" "$TMP/cli" "$TMP/py"
# Negative control: a result that differs must be told apart by the same comparison.
"$TMP/venv/bin/kvsim" run "$SRC/experiments/quickstart.toml" --out "$TMP/other" --threads 2 --quiet --set seed=2
if "$PY" "$SRC/scripts/compare_results.py" "$TMP/cli" "$TMP/other" >/dev/null 2>&1; then
  echo "FAIL: compare_results.py did not tell seed 1 from seed 2"; exit 1
fi
echo "ok: the installed command and the installed module give identical quickstart results (seed 2 differs)"

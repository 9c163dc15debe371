#!/usr/bin/env bash
# scripts/reproduce.sh end to end (every shipped experiment, figure and results/report.md), with the
# embedded figures copied into a temporary folder instead of docs/figures (no test writes a tracked
# file); then the docs' make_figures example. Exit 77 (SKIPPED) without ../shared/data.
# Usage: reproduce_test.sh SOURCE_DIR SHARED_DATA     (ctest label: slow, ~10 min on 2 cores)
set -euo pipefail
SRC=$(cd "$1" && pwd); DATA=$2
[ -d "$DATA" ] || { echo "SKIPPED: reproduce needs the real model files in $DATA"; exit 77; }
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$SRC"
KVSIM_SHARED_DATA=$DATA KVSIM_FIGURES=$TMP bash scripts/reproduce.sh 2
n=0
for f in $(sed -n 's/.*"$FIG"\/\([a-z_0-9]*\.png\).*/\1/p' scripts/reproduce.sh); do
  [ -s "$TMP/$f" ] || { echo "FAIL: figure $f was not written"; exit 1; }
  n=$((n+1))
done
[ "$n" -ge 10 ] || { echo "FAIL: only $n figures listed in scripts/reproduce.sh"; exit 1; }
[ -s results/report.md ] || { echo "FAIL: results/report.md missing"; exit 1; }
"$PY" plots/make_figures.py results/stories260k results/budget_sweep --report "$TMP/report_two.md" >/dev/null
[ -s "$TMP/report_two.md" ] || { echo "FAIL: make_figures wrote no report"; exit 1; }
echo "ok: reproduce.sh wrote $n embedded figures and results/report.md"

#!/usr/bin/env bash
# Checkpointed cells and --resume (include/kvsim/io/cell_checkpoint.hpp): a run killed with kill -9 at
# 5 seeded random moments and resumed each time ends with results identical to an uninterrupted run
# (every metric dataset, timings aside); an unfinished run is refused without --resume/--force; a
# changed config is refused on resume naming the difference; a finished run leaves no temporary files.
# Usage: resume_test.sh KVSIM_BINARY SOURCE_DIR
set -u
KVSIM=$1; SRC=$2
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails+1)); }
cat > "$TMP/c.toml" <<'TOML'
name = "resume_test"
seed = 2
[data]
synthetic = "heavy_hitter"
n = 2048
d = 32
n_layers = 6
n_heads = 8
n_kv_heads = 4
[eval]
every = 2
[[policy]]
name = "h2o"
memory = [0.1, 0.2]
[[policy]]
name = "window"
memory = 0.1
[[policy]]
name = "subgen"
memory = 0.2
TOML
start=$(date +%s.%N)
"$KVSIM" run "$TMP/c.toml" --out "$TMP/full" --threads 2 --quiet || bad "uninterrupted run"
full_s=$(echo "$(date +%s.%N) - $start" | bc)
echo "uninterrupted run: ${full_s} s"
RANDOM=20261123  # seeded: the same kill moments every time
kills=0; resumed_any=0; tries=0
while [ $kills -lt 5 ] && [ $tries -lt 15 ]; do
  tries=$((tries+1))
  # Continue the unfinished run; start over (--force) when the last one finished before its kill.
  flag=--resume; [ -d "$TMP/part/.kvsim_partial" ] || flag=--force
  "$KVSIM" run "$TMP/c.toml" --out "$TMP/part" --threads 2 --quiet $flag &
  pid=$!
  frac=$((RANDOM % 1000))  # a random moment in the first 60% of an uninterrupted run's time
  sleep "$(echo "scale=3; $full_s * 0.6 * $frac / 1000" | bc)"
  if kill -9 $pid 2>/dev/null; then kills=$((kills+1)); fi
  wait $pid 2>/dev/null
  n=$(ls "$TMP/part/.kvsim_partial" 2>/dev/null | grep -c '^cell_.*\.rows$')
  echo "try $tries ($flag): $n cells checkpointed"
  [ "$n" -gt 0 ] && resumed_any=1
done
[ $kills -ge 5 ] && ok "killed $kills times mid-run" || bad "only $kills kills hit a running process in $tries tries"
[ $resumed_any -eq 1 ] && ok "cells survived kill -9" || bad "no cell was ever checkpointed"
if [ ! -d "$TMP/part/.kvsim_partial" ]; then  # the checks below need an unfinished run
  "$KVSIM" run "$TMP/c.toml" --out "$TMP/part" --threads 2 --quiet --force &
  pid=$!; sleep 0.5; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
fi
out=$("$KVSIM" run "$TMP/c.toml" --out "$TMP/part" --threads 1 --quiet 2>&1) && bad "an unfinished run was overwritten without --resume" \
  || { echo "$out" | grep -q -- "--resume" && echo "$out" | grep -q -- "--force" && ok "unfinished run refused: $out" || bad "message: $out"; }
out=$("$KVSIM" run "$TMP/c.toml" --out "$TMP/part" --resume --set policy.1.memory=0.3 --quiet 2>&1) && bad "a changed config was resumed" \
  || { echo "$out" | grep -q "memory=0.3" && ok "changed config refused: $out" || bad "message: $out"; }
"$KVSIM" run "$TMP/c.toml" --out "$TMP/part" --resume --threads 1 --quiet || bad "final resume"
$PY "$SRC/scripts/compare_results.py" "$TMP/full" "$TMP/part" && ok "resumed results identical to the uninterrupted run" || bad "results differ"
left=$(find "$TMP/part" -name '*.tmp' -o -name '.kvsim_partial' | wc -l)
[ "$left" -eq 0 ] && ok "no temporary files after success" || bad "$left temporary files left"
# A finished folder is replaced atomically by a new run (no --resume needed), and --force discards a checkpoint.
"$KVSIM" run "$TMP/c.toml" --out "$TMP/part" --quiet --set data.n=512 && ok "finished results replaced by a new run" || bad "rerun into a finished folder"
echo "resume_test: $fails failure(s)"
[ $fails -eq 0 ]

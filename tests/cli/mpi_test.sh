#!/usr/bin/env bash
# MPI-distributed runs (include/kvsim/replay/mpi.hpp): `mpirun -n 3 --oversubscribe kvsim run` gives
# every metric dataset of `kvsim run --threads 1` (one and several sequences, 1 or 2 threads per rank);
# a failing cell in any rank ends the whole job non-zero within a timeout, naming the rank, the cell
# and the error, with no results written; all ranks killed with kill -9, then `mpirun ... --resume`,
# gives the uninterrupted results. Exit 77 (SKIPPED) without mpirun or an MPI build.
# Usage: mpi_test.sh KVSIM_BINARY SOURCE_DIR
set -u
KVSIM=$1; SRC=$2
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
command -v mpirun >/dev/null || { echo "SKIPPED: no mpirun (openmpi-bin; scripts/install-deps.sh installs it)"; exit 77; }
"$KVSIM" --version | grep -q "MPI yes" || { echo "SKIPPED: kvsim built without MPI (libopenmpi-dev absent at configure time)"; exit 77; }
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails+1)); }
same() {  # same DIR_A DIR_B WHAT
  if $PY "$SRC/scripts/compare_results.py" "$1" "$2" >"$TMP/cmp" 2>&1; then ok "$3 ($(tail -1 "$TMP/cmp"))"; else bad "$3: $(tail -3 "$TMP/cmp")"; fi
}
cat > "$TMP/c.toml" <<'TOML'
name = "mpi_test"
seed = 4
[data]
synthetic = "heavy_hitter"
n = 768
d = 16
n_layers = 3
n_heads = 8
n_kv_heads = 4
[eval]
every = 3
[[policy]]
name = "h2o"
memory = 0.15
[[policy]]
name = "subgen"
memory = 0.25
[[policy]]
name = "uniform"
memory = 0.2
TOML
"$KVSIM" run "$TMP/c.toml" --out "$TMP/one" --threads 1 --quiet || bad "single-process run"
timeout 300 "${MPIRUN[@]}" -n 3 "$KVSIM" run "$TMP/c.toml" --out "$TMP/mpi3" --threads 1 --quiet || bad "mpirun -n 3"
same "$TMP/one" "$TMP/mpi3" "mpirun -n 3 (1 thread per rank) equals --threads 1"
timeout 300 "${MPIRUN[@]}" -n 2 "$KVSIM" run "$TMP/c.toml" --out "$TMP/mpi2t2" --threads 2 --quiet || bad "mpirun -n 2 --threads 2"
same "$TMP/one" "$TMP/mpi2t2" "mpirun -n 2 with 2 threads per rank equals --threads 1"
"$KVSIM" run "$TMP/c.toml" --out "$TMP/seq" --threads 1 --quiet --set data.sequences=2 || bad "two sequences"
timeout 300 "${MPIRUN[@]}" -n 3 "$KVSIM" run "$TMP/c.toml" --out "$TMP/mpiseq" --threads 1 --quiet --set data.sequences=2 \
  || bad "mpirun two sequences"
same "$TMP/seq" "$TMP/mpiseq" "two sequences under mpirun -n 3 (sequences.csv included)"

# A cell that fails (a NaN in layer 1, KV head 3 of a recording) in whichever rank replays it.
"$KVSIM" synth --preset heavy_hitter --n 256 --d 16 --layers 3 --heads 8 --kv-heads 4 --seed 3 --out "$TMP/rec.h5" >/dev/null
$PY -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); f['layer_001/k'][3, 100, 5] = float('nan')" "$TMP/rec.h5"
sed 's|^synthetic = .*|path = "rec.h5"|; /^n = /d; /^d = /d; /^n_layers/d; /^n_heads/d; /^n_kv_heads/d' "$TMP/c.toml" > "$TMP/bad.toml"
for who in "rank 0 computing" "worker ranks only"; do
  env=(); [ "$who" = "worker ranks only" ] && env=(-x KVSIM_MPI_COORDINATOR_ONLY=1)
  start=$(date +%s)
  timeout 120 "${MPIRUN[@]}" "${env[@]}" -n 3 "$KVSIM" run "$TMP/bad.toml" --out "$TMP/badout" --threads 1 --quiet --force 2>"$TMP/err"
  rc=$?; took=$(( $(date +%s) - start ))
  if [ $rc -ne 0 ] && [ $rc -ne 124 ]; then ok "$who: a failing cell ends the job with status $rc in ${took} s"; else bad "$who: status $rc (124 = hung)"; fi
  want="rank [0-9]"; [ "$who" = "worker ranks only" ] && want="rank [12]"
  grep -q "kvsim: error: $want, cell 7 (layer 1, KV head 3): .*layer_001/k" "$TMP/err" \
    && ok "$who: the error names the rank, cell and dataset: $(grep 'kvsim: error' "$TMP/err" | head -1)" || bad "$who: error message: $(head -5 "$TMP/err")"
  [ -e "$TMP/badout/results.h5" ] && bad "results written by a failed job" || ok "$who: no results from the failed job"
done

# All ranks killed (kill -9), then resumed under mpirun: the uninterrupted results.
"${MPIRUN[@]}" -n 2 "$KVSIM" run "$TMP/c.toml" --out "$TMP/killed" --threads 1 --quiet &
for _ in $(seq 200); do  # until the first cell is durable (at most 20 s), then kill -9 every rank
  ls "$TMP/killed/.kvsim_partial" 2>/dev/null | grep -q '^cell_.*\.rows$' && break
  sleep 0.1
done
pkill -9 -f "$KVSIM run $TMP/c.toml --out $TMP/killed" ; wait 2>/dev/null
n=$(ls "$TMP/killed/.kvsim_partial" 2>/dev/null | grep -c '^cell_.*\.rows$')
[ "$n" -gt 0 ] && [ ! -e "$TMP/killed/results.h5" ] && ok "all ranks killed with $n of 12 cells checkpointed" || bad "kill: $n cells checkpointed"
timeout 300 "${MPIRUN[@]}" -n 2 "$KVSIM" run "$TMP/c.toml" --out "$TMP/killed" --threads 1 --quiet --resume || bad "mpirun --resume"
same "$TMP/one" "$TMP/killed" "killed with kill -9 and resumed under mpirun equals the uninterrupted run"
echo "mpi_test: $fails failure(s)"
[ $fails -eq 0 ]

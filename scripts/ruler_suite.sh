#!/usr/bin/env bash
# The RULER-style suite (docs/tasks.md, "The RULER suite"): one `kvsim task` run per (kind, length) of a
# task config, each into OUT/KIND_L. Resumable: a finished run (OUT/KIND_L/trials.csv) is skipped, an
# unfinished one continues from its checkpointed trials; stop it at any time and run the same command.
#   scripts/ruler_suite.sh CONFIG OUT [--lengths "1024 2048"] [--kinds "niah_single …"] [--threads N]
#                          [--quick] [--checkpoints DIR] [-- EXTRA kvsim task ARGS (e.g. --set task.trials=5)]
# --quick: every kind once, at 1024 tokens (common_words' list and example need about 900), one depth,
# one trial, 16 answer tokens: a check that every kind runs end to end (CI's slow tier), not a score.
# --checkpoints DIR: trials checkpointed by an earlier, unfinished run and landed in the repository
# (DIR/KIND_L/trials, e.g. docs/task_runs/ruler_gemma3_headline): copied into OUT/KIND_L/trials before a
# run there that has none, so a run longer than a session continues on a fresh checkout.
# Then: .venv/bin/python plots/ruler.py OUT [OUT …] --out-dir FIG_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: scripts/ruler_suite.sh CONFIG OUT [--lengths \"L …\"] [--kinds \"K …\"] [--threads N] [--quick] [--checkpoints DIR] [-- ARGS]" >&2; exit 2; }
[ $# -ge 2 ] || usage
CONFIG=$1 OUT=$2; shift 2
[ -f "$CONFIG" ] || { echo "ruler_suite.sh: $CONFIG: no such config" >&2; exit 2; }
KVSIM=${KVSIM:-./build/kvsim}
LENGTHS="1024" THREADS=2 QUICK=0 CKPT="" EXTRA=()
KINDS="niah_single niah_multikey niah_multivalue niah_multiquery variable_tracking common_words frequent_words"
while [ $# -gt 0 ]; do
  case $1 in
    --lengths) LENGTHS=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --checkpoints) CKPT=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage ;;
  esac
done
if [ "$QUICK" = 1 ]; then
  LENGTHS=1024
  EXTRA=(--set 'task.depths=[0.5]' --set task.trials=1 --set task.generate=16 "${EXTRA[@]}")
fi
mkdir -p "$OUT"
start=$(date +%s)
for L in $LENGTHS; do
  for k in $KINDS; do
    dir=$OUT/${k}_$L
    if [ -f "$dir/trials.csv" ]; then echo "ruler_suite: $dir is done (trials.csv); skipped"; continue; fi
    if [ -n "$CKPT" ] && [ -d "$CKPT/${k}_$L/trials" ] && [ ! -d "$dir/trials" ]; then
      mkdir -p "$dir" && cp -r "$CKPT/${k}_$L/trials" "$dir/trials"
      echo "ruler_suite: $dir continues from $(ls "$dir/trials" | grep -c '^L') trials checkpointed in $CKPT"
    fi
    echo "ruler_suite: $k at L = $L -> $dir ($(date +%T))"
    "$KVSIM" task "$CONFIG" --set "task.kind=\"$k\"" --set "task.lengths=[$L]" --out "$dir" --threads "$THREADS" \
      --resume "${EXTRA[@]}"
  done
done
echo "ruler_suite: done in $(( $(date +%s) - start )) s"

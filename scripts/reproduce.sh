#!/usr/bin/env bash
# Reproduces every README figure and table from scratch (after scripts/setup.sh), then regenerates
# all figures and results/report.md with plots/make_figures.py. Needs ../shared/data beside the
# checkout for the small real models and models/ (scripts/setup.sh) for SmolLM2.
#
# Usage: bash scripts/reproduce.sh [--quick] [--only small|smollm2|gemma3|gemma3_long] [--fresh] [--no-figures] [--no-tasks] [THREADS]
#   --quick   a subset in minutes: the single-window small-model experiments and SmolLM2 on one
#             2048-token window of code (what CI's slow `reproduce` test runs)
#   --only    just the small models (stories260K, aidreams260K, shakespeare-q80, synthetic), just SmolLM2
#             or just Gemma 3 270M (its equal-memory sweeps, length sweep and closed loop; not part of --quick),
#             or Gemma 3 at 8192-32768 tokens (gemma3_long: only when named; hours on 2 cores)
#   --fresh   forget earlier steps; without it the script resumes: a step whose stamp in
#             results/.reproduce holds the same command line (and the same kvsim binary, configs and
#             scripts, by sha1) is skipped
#   --no-figures  run the experiments only (no make_figures, no report, no copies into docs/figures)
#   --no-tasks    leave out SmolLM2's retrieval tasks (`kvsim task`, about 30 min each; run them alone)
# Every step's wall time and peak memory go to results/.reproduce/times.tsv (docs/experiments.md).
# The embedded figures are copied into $KVSIM_FIGURES (default docs/figures; tests point it elsewhere
# so that no test writes a tracked file).
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0; ONLY=all; FIGURES=1; TASKS=1; T=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --only) ONLY=${2:-}; shift
            case "$ONLY" in small|smollm2|gemma3|gemma3_long) ;;
              *) echo "reproduce.sh: --only takes small, smollm2, gemma3 or gemma3_long, not '$ONLY'" >&2; exit 2;; esac ;;
    --fresh) rm -rf results/.reproduce ;;
    --no-figures) FIGURES=0 ;;
    --no-tasks) TASKS=0 ;;
    [0-9]*) T=$1 ;;
    *) echo "reproduce.sh: unknown argument '$1' (usage: reproduce.sh [--quick] [--only small|smollm2|gemma3|gemma3_long] [--fresh] [--no-figures] [--no-tasks] [THREADS])" >&2; exit 2 ;;
  esac
  shift
done
K=${KVSIM:-./build/kvsim}
D=${KVSIM_SHARED_DATA:-../shared/data}
M=${KVSIM_MODELS:-models}/SmolLM2-135M-Instruct.Q4_1.gguf
FIG=${KVSIM_FIGURES:-docs/figures}
PY=${KVSIM_PYTHON:-$PWD/.venv/bin/python}; [ -x "$PY" ] || PY=python3
ST=results/.reproduce
mkdir -p "$FIG" results/recordings results/texts "$ST"
TIMER=(); [ -x /usr/bin/time ] && TIMER=(/usr/bin/time -o "$ST/last.time" -f "%e	%M")

# step NAME OUT CMD...: runs CMD with stdout to OUT (written whole, or not at all; "null" discards it),
# unless NAME's stamp holds the same command line (resume). Appends NAME, seconds, peak RSS (KiB).
step() {
  local name=$1 out=$2; shift 2
  local sig="$*" a
  # The stamp also holds the sha1 of the kvsim binary and of every config or script the step reads, so a
  # rebuilt kvsim or an edited config re-runs the step; --fresh forgets every stamp.
  for a in "$@"; do
    case "$a" in
      *.toml|*.py|*/kvsim) if [ -f "$a" ]; then sig+=" [$(sha1sum < "$a" | cut -c1-12)]"; fi ;;
    esac
  done
  if [ -f "$ST/$name" ] && [ "$(cat "$ST/$name")" = "$sig" ]; then echo "reproduce: $name: done earlier, skipped"; return 0; fi
  rm -f "$ST/$name" "$ST/last.time"
  local t0=$SECONDS rc=0
  if [ "$out" = null ]; then "${TIMER[@]}" "$@" > /dev/null || rc=$?
  else "${TIMER[@]}" "$@" > "$out.tmp" || rc=$?; fi
  if [ "$rc" -ne 0 ]; then rm -f "$out.tmp"; echo "reproduce: step $name failed (exit $rc): $sig" >&2; exit "$rc"; fi
  [ "$out" = null ] || mv "$out.tmp" "$out"
  local timing="$((SECONDS - t0))	"; [ -s "$ST/last.time" ] && timing=$(tail -1 "$ST/last.time")
  printf '%s\t%s\n' "$name" "$timing" >> "$ST/times.tsv"
  echo "$sig" > "$ST/$name"
  echo "reproduce: $name: ${timing%%	*} s"
}

small_models() {
  local tok="$D/stories260K/tok512.bin" ck="$D/stories260K/stories260K.bin" S="$D/shakespeare-q80"
  step rec_stories260k_tinystories null $K record --checkpoint "$ck" --tokenizer "$tok" \
    --text "$D/tinystories-sample/tinystories.txt" --tokens 512 --out results/recordings/stories260k_tinystories.h5
  step rec_stories260k_generate null $K record --checkpoint "$ck" --tokenizer "$tok" \
    --generate 512 --out results/recordings/stories260k_generate.h5
  step rec_aidreams_generate null $K record --checkpoint "$D/aidreams260K/aidreams260K.bin" \
    --tokenizer "$D/aidreams260K/tok512.bin" --generate 128 --out results/recordings/aidreams_generate.h5
  step rec_tinystories_512 null $K record --checkpoint "$ck" --tokenizer "$tok" \
    --text "$D/tinystories-sample/tinystories.txt" --tokens 512 --windows 8 --out results/recordings/tinystories_512.h5
  step rec_shakespeare_heldout null $K record --checkpoint "$S/shakespeare_q80.bin" --tokenizer "$S/byte_tokenizer.bin" \
    --text "$D/tinyshakespeare/input.txt" --text-tail 0.05 --tokens 256 --windows 8 --out results/recordings/shakespeare_heldout_256.h5
  step rec_shakespeare_generate null $K record --checkpoint "$S/shakespeare_q80.bin" --tokenizer "$S/byte_tokenizer.bin" \
    --generate 256 --out results/recordings/shakespeare_generate.h5
  local cfg
  for cfg in quickstart stories260k policies_stories260k budget_sweep subgen_theorem1 subgen_theorem1_stories260k \
             h2o_submodular h2o_buzz_20pct buzz_tw_sweep h2o_observations h2o_observations_synthetic; do
    step "$cfg" "results/$cfg.txt" $K run "experiments/$cfg.toml" --threads "$T"
  done
  step clusterability results/clusterability.txt $K clusters experiments/clusterability.toml
  step closed_loop results/closed_loop.txt $K closed-loop experiments/closed_loop.toml --threads "$T"
  [ "$QUICK" = 1 ] && return 0
  for cfg in budget_sweep_8seq budget_sweep_shakespeare_8seq prefill_sweep_8seq prefill_sweep_shakespeare_8seq \
             budget_sweep_long budget_sweep_synthetic h2o_submodular_shakespeare h2o_buzz_20pct_shakespeare \
             subgen_theorem1_shakespeare; do
    step "$cfg" "results/$cfg.txt" $K run "experiments/$cfg.toml" --threads "$T"
  done
  step budget_sweep_shakespeare_generate results/budget_sweep_shakespeare_generate.txt $K run experiments/budget_sweep.toml \
    --threads "$T" --out results/budget_sweep_shakespeare_generate --set data.path=results/recordings/shakespeare_generate.h5
  step budget_sweep_generate results/budget_sweep_generate.txt $K run experiments/budget_sweep.toml --threads "$T" \
    --out results/budget_sweep_generate --set data.path=results/recordings/stories260k_generate.h5
  step budget_sweep_aidreams results/budget_sweep_aidreams.txt $K run experiments/budget_sweep.toml --threads "$T" \
    --out results/budget_sweep_aidreams --set data.path=results/recordings/aidreams_generate.h5 --set 'policy.memory=[0.1,0.2,0.3,0.4,0.6]'
  step budget_sweep_clustered results/budget_sweep_clustered.txt $K run experiments/budget_sweep_synthetic.toml \
    --threads "$T" --out results/budget_sweep_clustered --set data.synthetic=clustered
  step budget_sweep_long_clustered results/budget_sweep_long_clustered.txt $K run experiments/budget_sweep_long.toml \
    --threads "$T" --out results/budget_sweep_long_clustered --set data.synthetic=clustered
  step h2o_observations_aidreams results/h2o_observations_aidreams.txt $K run experiments/h2o_observations.toml \
    --out results/h2o_observations_aidreams --set data.path=results/recordings/aidreams_generate.h5
  step h2o_observations_shakespeare results/h2o_observations_shakespeare.txt $K run experiments/h2o_observations.toml \
    --out results/h2o_observations_shakespeare --set data.path=results/recordings/shakespeare_heldout_256_w00.h5
  step h2o_observations_clustered results/h2o_observations_clustered.txt $K run experiments/h2o_observations_synthetic.toml \
    --out results/h2o_observations_clustered --set data.synthetic=clustered
  step clusterability_shakespeare results/clusterability_shakespeare.txt $K clusters experiments/clusterability.toml \
    --out results/clusterability_shakespeare --set data.path=results/recordings/shakespeare_heldout_256_w00.h5
  step clusterability_aidreams results/clusterability_aidreams.txt $K clusters experiments/clusterability.toml \
    --out results/clusterability_aidreams --set data.path=results/recordings/aidreams_generate.h5
  for cfg in closed_loop_shakespeare closed_loop_prefill closed_loop_prefill_shakespeare; do
    step "$cfg" "results/$cfg.txt" $K closed-loop "experiments/$cfg.toml" --threads "$T"
  done
}

# SmolLM2-135M-Instruct (GGUF, head_dim 64): prose (held-out Tiny Shakespeare, TinyStories) and code (the
# Python standard library Debian installs), 2048-token windows and two 8192-token windows (their tails:
# disjoint from the 2048-token windows). Recordings keep q/k/v but not the model's attention output.
smollm2() {
  [ -f "$M" ] || { echo "reproduce.sh: $M is missing (bash scripts/setup.sh fetches it)" >&2; exit 1; }
  local rec=($K record --checkpoint "$M" --no-attn --threads "$T") obs=experiments/h2o_observations.toml n
  step code_text null "$PY" datasets/make_code_text.py results/texts/python_stdlib.txt
  if [ "$QUICK" = 1 ]; then
    step rec_smollm2_quick null "${rec[@]}" --text results/texts/python_stdlib.txt --tokens 2048 --windows 1 \
      --out results/recordings/smollm2_quick.h5
    local w=results/recordings/smollm2_quick_w00.h5
    step smollm2_quick_budget results/smollm2_quick_budget.txt $K run experiments/smollm2_budget_sweep.toml \
      --threads "$T" --out results/smollm2_quick_budget --set data.path=$w
    step smollm2_quick_prefill results/smollm2_quick_prefill.txt $K run experiments/smollm2_prefill_sweep.toml \
      --threads "$T" --out results/smollm2_quick_prefill --set data.path=$w
    step h2o_observations_smollm2_quick results/h2o_observations_smollm2_quick.txt $K run $obs --threads "$T" \
      --out results/h2o_observations_smollm2_quick --set data.path=$w
    step clusterability_smollm2_quick results/clusterability_smollm2_quick.txt $K clusters experiments/clusterability.toml \
      --out results/clusterability_smollm2_quick --set data.path=$w
    step smollm2_quick_closed_loop results/smollm2_quick_closed_loop.txt $K closed-loop experiments/smollm2_closed_loop.toml \
      --threads "$T" --out results/smollm2_quick_closed_loop --set model.tokens=512 --set model.prefill=448 --set model.windows=1 --set policy.memory=0.3
    step smollm2_quick_passkey results/smollm2_quick_passkey.txt $K task experiments/smollm2_passkey.toml --threads "$T" \
      --out results/smollm2_quick_passkey --set 'task.lengths=[256]' --set 'task.depths=[0.3,0.7]' --set task.trials=2 \
      --set policy.memory=0.5 --force
    return 0
  fi
  step rec_smollm2_shakespeare null "${rec[@]}" --text "$D/tinyshakespeare/input.txt" --text-tail 0.05 --tokens 2048 \
    --windows 4 --out results/recordings/smollm2_shakespeare_2048.h5
  step rec_smollm2_tinystories null "${rec[@]}" --text "$D/tinystories-sample/tinystories.txt" --tokens 2048 \
    --windows 4 --out results/recordings/smollm2_tinystories_2048.h5
  step rec_smollm2_code null "${rec[@]}" --text results/texts/python_stdlib.txt --tokens 2048 --windows 8 \
    --out results/recordings/smollm2_code_2048.h5
  step rec_smollm2_tinystories_8192 null "${rec[@]}" --text "$D/tinystories-sample/tinystories.txt" --text-tail 0.25 \
    --tokens 8192 --windows 1 --out results/recordings/smollm2_tinystories_8192.h5
  step rec_smollm2_code_8192 null "${rec[@]}" --text results/texts/python_stdlib.txt --text-tail 0.25 --tokens 8192 \
    --windows 1 --out results/recordings/smollm2_code_8192.h5
  step smollm2_budget_sweep results/smollm2_budget_sweep.txt $K run experiments/smollm2_budget_sweep.toml --threads "$T"
  step smollm2_prefill_sweep results/smollm2_prefill_sweep.txt $K run experiments/smollm2_prefill_sweep.toml --threads "$T"
  # Budgets per layer and head (docs/results.md "Where to put the memory"): fitted on 8 windows, written to
  # experiments/budgets/, checked on the 8 others, in the closed loop and on niah_single at 2048.
  local p g
  step smollm2_alloc_fit results/smollm2_alloc_fit.txt $K run experiments/smollm2_alloc_fit.toml --threads "$T"
  for p in h2o snapkv expected_attention; do
    for g in head layer; do
      step "alloc_smollm2_${p}_$g" null $K allocate results/smollm2_alloc_fit --policy "$p" --memory 0.1,0.2,0.25,0.4,0.5 \
        --granularity "$g" --out "experiments/budgets/smollm2_${p}_$g.json"
    done
  done
  step smollm2_alloc_eval results/smollm2_alloc_eval.txt $K run experiments/smollm2_alloc_eval.toml --threads "$T"
  step smollm2_alloc_closed_loop results/smollm2_alloc_closed_loop.txt $K closed-loop experiments/smollm2_alloc_closed_loop.toml \
    --threads "$T"
  for n in 1024 2048 4096 8192; do
    step "smollm2_length_$n" "results/smollm2_length_$n.txt" $K run experiments/smollm2_length_sweep.toml --threads "$T" \
      --out "results/smollm2_length_$n" --set "data.tokens=$n" --set "data.prefill=$((n - 256))"
  done
  step smollm2_closed_loop results/smollm2_closed_loop.txt $K closed-loop experiments/smollm2_closed_loop.toml --threads "$T"
  for t in passkey word_needle; do  # retrieval tasks: about 30 min each (--resume continues a killed one)
    [ "$TASKS" = 1 ] || break
    step "smollm2_$t" "results/smollm2_$t.txt" $K task "experiments/smollm2_$t.toml" --threads "$T" --resume
  done
  [ "$TASKS" = 1 ] && step smollm2_alloc_task results/smollm2_alloc_task.txt $K task experiments/smollm2_alloc_task.toml \
    --threads "$T" --out results/smollm2_alloc_task --resume
  step smollm2_h2o_theorem44 results/smollm2_h2o_theorem44.txt $K run experiments/smollm2_h2o_theorem44.toml --threads "$T"
  step smollm2_buzz_tw_sweep results/smollm2_buzz_tw_sweep.txt $K run experiments/smollm2_buzz_tw_sweep.toml --threads "$T"
  for g in shakespeare tinystories code; do
    step "h2o_observations_smollm2_$g" "results/h2o_observations_smollm2_$g.txt" $K run $obs --threads "$T" \
      --out "results/h2o_observations_smollm2_$g" --set "data.path=results/recordings/smollm2_${g}_2048_w00.h5"
    step "clusterability_smollm2_$g" "results/clusterability_smollm2_$g.txt" $K clusters experiments/clusterability.toml \
      --out "results/clusterability_smollm2_$g" --set "data.path=results/recordings/smollm2_${g}_2048_w00.h5"
  done
}

# Gemma 3 270M (GGUF, one KV head of head_dim 256, local/global layers): 8 prose windows of 2048 tokens
# and two 8192-token windows (each opened with <bos>), replayed on its global layers, its closed loop,
# and the papers' observations on one window per genre. Full runs only.
gemma3() {
  local G=${KVSIM_MODELS:-models}/gemma-3-270m-q4_k_m.gguf
  [ -f "$G" ] || { echo "reproduce.sh: $G is missing (bash scripts/setup.sh fetches it)" >&2; exit 1; }
  local rec=($K record --checkpoint "$G" --no-attn --threads "$T")
  step rec_gemma3_shakespeare null "${rec[@]}" --text "$D/tinyshakespeare/input.txt" --text-tail 0.05 --tokens 2048 \
    --windows 4 --out results/recordings/gemma3_shakespeare_2048.h5
  step rec_gemma3_tinystories null "${rec[@]}" --text "$D/tinystories-sample/tinystories.txt" --tokens 2048 \
    --windows 4 --out results/recordings/gemma3_tinystories_2048.h5
  step gemma3_budget_sweep results/gemma3_budget_sweep.txt $K run experiments/gemma3_budget_sweep.toml --threads "$T"
  # the same sweep with one cache per query head (4 caches sharing the KV head's memory budget each)
  step gemma3_budget_sweep_query_head results/gemma3_budget_sweep_query_head.txt $K run experiments/gemma3_budget_sweep.toml \
    --threads "$T" --out results/gemma3_budget_sweep_query_head --set 'eval.gqa="query_head"'
  # two 8192-token windows (the tails of TinyStories and code, as SmolLM2's) read at n = 1024 ... 8192
  step code_text null "$PY" datasets/make_code_text.py results/texts/python_stdlib.txt
  step rec_gemma3_tinystories_8192 null "${rec[@]}" --text "$D/tinystories-sample/tinystories.txt" --text-tail 0.25 \
    --tokens 8192 --windows 1 --out results/recordings/gemma3_tinystories_8192.h5
  step rec_gemma3_code_8192 null "${rec[@]}" --text results/texts/python_stdlib.txt --text-tail 0.25 --tokens 8192 \
    --windows 1 --out results/recordings/gemma3_code_8192.h5
  local n
  for n in 1024 2048 4096 8192; do
    step "gemma3_length_$n" "results/gemma3_length_$n.txt" $K run experiments/gemma3_length_sweep.toml --threads "$T" \
      --out "results/gemma3_length_$n" --set "data.tokens=$n" --set "data.prefill=$((n - 256))"
  done
  step gemma3_closed_loop results/gemma3_closed_loop.txt $K closed-loop experiments/gemma3_closed_loop.toml --threads "$T"
  step gemma3_closed_loop_code results/gemma3_closed_loop_code.txt $K closed-loop experiments/gemma3_closed_loop.toml \
    --threads "$T" --out results/gemma3_closed_loop_code --set 'model.text="results/texts/python_stdlib.txt"' \
    --set model.text_tail=0.25
  # The papers' observations on the global layers: one 2048-token window per genre (as SmolLM2's).
  step rec_gemma3_code null "${rec[@]}" --text results/texts/python_stdlib.txt --tokens 2048 --windows 1 \
    --out results/recordings/gemma3_code_2048.h5
  step gemma3_h2o_theorem44 results/gemma3_h2o_theorem44.txt $K run experiments/gemma3_h2o_theorem44.toml --threads "$T"
  local g
  for g in shakespeare tinystories code; do
    step "h2o_observations_gemma3_$g" "results/h2o_observations_gemma3_$g.txt" $K run experiments/h2o_observations.toml \
      --threads "$T" --out "results/h2o_observations_gemma3_$g" --set "data.path=results/recordings/gemma3_${g}_2048_w00.h5"
    step "clusterability_gemma3_$g" "results/clusterability_gemma3_$g.txt" $K clusters experiments/clusterability.toml \
      --out "results/clusterability_gemma3_$g" --set "data.path=results/recordings/gemma3_${g}_2048_w00.h5"
  done
}

# Gemma 3 270M at 8192-32768 tokens (issue "32k tokens on a real LLM"): its three global layers alone
# (record --layers global), two 32k windows (TinyStories and code, each from its start) and four 16k ones;
# every policy at n = 8192 (the 16k windows' prefixes), 16384 and 32768; error against n from 1024 to 32768
# at a fixed share and a fixed token count; H2O's observations (sparsity, power law, sinks, the oracle's
# head-room) and SubGen's cluster count m against n on each 32k window.
# Only with --only gemma3_long (hours on 2 cores; every step resumes, and `kvsim run --resume` continues a
# killed sweep from its checkpointed cells).
gemma3_long() {
  local G=${KVSIM_MODELS:-models}/gemma-3-270m-q4_k_m.gguf n w
  [ -f "$G" ] || { echo "reproduce.sh: $G is missing (bash scripts/setup.sh fetches it)" >&2; exit 1; }
  local rec=($K record --checkpoint "$G" --no-attn --layers global --threads "$T")
  step code_text null "$PY" datasets/make_code_text.py results/texts/python_stdlib.txt
  for n in 32768 16384; do
    w=$(( n == 32768 ? 1 : 2 ))
    step "rec_gemma3_tinystories_$n" null "${rec[@]}" --text "$D/tinystories-sample/tinystories.txt" --tokens $n \
      --windows $w --out "results/recordings/gemma3_tinystories_$n.h5"
    step "rec_gemma3_code_$n" null "${rec[@]}" --text results/texts/python_stdlib.txt --tokens $n --windows $w \
      --out "results/recordings/gemma3_code_$n.h5"
  done
  local long32=(--set 'data.path=["results/recordings/gemma3_tinystories_32768_w00.h5", "results/recordings/gemma3_code_32768_w00.h5"]')  # --set paths: from the working directory
  for n in 1024 2048 4096 8192 16384 32768; do
    step "gemma3_length_long_$n" "results/gemma3_length_long_$n.txt" $K run experiments/gemma3_length_long.toml \
      --threads "$T" --resume --out "results/gemma3_length_long_$n" --set "data.tokens=$n" --set "data.prefill=$((n - 256))"
  done
  for n in 8192 16384; do
    step "gemma3_long_$n" "results/gemma3_long_$n.txt" $K run experiments/gemma3_long_sweep.toml --threads "$T" --resume \
      --out "results/gemma3_long_$n" --set "data.tokens=$n" --set "data.prefill=$((n - 256))"
  done
  step gemma3_long_32768 results/gemma3_long_32768.txt $K run experiments/gemma3_long_sweep.toml --threads "$T" --resume \
    --out results/gemma3_long_32768 --set data.tokens=32768 --set data.prefill=32512 "${long32[@]}"
  # Budgets per layer on the three global layers (docs/results.md "Where to put the memory"): the first 4096
  # tokens of three long recordings to fit, three others held out.
  local p d
  step gemma3_alloc_fit results/gemma3_alloc_fit.txt $K run experiments/gemma3_alloc_fit.toml --threads "$T"
  for p in h2o snapkv expected_attention; do
    step "alloc_gemma3_$p" null $K allocate results/gemma3_alloc_fit --policy "$p" --memory 0.1,0.2,0.4 \
      --out "experiments/budgets/gemma3_${p}_head.json"
  done
  step gemma3_alloc_eval results/gemma3_alloc_eval.txt $K run experiments/gemma3_alloc_eval.toml --threads "$T"
  step gemma3_alloc_closed_loop results/gemma3_alloc_closed_loop.txt $K closed-loop \
    experiments/gemma3_alloc_closed_loop.toml --threads "$T"
  [ "$TASKS" = 1 ] && step gemma3_alloc_task results/gemma3_alloc_task.txt $K task experiments/gemma3_alloc_task.toml \
    --threads "$T" --out results/gemma3_alloc_task --resume
  for w in tinystories code; do
    step "h2o_observations_gemma3_${w}_32768" "results/h2o_observations_gemma3_${w}_32768.txt" $K run \
      experiments/h2o_observations.toml --threads "$T" --resume --out "results/h2o_observations_gemma3_${w}_32768" \
      --set "data.path=\"results/recordings/gemma3_${w}_32768_w00.h5\""
    step "clusterability_gemma3_${w}_32768" "results/clusterability_gemma3_${w}_32768.txt" $K clusters \
      experiments/clusterability.toml --out "results/clusterability_gemma3_${w}_32768" \
      --set "data.path=\"results/recordings/gemma3_${w}_32768_w00.h5\""
    for d in 0.35 0.7; do  # SubGen's m' against n at two more δ (docs/results.md, "32k tokens")
      step "clusterability_gemma3_${w}_32768_d$d" "results/clusterability_gemma3_${w}_32768_d$d.txt" $K clusters \
        experiments/clusterability.toml --out "results/clusterability_gemma3_${w}_32768_d$d" \
        --set "data.path=\"results/recordings/gemma3_${w}_32768_w00.h5\"" --set "clusters.delta_rel=$d"
    done
  done
  # Retrieval at 8192-32752 tokens (docs/results.md "32k tokens"): the exact cache first, 25 niah_single trials per
  # length (a length counts where it answers ≥ 80%); 32752 = the context less niah_single's 16 answer tokens. Hours;
  # ruler_suite.sh resumes a killed run from its checkpointed trials.
  [ "$TASKS" = 1 ] && step gemma3_ruler_long null env KVSIM="$K" bash scripts/ruler_suite.sh experiments/gemma3_ruler.toml \
    results/ruler_gemma3_long --lengths "8192 16384 32752" --kinds niah_single --threads "$T"
  # The headline policies at 25/50/75% at every length where the exact cache counts (docs/results.md "32k tokens";
  # 32752 takes about 13 GB and many hours: run it alone, resumed across sessions; trials checkpointed in an earlier
  # session and landed under docs/task_runs are taken up).
  [ "$TASKS" = 1 ] && step gemma3_ruler_headline_long null env KVSIM="$K" bash scripts/ruler_suite.sh \
    experiments/gemma3_ruler_headline.toml results/ruler_gemma3_headline_long --lengths "8192 16384 32752" --kinds niah_single \
    --threads "$T" --checkpoints docs/task_runs/ruler_gemma3_headline
  # The same trials at 8192 with the open loop at the answer's steps (the link; the closed loop repeats).
  [ "$TASKS" = 1 ] && step gemma3_ruler_headline_long_answer null env KVSIM="$K" bash scripts/ruler_suite.sh \
    experiments/gemma3_ruler_headline.toml results/ruler_gemma3_headline_long_answer --lengths 8192 --kinds niah_single \
    --threads "$T" -- --set 'task.link_steps="answer"'
  # transformers on the same GGUF and prompts, the first trial at each depth at 8192 and 16384 (17 min, 4.5 GB at two
  # threads), paired with kvsim's answers.
  [ "$TASKS" = 1 ] && step gemma3_ruler_long_transformers null "$PY" scripts/kvpress_task.py experiments/gemma3_ruler.toml \
    --set 'task.lengths=[8192]' --set task.trials=1 --presses "" --threads "$T" --out results/kvpress_gemma3_exact_8192 \
    --kvsim results/ruler_gemma3_long/niah_single_8192
  [ "$TASKS" = 1 ] && step gemma3_ruler_long_transformers_16384 null "$PY" scripts/kvpress_task.py experiments/gemma3_ruler.toml \
    --set 'task.lengths=[16384]' --set task.trials=1 --presses "" --threads "$T" --out results/kvpress_gemma3_exact_16384 \
    --kvsim results/ruler_gemma3_long/niah_single_16384
  return 0
}

case "$ONLY" in small) small_models ;; smollm2) smollm2 ;; gemma3) gemma3 ;; gemma3_long) gemma3_long ;;
  *) small_models; smollm2; [ "$QUICK" = 1 ] || gemma3 ;; esac
if [ "$FIGURES" = 0 ]; then echo "reproduce.sh: done, figures not drawn (--no-figures; step times in $ST/times.tsv)"; exit 0; fi

# Figures and results/report.md from every results folder in results/ (make_figures skips what a
# folder cannot draw), then the H2O observations figure and its numpy cross-check.
rm -f "$ST/figures" "$ST/h2o_observations_check" "$ST/smollm2_length_figure" "$ST/gemma3_length_figure" \
  "$ST/gemma3_observations_figure"  # always redrawn
dirs=()
for d in results/*/; do
  if [ -f "$d/results.h5" ] || [ -f "$d/sequences.csv" ] || [ -f "$d/clusters.csv" ] || [ -f "$d/closed_loop.csv" ] ||
     [ -f "$d/trials.csv" ]; then dirs+=("${d%/}"); fi
done
step figures null "$PY" plots/make_figures.py "${dirs[@]}" --report results/report.md
obs=()
for d in results/h2o_observations*/; do
  if [ "$QUICK" = 0 ] && [[ $d == *_quick/ ]]; then continue; fi  # a full run's figure leaves out --quick's folder
  [[ $d == *_gemma3_* ]] && continue  # Gemma's global layers get their own figure below
  obs+=("${d%/}")
done
step h2o_observations_check results/h2o_observations_check.txt "$PY" plots/h2o_observations.py "${obs[@]}"
if [ -f results/h2o_observations_gemma3_code/results.h5 ]; then
  step gemma3_observations_figure results/gemma3_observations.txt "$PY" plots/h2o_observations.py --table \
    results/h2o_observations_gemma3_code results/h2o_observations_gemma3_shakespeare \
    results/h2o_observations_gemma3_tinystories --out results/gemma3_h2o_observations.png
fi
if [ -f results/smollm2_length_1024/sequences.csv ]; then
  step smollm2_length_figure null "$PY" plots/length_sweep.py results/smollm2_length_1024 results/smollm2_length_2048 \
    results/smollm2_length_4096 results/smollm2_length_8192 --out results/smollm2_length_sweep.png
fi
if [ -f results/gemma3_length_1024/sequences.csv ]; then
  step gemma3_length_figure null "$PY" plots/length_sweep.py results/gemma3_length_1024 results/gemma3_length_2048 \
    results/gemma3_length_4096 results/gemma3_length_8192 --out results/gemma3_length_sweep.png
fi
if [ -f results/smollm2_passkey/trials.csv ] && [ -f results/smollm2_word_needle/trials.csv ]; then
  step retrieval_figures results/retrieval.txt "$PY" plots/retrieval.py results/smollm2_passkey results/smollm2_word_needle \
    --out-dir results/retrieval
fi
# The figures the README and docs embed, refreshed from this run (those it produced).
fig() { if [ -f "$1" ]; then cp "$1" "$FIG/$2"; elif [ "$QUICK" = 0 ] && [ "$ONLY" = all ]; then echo "reproduce.sh: $1 was not made" >&2; exit 1; fi; }
fig results/budget_sweep/metric_vs_budget.png budget_sweep.png
fig results/budget_sweep_8seq/rel_err_vs_memory_sequences.png budget_sweep_8seq.png
fig results/h2o_submodular/metric_vs_budget.png metric_vs_budget.png
fig results/buzz_tw_sweep/buzz_tw_sweep.png buzz_tw_sweep.png
fig results/closed_loop/closed_loop.png closed_loop.png
fig results/closed_loop_shakespeare/closed_loop.png closed_loop_shakespeare.png
fig results/closed_loop_prefill/closed_loop.png closed_loop_prefill.png
fig results/prefill_sweep_8seq/rel_err_vs_memory_sequences.png prefill_sweep_8seq.png
fig results/prefill_sweep_shakespeare_8seq/rel_err_vs_memory_sequences.png prefill_sweep_shakespeare_8seq.png
fig results/budget_sweep_shakespeare_8seq/rel_err_vs_memory_sequences.png budget_sweep_shakespeare_8seq.png
fig results/clusterability_shakespeare/clusterability.png clusterability_shakespeare.png
fig results/subgen_theorem1_shakespeare/subgen_theorem1.png subgen_theorem1_shakespeare.png
fig results/clusterability/clusterability.png clusterability.png
fig results/h2o_observations/h2o_observations.png h2o_observations.png
fig results/subgen_theorem1/subgen_theorem1.png subgen_theorem1.png
fig results/subgen_theorem1_stories260k/subgen_theorem1.png subgen_theorem1_stories260k.png
fig results/smollm2_budget_sweep/rel_err_vs_memory_sequences.png smollm2_budget_sweep.png
fig results/smollm2_prefill_sweep/rel_err_vs_memory_sequences.png smollm2_prefill_sweep.png
fig results/smollm2_length_sweep.png smollm2_length_sweep.png
fig results/clusterability_smollm2_code/clusterability.png clusterability_smollm2.png
fig results/smollm2_closed_loop/closed_loop.png smollm2_closed_loop.png
fig results/smollm2_buzz_tw_sweep/buzz_tw_sweep.png smollm2_buzz_tw_sweep.png
fig results/gemma3_budget_sweep/rel_err_vs_memory_sequences.png gemma3_budget_sweep.png
fig results/gemma3_closed_loop/closed_loop.png gemma3_closed_loop.png
fig results/gemma3_closed_loop_code/closed_loop.png gemma3_closed_loop_code.png
fig results/gemma3_length_sweep.png gemma3_length_sweep.png
fig results/gemma3_h2o_observations.png gemma3_h2o_observations.png
fig results/clusterability_gemma3_code/clusterability.png clusterability_gemma3.png
for f in heatmaps memory link; do fig "results/retrieval/retrieval_$f.png" "smollm2_retrieval_$f.png"; done
echo "reproduce.sh: done (step times in $ST/times.tsv)"

#!/usr/bin/env bash
# Reproduces every README figure and table from scratch (after scripts/setup.sh), then regenerates
# all figures and results/report.md with plots/make_figures.py. Needs ../shared/data beside the
# checkout for the real-model experiments. Usage: bash scripts/reproduce.sh [THREADS]
# The embedded figures are copied into $KVSIM_FIGURES (default docs/figures; tests point it elsewhere
# so that no test writes a tracked file).
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-$(nproc)}
K=./build/kvsim
D=${KVSIM_SHARED_DATA:-../shared/data}
FIG=${KVSIM_FIGURES:-docs/figures}
mkdir -p "$FIG"
PY=${KVSIM_PYTHON:-$PWD/.venv/bin/python}; [ -x "$PY" ] || PY=python3
mkdir -p results/recordings
$K record --checkpoint "$D/stories260K/stories260K.bin" --tokenizer "$D/stories260K/tok512.bin" \
  --text "$D/tinystories-sample/tinystories.txt" --tokens 512 --out results/recordings/stories260k_tinystories.h5
$K record --checkpoint "$D/stories260K/stories260K.bin" --tokenizer "$D/stories260K/tok512.bin" \
  --generate 512 --out results/recordings/stories260k_generate.h5 > /dev/null
$K record --checkpoint "$D/aidreams260K/aidreams260K.bin" --tokenizer "$D/aidreams260K/tok512.bin" \
  --generate 128 --out results/recordings/aidreams_generate.h5 > /dev/null
$K record --checkpoint "$D/stories260K/stories260K.bin" --tokenizer "$D/stories260K/tok512.bin" \
  --text "$D/tinystories-sample/tinystories.txt" --tokens 512 --windows 8 --out results/recordings/tinystories_512.h5
S="$D/shakespeare-q80"
$K record --checkpoint "$S/shakespeare_q80.bin" --tokenizer "$S/byte_tokenizer.bin" --text "$D/tinyshakespeare/input.txt" \
  --text-tail 0.05 --tokens 256 --windows 8 --out results/recordings/shakespeare_heldout_256.h5
$K record --checkpoint "$S/shakespeare_q80.bin" --tokenizer "$S/byte_tokenizer.bin" \
  --generate 256 --out results/recordings/shakespeare_generate.h5 > /dev/null
$K run experiments/budget_sweep_8seq.toml --threads "$T" > results/budget_sweep_8seq.txt
$K run experiments/budget_sweep_shakespeare_8seq.toml --threads "$T" > results/budget_sweep_shakespeare_8seq.txt
$K run experiments/prefill_sweep_8seq.toml --threads "$T" > results/prefill_sweep_8seq.txt
$K run experiments/prefill_sweep_shakespeare_8seq.toml --threads "$T" > results/prefill_sweep_shakespeare_8seq.txt
$K run experiments/budget_sweep.toml --threads "$T" --out results/budget_sweep_shakespeare_generate \
  --set data.path=results/recordings/shakespeare_generate.h5 > results/budget_sweep_shakespeare_generate.txt
$K run experiments/budget_sweep.toml --threads "$T" --out results/budget_sweep_generate \
  --set data.path=results/recordings/stories260k_generate.h5 > results/budget_sweep_generate.txt
$K run experiments/budget_sweep.toml --threads "$T" --out results/budget_sweep_aidreams \
  --set data.path=results/recordings/aidreams_generate.h5 --set 'policy.memory=[0.1,0.2,0.3,0.4,0.6]' > results/budget_sweep_aidreams.txt
$K run experiments/budget_sweep_synthetic.toml --threads "$T" --out results/budget_sweep_clustered \
  --set data.synthetic=clustered > results/budget_sweep_clustered.txt
$K run experiments/budget_sweep_long.toml --threads "$T" --out results/budget_sweep_long_clustered \
  --set data.synthetic=clustered > results/budget_sweep_long_clustered.txt
for cfg in budget_sweep_long budget_sweep_synthetic quickstart stories260k policies_stories260k budget_sweep subgen_theorem1 subgen_theorem1_stories260k \
           h2o_submodular h2o_buzz_20pct buzz_tw_sweep h2o_submodular_shakespeare h2o_buzz_20pct_shakespeare \
           subgen_theorem1_shakespeare h2o_observations h2o_observations_synthetic; do
  $K run "experiments/$cfg.toml" --threads "$T" > "results/$cfg.txt"
done
$K run experiments/h2o_observations.toml --out results/h2o_observations_aidreams \
  --set data.path=results/recordings/aidreams_generate.h5 > results/h2o_observations_aidreams.txt
$K run experiments/h2o_observations.toml --out results/h2o_observations_shakespeare \
  --set data.path=results/recordings/shakespeare_heldout_256_w00.h5 > results/h2o_observations_shakespeare.txt
$K run experiments/h2o_observations_synthetic.toml --out results/h2o_observations_clustered \
  --set data.synthetic=clustered > results/h2o_observations_clustered.txt
$K clusters experiments/clusterability.toml > results/clusterability.txt
$K closed-loop experiments/closed_loop.toml --threads "$T" > results/closed_loop.txt
$K clusters experiments/clusterability.toml --out results/clusterability_shakespeare \
  --set data.path=results/recordings/shakespeare_heldout_256_w00.h5 > results/clusterability_shakespeare.txt
$K closed-loop experiments/closed_loop_shakespeare.toml --threads "$T" > results/closed_loop_shakespeare.txt
$K clusters experiments/clusterability.toml --out results/clusterability_aidreams \
  --set data.path=results/recordings/aidreams_generate.h5 > results/clusterability_aidreams.txt
$K closed-loop experiments/closed_loop_prefill.toml --threads "$T" > results/closed_loop_prefill.txt
$K closed-loop experiments/closed_loop_prefill_shakespeare.toml --threads "$T" > results/closed_loop_prefill_shakespeare.txt
$PY plots/make_figures.py results/stories260k results/policies_stories260k results/subgen_theorem1 \
  results/subgen_theorem1_stories260k results/budget_sweep results/budget_sweep_generate results/budget_sweep_aidreams \
  results/budget_sweep_synthetic results/budget_sweep_clustered results/budget_sweep_long results/budget_sweep_long_clustered results/h2o_submodular results/h2o_buzz_20pct results/buzz_tw_sweep \
  results/clusterability results/closed_loop results/budget_sweep_8seq \
  results/budget_sweep_shakespeare_8seq results/budget_sweep_shakespeare_generate results/h2o_submodular_shakespeare \
  results/h2o_buzz_20pct_shakespeare results/subgen_theorem1_shakespeare results/clusterability_shakespeare \
  results/closed_loop_shakespeare results/prefill_sweep_8seq results/prefill_sweep_shakespeare_8seq \
  results/closed_loop_prefill results/closed_loop_prefill_shakespeare --report results/report.md
$PY plots/h2o_observations.py results/h2o_observations results/h2o_observations_aidreams \
  results/h2o_observations_shakespeare results/h2o_observations_synthetic results/h2o_observations_clustered > results/h2o_observations_check.txt
# The figures the README and docs embed, refreshed from this run.
cp results/budget_sweep/metric_vs_budget.png "$FIG"/budget_sweep.png
cp results/budget_sweep_8seq/rel_err_vs_memory_sequences.png "$FIG"/budget_sweep_8seq.png
cp results/h2o_submodular/metric_vs_budget.png "$FIG"/metric_vs_budget.png
cp results/buzz_tw_sweep/buzz_tw_sweep.png "$FIG"/buzz_tw_sweep.png
cp results/closed_loop/closed_loop.png "$FIG"/closed_loop.png
cp results/closed_loop_shakespeare/closed_loop.png "$FIG"/closed_loop_shakespeare.png
cp results/closed_loop_prefill/closed_loop.png "$FIG"/closed_loop_prefill.png
cp results/prefill_sweep_8seq/rel_err_vs_memory_sequences.png "$FIG"/prefill_sweep_8seq.png
cp results/prefill_sweep_shakespeare_8seq/rel_err_vs_memory_sequences.png "$FIG"/prefill_sweep_shakespeare_8seq.png
cp results/budget_sweep_shakespeare_8seq/rel_err_vs_memory_sequences.png "$FIG"/budget_sweep_shakespeare_8seq.png
cp results/clusterability_shakespeare/clusterability.png "$FIG"/clusterability_shakespeare.png
cp results/subgen_theorem1_shakespeare/subgen_theorem1.png "$FIG"/subgen_theorem1_shakespeare.png
cp results/clusterability/clusterability.png "$FIG"/clusterability.png
cp results/h2o_observations/h2o_observations.png "$FIG"/h2o_observations.png
cp results/subgen_theorem1/subgen_theorem1.png "$FIG"/subgen_theorem1.png
cp results/subgen_theorem1_stories260k/subgen_theorem1.png "$FIG"/subgen_theorem1_stories260k.png

#!/usr/bin/env bash
# Builds every figure from tiny results files (matplotlib Agg) and checks the PNG/PDF are written and
# non-empty. Exit 77 (ctest: SKIPPED) when no python3 with h5py and matplotlib is available.
# Usage: plots_test.sh KVSIM_BINARY SOURCE_DIR
set -u
KVSIM=$1; SRC=$2
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
if ! "$PY" -c "import h5py, matplotlib, numpy" 2>/dev/null; then
  echo "SKIPPED: $PY lacks h5py + matplotlib (scripts/setup-venv.sh installs them into .venv)"; exit 77
fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fails=0; passes=0
check() {  # check FIGURE_BASENAME
  if [ -s "$1.png" ] && [ -s "$1.pdf" ]; then passes=$((passes+1)); else echo "FAIL: $1.png/.pdf missing or empty"; fails=$((fails+1)); fi
}
run() { "$KVSIM" run "$@" --quiet >/dev/null 2>"$TMP/err" || { echo "FAIL: kvsim run $*: $(cat "$TMP/err")"; fails=$((fails+1)); }; }

"$KVSIM" synth --preset heavy_hitter --n 160 --d 8 --layers 1 --heads 2 --kv-heads 1 --seed 2 --out "$TMP/rec.h5" >/dev/null
run "$SRC/experiments/quickstart.toml" --out "$TMP/q" --set data.n=128 --set data.d=8
"$PY" "$SRC/plots/error_vs_step.py" "$TMP/q" --metric eps_spectral >/dev/null && check "$TMP/q/eps_spectral_vs_step"
# results.h5 strings come back as str in h5py (variable-length UTF-8), parameters as typed attributes.
"$PY" -c "import h5py, sys; f = h5py.File(sys.argv[1]); g = f['policy_01']
assert isinstance(f.attrs['experiment'], str) and isinstance(g.attrs['label'], str), 'bytes attributes'
assert float(g.attrs['param_budget']) == 0.25 and g['rel_err'].attrs['unit'] == '1'" "$TMP/q/results.h5" \
  && passes=$((passes+1)) || { echo "FAIL: results.h5 attribute types"; fails=$((fails+1)); }
run "$SRC/experiments/subgen_theorem1.toml" --out "$TMP/s" --set data.n=256 --set data.n_heads=2 --set data.n_kv_heads=2 --set eval.from=64
"$PY" "$SRC/plots/subgen_theorem1.py" "$TMP/s" >/dev/null && check "$TMP/s/subgen_theorem1"
run "$SRC/experiments/subgen_theorem1_stories260k.toml" --out "$TMP/s2" --set "data.path=$TMP/rec.h5" --set eval.from=16 --set policy.delta=2.0
"$PY" "$SRC/plots/subgen_theorem1.py" "$TMP/s2" >/dev/null && check "$TMP/s2/subgen_theorem1"
run "$SRC/experiments/h2o_submodular.toml" --out "$TMP/h" --set "data.path=$TMP/rec.h5"
"$PY" "$SRC/plots/metric_vs_budget.py" "$TMP/h" >/dev/null && check "$TMP/h/metric_vs_budget"
run "$SRC/experiments/budget_sweep.toml" --out "$TMP/m" --set "data.path=$TMP/rec.h5" --set 'policy.memory=[0.2,0.6]' --set eval.every=8
"$PY" "$SRC/plots/metric_vs_budget.py" "$TMP/m" >/dev/null && check "$TMP/m/metric_vs_budget"
# H2O's observations: the script recomputes accumulated attention from the recording with numpy and
# exits 1 when its power-law slopes differ from kvsim's accum_slope.
run "$SRC/experiments/h2o_observations.toml" --out "$TMP/o" --set "data.path=$TMP/rec.h5"
"$PY" "$SRC/plots/h2o_observations.py" "$TMP/o" >/dev/null && check "$TMP/o/h2o_observations" \
  || { echo "FAIL: h2o_observations.py (numpy vs kvsim slopes)"; fails=$((fails+1)); }
# --table: the "all" row's attn_sparsity is the mean of the results file's finite values.
"$PY" "$SRC/plots/h2o_observations.py" "$TMP/o" --table --out "$TMP/o/t.png" > "$TMP/table.txt" && "$PY" -c "
import h5py, numpy as np, sys
v = h5py.File(sys.argv[1])['policy_00/attn_sparsity'][:]
row = [l for l in open(sys.argv[2]) if l.startswith('| all |')]
assert len(row) == 1, 'no all row'
got, want = float(row[0].split('|')[2]), float(np.nanmean(v))
assert abs(got - want) <= 5e-3 * abs(want), (got, want)" "$TMP/o/results.h5" "$TMP/table.txt" \
  && passes=$((passes+1)) || { echo "FAIL: h2o_observations.py --table"; fails=$((fails+1)); }
# --by-length: the rows of each (layer, metric) over the step ranges add up to the layer's finite rows, and
# their row-weighted means give the layer's mean (the ranges partition the steps).
"$PY" "$SRC/plots/h2o_observations.py" "$TMP/o" --by-length "$TMP/o/len.csv" --out "$TMP/o/t.png" >/dev/null && "$PY" -c "
import csv, h5py, numpy as np, sys
g = h5py.File(sys.argv[1])['policy_00']
layer, x = g['layer'][:], g['sink_mass'][:]
rows = [r for r in csv.DictReader(open(sys.argv[2])) if r['metric'] == 'sink_mass' and r['layer'] == '0']
assert len(rows) >= 1, 'no rows'
want = x[(layer == 0) & np.isfinite(x)]
assert sum(int(r['rows']) for r in rows) == want.size, 'rows do not partition the steps'
got = sum(int(r['rows']) * float(r['mean']) for r in rows) / want.size
assert abs(got - want.mean()) <= 1e-5 * abs(want.mean()), (got, want.mean())" "$TMP/o/results.h5" "$TMP/o/len.csv" \
  && passes=$((passes+1)) || { echo "FAIL: h2o_observations.py --by-length"; fails=$((fails+1)); }
run "$SRC/experiments/buzz_tw_sweep.toml" --out "$TMP/b" --set "data.path=$TMP/rec.h5"
"$PY" "$SRC/plots/buzz_tw_sweep.py" "$TMP/b" >/dev/null && check "$TMP/b/buzz_tw_sweep"
"$KVSIM" clusters "$SRC/experiments/clusterability.toml" --out "$TMP/c" --set "data.path=$TMP/rec.h5" >/dev/null \
  || { echo "FAIL: kvsim clusters"; fails=$((fails+1)); }
"$PY" "$SRC/plots/clusterability.py" "$TMP/c" >/dev/null && check "$TMP/c/clusterability"
# cluster_growth.py: the tail slope table over two runs (the same one twice: an interval of width 0).
out=$("$PY" "$SRC/plots/cluster_growth.py" "$TMP/c" "$TMP/c" --from 16 --csv "$TMP/c/growth.csv" --plot "$TMP/c/growth.png") \
  && grep -q "| 0 | key | " <<<"$out" && [ -s "$TMP/c/growth.csv" ] && [ -s "$TMP/c/growth.png" ] || { echo "FAIL: cluster_growth.py: $out"; fails=$((fails+1)); }
DATA=${KVSIM_SHARED_DATA:-$SRC/../shared/data}
if [ -f "$DATA/stories260K/stories260K.bin" ]; then
  "$KVSIM" closed-loop "$SRC/experiments/closed_loop.toml" --out "$TMP/cl2" --set model.tokens=128 --set model.windows=1 \
    --set model.generate=8 --set "model.checkpoint=$DATA/stories260K/stories260K.bin" \
    --set "model.tokenizer=$DATA/stories260K/tok512.bin" --set "model.text=$DATA/tinystories-sample/tinystories.txt" >/dev/null \
    || { echo "FAIL: kvsim closed-loop"; fails=$((fails+1)); }
  "$PY" "$SRC/plots/closed_loop.py" "$TMP/cl2" >/dev/null && check "$TMP/cl2/closed_loop"
else
  echo "SKIPPED: closed-loop figure ($DATA absent)"
fi
# Several sequences: metric vs memory with intervals (plots/sequences.py) from sequences.csv.
printf 'name="sq"\n[data]\nsynthetic="heavy_hitter"\nn=96\nd=8\nn_heads=2\nn_kv_heads=1\nsequences=3\n[eval]\nevery=8\n[[policy]]\nname="window"\nmemory=[0.2,0.5]\n[[policy]]\nname="subgen"\nmemory=[0.2,0.5]\nt=1\n' > "$TMP/sq.toml"
run "$TMP/sq.toml" --out "$TMP/sq"
"$PY" "$SRC/plots/sequences.py" "$TMP/sq" >/dev/null && check "$TMP/sq/rel_err_vs_memory_sequences"
# The same at a longer n: error and rank vs n (plots/length_sweep.py), and the docs' tables
# (plots/sequences_table.py) against the CSVs they are read from.
run "$TMP/sq.toml" --out "$TMP/sq2" --set data.n=192
out=$("$PY" "$SRC/plots/length_sweep.py" "$TMP/sq" "$TMP/sq2" --out "$TMP/len.png")
grep -q "| window | .* (.) | .* (.) |" <<<"$out" && check "$TMP/len" || { echo "FAIL: length_sweep table: $out"; fails=$((fails+1)); }
# Fixed token budgets get their own panels; a budget that holds every token (96 at n = 96) is "all kept",
# not ranked, while it is compressed (and ranked) at n = 192.
sed '0,/memory=\[0.2,0.5\]/s//budget=[32,96]/' "$TMP/sq.toml" > "$TMP/sqb.toml"  # window's entry only
run "$TMP/sqb.toml" --out "$TMP/sqb"
run "$TMP/sqb.toml" --out "$TMP/sqb2" --set data.n=192
out=$("$PY" "$SRC/plots/length_sweep.py" "$TMP/sqb" "$TMP/sqb2" --out "$TMP/lenb.png")
grep -q "at 96 tokens at every n" <<<"$out" && grep -q "| window | all kept | .* (.) |" <<<"$out" \
  && grep -q "| window | .* (.) | .* (.) |" <<<"$(grep -A4 "at 32 tokens" <<<"$out")" && check "$TMP/lenb" \
  || { echo "FAIL: length_sweep fixed budgets: $out"; fails=$((fails+1)); }
pick() {  # pick CSV KEY=VALUE... COLUMN: the first row matching every KEY=VALUE, its COLUMN as %.3g
  "$PY" -c 'import csv, sys
want = dict(a.split("=", 1) for a in sys.argv[2:-1])
for r in csv.DictReader(open(sys.argv[1])):
    if all(r.get(k) == v for k, v in want.items()):
        print(f"{float(r[sys.argv[-1]]):.3g}"); break' "$@"
}
want=$(pick "$TMP/sq2/sequences.csv" policy=window metric=rel_err memory=0.2 mean)
tab=$("$PY" "$SRC/plots/sequences_table.py" "$TMP/sq2" --memory 0.2 0.5)
grep -q "^| window | $want \[" <<<"$tab" && passes=$((passes+1)) || { echo "FAIL: sequences_table window 0.2 != $want: $tab"; fails=$((fails+1)); }
grp=$("$PY" "$SRC/plots/sequences_table.py" "$TMP/sq2" --memory 0.2 --groups a=0-0 b=1-2)
want_a=$(pick "$TMP/sq2/seq_00/summary.csv" policy=window metric=rel_err all_layers=1 memory=0.2 mean)
grep -q "^| window | $want_a | " <<<"$grp" && passes=$((passes+1)) || { echo "FAIL: sequences_table group a != $want_a: $grp"; fails=$((fails+1)); }
"$PY" "$SRC/plots/sequences_table.py" "$TMP/none" 2>"$TMP/err" && { echo "FAIL: sequences_table accepted a missing folder"; fails=$((fails+1)); }
grep -q "sequences.csv" "$TMP/err" && passes=$((passes+1)) || { echo "FAIL: sequences_table message: $(cat "$TMP/err")"; fails=$((fails+1)); }
# One command for every figure + report.md over all the tiny runs.
dirs="$TMP/q $TMP/s $TMP/s2 $TMP/h $TMP/m $TMP/b $TMP/c $TMP/sq"; [ -d "$TMP/cl2" ] && dirs="$dirs $TMP/cl2"
rm -f "$TMP/q/rel_err_vs_step.png"
if "$PY" "$SRC/plots/make_figures.py" $dirs --report "$TMP/report.md" >/dev/null 2>"$TMP/err"; then
  n=$(grep -c '^!\[' "$TMP/report.md"); [ "$n" -ge 8 ] && passes=$((passes+1)) || { echo "FAIL: report.md embeds only $n figures"; fails=$((fails+1)); }
  grep -q '^| policy |' "$TMP/report.md" && passes=$((passes+1)) || { echo "FAIL: report.md has no summary table"; fails=$((fails+1)); }
else
  echo "FAIL: make_figures.py: $(cat "$TMP/err")"; fails=$((fails+1))
fi
# Figures that do not fit a run are skipped with a reason: a 20-entry sweep gets no error-vs-step
# figure (the 3-entry quickstart run does: negative control); buzz at one T/w gets no T/w "sweep".
grep -q "skipped error_vs_step: .*policy entries, too many curves" "$TMP/err" && passes=$((passes+1)) \
  || { echo "FAIL: make_figures did not skip error_vs_step for the sweep: $(cat "$TMP/err")"; fails=$((fails+1)); }
[ -s "$TMP/q/rel_err_vs_step.png" ] && passes=$((passes+1)) || { echo "FAIL: no rel_err_vs_step for quickstart"; fails=$((fails+1)); }
run "$SRC/experiments/buzz_tw_sweep.toml" --out "$TMP/b1" --set "data.path=$TMP/rec.h5" --set policy.window=31 --set policy.threshold=93
"$PY" "$SRC/plots/buzz_tw_sweep.py" "$TMP/b1" 2>"$TMP/err" >/dev/null && { echo "FAIL: a one-T/w sweep was drawn"; fails=$((fails+1)); }
grep -q "one T/w only" "$TMP/err" && passes=$((passes+1)) || { echo "FAIL: one-T/w message: $(cat "$TMP/err")"; fails=$((fails+1)); }
# Closed loop: an off-scale point (SubGen's rel_err 1e30) goes to its own panel; none without it.
mkdir -p "$TMP/cl3" "$TMP/cl4"
h="policy,label,window,ce_exact,ce_policy,ce_increase,open_rel_err,open_eps,cache_tokens,diverge_at,model,text,tokens"
rows="window,window(budget=0.1),0,1.5,1.6,0.1,0.2,0.04,10,-1,m,t.txt,64
window,window(budget=0.5),0,1.5,1.51,0.01,0.02,0.004,32,-1,m,t.txt,64
h2o,h2o(budget=0.1),0,1.5,1.62,0.12,0.25,0.05,10,-1,m,t.txt,64"
printf '%s\n%s\n' "$h" "$rows" > "$TMP/cl4/closed_loop.csv"
printf '%s\n%s\nsubgen,"subgen(memory=0.1,t=1)",0,1.5,8,6.5,1e30,1e29,10,3,m,t.txt,64\n' "$h" "$rows" > "$TMP/cl3/closed_loop.csv"
out=$("$PY" "$SRC/plots/closed_loop.py" "$TMP/cl3")
grep -q "off-scale panel: 1 points" <<<"$out" && check "$TMP/cl3/closed_loop" || { echo "FAIL: closed-loop off-scale panel: $out"; fails=$((fails+1)); }
out=$("$PY" "$SRC/plots/closed_loop.py" "$TMP/cl4")
grep -q "off-scale" <<<"$out" && { echo "FAIL: off-scale panel without off-scale points"; fails=$((fails+1)); } || check "$TMP/cl4/closed_loop"
# BUZZ T/w from a multi-sequence run (sequences.csv, no results.h5): the best T/w is the lowest rel_err's.
mkdir -p "$TMP/bz"
{ echo "policy,label,metric,sequences,mean,ci_low,ci_high,interval,sink,stride,threshold,window"
  for tw in "100 100 0.12" "150 50 0.10" "180 20 0.14"; do set -- $tw
    echo "buzz,buzz $1/$2,rel_err,3,$3,0.09,0.15,b,4,5,$1,$2"
    echo "buzz,buzz $1/$2,eps_spectral,3,0.01,0.009,0.011,b,4,5,$1,$2"; done; } > "$TMP/bz/sequences.csv"
out=$("$PY" "$SRC/plots/buzz_tw_sweep.py" "$TMP/bz")
grep -q "best measured T/w = 3.00; Theorem 3.1: 4.33 (s = 5)" <<<"$out" && check "$TMP/bz/buzz_tw_sweep" \
  || { echo "FAIL: buzz_tw_sweep over sequences: $out"; fails=$((fails+1)); }
# The rank correlation over policy entries' means: 4 entries × 3 windows whose CE increase grows with
# rel_err give ρ = 1 with a degenerate interval; reversing the CE order gives ρ = −1 (negative control);
# an entry with a NaN window (a broken model) is left out.
"$PY" - "$SRC/plots" <<'PYEOF' && passes=$((passes+1)) || { echo "FAIL: closed-loop rank correlation"; fails=$((fails+1)); }
import sys
sys.path.insert(0, sys.argv[1])
from closed_loop import rank_correlation
def rows(sign):
    out = [{"label": f"p{k}", "window": str(w), "open_rel_err": str(0.1 * (k + 1) + 0.01 * w),
            "ce_increase": str(sign * (k + 1) + 0.001 * w)} for k in range(4) for w in range(3)]
    out.append({"label": "broken", "window": "0", "open_rel_err": "0.5", "ce_increase": "nan"})
    out.append({"label": "broken", "window": "1", "open_rel_err": "0.5", "ce_increase": "0.1"})
    return out
up, down = rank_correlation(rows(1)), rank_correlation(rows(-1))
assert up[0] == 1.0 and up[1] == up[2] == 1.0 and up[3] == 4, up
assert down[0] == -1.0 and down[3] == 4, down
PYEOF
# A missing results folder is a clear error, not a traceback.
"$PY" "$SRC/plots/error_vs_step.py" "$TMP/none" 2>"$TMP/err" && { echo "FAIL: no error for a missing folder"; fails=$((fails+1)); }
grep -q "results.h5 not found" "$TMP/err" && passes=$((passes+1)) || { echo "FAIL: message: $(cat "$TMP/err")"; fails=$((fails+1)); }
# An interpreter without numpy/h5py/matplotlib (site-packages off: -S) gets one line naming it.
"$PY" -S "$SRC/plots/make_figures.py" "$TMP/q" 2>"$TMP/err" >/dev/null && { echo "FAIL: -S interpreter accepted"; fails=$((fails+1)); }
[ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q "lacks numpy" "$TMP/err" && passes=$((passes+1)) \
  || { echo "FAIL: interpreter message: $(cat "$TMP/err")"; fails=$((fails+1)); }
# Retrieval (plots/retrieval.py): a trials.csv drawn from a known logistic law, P(correct) =
# 1/(1 + exp(-12 (share - 0.6))), seeded; the fit must put the 50% point near 0.6, the threshold
# table must count every policy trial, and the figures must be written.
"$PY" - "$TMP/r" <<'PY' && passes=$((passes+1)) || { echo "FAIL: synthetic trials.csv"; fails=$((fails+1)); }
import os, sys
import numpy as np, pandas as pd
out = sys.argv[1]; os.makedirs(out)
rng = np.random.default_rng(5)
rows = []
for i in range(600):
    share = rng.uniform(0, 1)
    for cache, pol, ok, sh in (("exact", "exact", 1, np.nan), ("h2o(memory=%g)" % (0.25 * (1 + i % 3)), "h2o",
                               int(rng.uniform() < 1 / (1 + np.exp(-12 * (share - 0.6)))), share), ("evict_needle", "evict_needle", 0, np.nan)):
        rows.append(dict(kind="passkey", length=256 * (1 + i % 2), depth=[0.1, 0.5, 0.9][i % 3], trial=i, cache=cache, policy=pol,
                         correct=ok, needle_kept_share=sh, rel_err=np.exp(-3 * share) if pol == "h2o" else np.nan,
                         kept_mass=0.9 if pol == "h2o" else np.nan))
pd.DataFrame(rows).to_csv(os.path.join(out, "trials.csv"), index=False, na_rep="nan")
PY
"$PY" "$SRC/plots/retrieval.py" "$TMP/r" > "$TMP/r.txt" && for f in heatmaps memory link; do check "$TMP/r/retrieval_$f"; done
"$PY" - "$TMP/r" <<'PY' && passes=$((passes+1)) || { echo "FAIL: retrieval link fit"; fails=$((fails+1)); }
import sys
import pandas as pd
link = pd.read_csv(sys.argv[1] + "/link.csv").set_index("predictor")
table = pd.read_csv(sys.argv[1] + "/link_table.csv")
s = link.loc["needle_kept_share"]
assert 0.5 < s.x50 < 0.7 and s.x50_low < 0.6 < s.x50_high, s
assert s.slope > 0 and s.auc > 0.8 and 0.2 < s.mcfadden_r2 < 1 and s.llr_pvalue < 1e-6, s
assert link.loc["log10(rel_err)"].slope < 0  # smaller error, more answers
assert table.trials.sum() == 600 and (table.accuracy.diff().dropna() > 0).all(), table
PY
# depth.csv: each policy's trials per (length, depth) pooled over memory, recounted from trials.csv.
"$PY" - "$TMP/r" <<'PY' && passes=$((passes+1)) || { echo "FAIL: retrieval depth.csv"; fails=$((fails+1)); }
import sys
import pandas as pd
t = pd.read_csv(sys.argv[1] + "/trials.csv")
d = pd.read_csv(sys.argv[1] + "/depth.csv").set_index(["policy", "length", "depth"])
assert len(d) == 3 * 2 * 3 and d.trials.groupby("policy").sum().to_dict() == {"exact": 600, "evict_needle": 600, "h2o": 600}, d
assert (d.loc["exact"].accuracy == 1).all() and (d.loc["evict_needle"].accuracy == 0).all()
for (L, dep), g in t[t.policy == "h2o"].groupby(["length", "depth"]):
    r = d.loc[("h2o", L, dep)]
    assert r.correct == g.correct.sum() and r.trials == len(g), (L, dep, r)
    assert r.wilson_low <= r.accuracy <= r.wilson_high
PY
# Two settings of one policy besides memory (kivi at 4 and 2 bits) stay two policies in every table;
# a policy with one setting (sink=4) keeps its bare name.
"$PY" - "$SRC/plots" "$TMP/rk" <<'PY' && passes=$((passes+1)) || { echo "FAIL: retrieval policy settings"; fails=$((fails+1)); }
import os, sys
import pandas as pd
sys.path.insert(0, sys.argv[1])
import retrieval
out = sys.argv[2]; os.makedirs(out)
rows = []
for i in range(40):
    for cache, pol, ok in (("exact", "exact", 1), ("kivi(bits=4,memory=0.5)", "kivi", 1), ("kivi(bits=2,memory=0.5)", "kivi", 0),
                           ("sink(memory=0.5,sink=4)", "sink", i % 2), ("evict_needle", "evict_needle", 0)):
        rows.append(dict(kind="passkey", length=512, depth=0.5, trial=i, cache=cache, policy=pol, correct=ok,
                         needle_kept_share=float("nan"), rel_err=float("nan"), kept_mass=float("nan")))
pd.DataFrame(rows).to_csv(out + "/trials.csv", index=False, na_rep="nan")
retrieval.main([out])
d = pd.read_csv(out + "/depth.csv").set_index("policy").accuracy
assert d.to_dict() == {"evict_needle": 0, "exact": 1, "kivi(bits=2)": 0, "kivi(bits=4)": 1, "sink": 0.5}, d
PY
# Two runs of the same task with different policies merge: split the synthetic trials into two folders,
# each with every exact and evict_needle row and half the h2o rows; the merged threshold table counts
# each of the 600 policy trials once. Negative control: one exact answer flipped in the second folder
# is refused with a line naming the trial.
"$PY" - "$TMP/r" "$TMP/r1" "$TMP/r2" "$TMP/r3" <<'PY' && passes=$((passes+1)) || { echo "FAIL: split trials.csv"; fails=$((fails+1)); }
import os, sys
import pandas as pd
t = pd.read_csv(sys.argv[1] + "/trials.csv")
pol = t[t.policy == "h2o"]
ctl = t[t.policy != "h2o"]
for out, part in ((sys.argv[2], pol.iloc[::2]), (sys.argv[3], pol.iloc[1::2])):
    os.makedirs(out)
    pd.concat([ctl, part]).to_csv(out + "/trials.csv", index=False, na_rep="nan")
bad = pd.concat([ctl, pol.iloc[1::2]])
bad.loc[bad.index[bad.cache == "exact"][0], "correct"] = 0
os.makedirs(sys.argv[4])
bad.to_csv(sys.argv[4] + "/trials.csv", index=False, na_rep="nan")
PY
"$PY" "$SRC/plots/retrieval.py" "$TMP/r1" "$TMP/r2" --out-dir "$TMP/r12" > /dev/null && "$PY" - "$SRC/plots" "$TMP/r1" "$TMP/r2" "$TMP/r12" <<'PY' \
  && passes=$((passes+1)) || { echo "FAIL: merged runs"; fails=$((fails+1)); }
import sys
import pandas as pd
sys.path.insert(0, sys.argv[1])
import retrieval
t = retrieval.load(sys.argv[2:4])  # each folder holds all 600 exact rows: counted once
assert (t.cache == "exact").sum() == 600 and (t.cache == "evict_needle").sum() == 600 and (t.policy == "h2o").sum() == 600
assert pd.read_csv(sys.argv[4] + "/link_table.csv").trials.sum() == 600
PY
"$PY" "$SRC/plots/retrieval.py" "$TMP/r1" "$TMP/r3" --out-dir "$TMP/r13" > /dev/null 2> "$TMP/err" \
  && { echo "FAIL: disagreeing runs merged"; fails=$((fails+1)); }
[ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q "answers differently (kind=passkey" "$TMP/err" && passes=$((passes+1)) \
  || { echo "FAIL: disagreement message: $(cat "$TMP/err")"; fails=$((fails+1)); }
# An unfinished run (no trials.csv yet, only kvsim task's checkpoints in trials/) loads as the trials
# done so far: the synthetic rows written as checkpoints, one file per trial, read back equal to the
# CSV's (a newline in `generated` as trials.csv's two characters \n); a folder with neither is refused.
"$PY" - "$SRC/plots" "$TMP/r" "$TMP/ru" <<'PY' && passes=$((passes+1)) || { echo "FAIL: unfinished run"; fails=$((fails+1)); }
import json, math, os, sys
import pandas as pd
sys.path.insert(0, sys.argv[1])
import retrieval
t = pd.read_csv(sys.argv[2] + "/trials.csv").head(90)  # 30 trials x 3 caches
t["generated"] = "The pass key is\\n12345."
os.makedirs(sys.argv[3] + "/trials")
with open(sys.argv[3] + "/trials/config.toml", "w") as f:
    f.write('[task]\nkind = "passkey"\n[model]\ncheckpoint = "m/SmolLM2-135M-Instruct.Q4_1.gguf"\n')
def val(v):
    if isinstance(v, str):
        return json.dumps(v.replace("\\n", "\n"))
    return "nan" if isinstance(v, float) and math.isnan(v) else repr(v)
for trial, g in t.groupby("trial"):
    with open(f"{sys.argv[3]}/trials/L{g.length.iloc[0]}_d0_t{trial:03d}.toml", "w") as f:
        for _, r in g.iterrows():
            f.write("[[row]]\n" + "".join(f"{k} = {val(v)}\n" for k, v in r.items() if k != "kind"))
u = retrieval.load([sys.argv[3]])
keys = ["trial", "cache"]
a, b = u.sort_values(keys).reset_index(drop=True), retrieval.load([sys.argv[2]]).head(90).sort_values(keys).reset_index(drop=True)
b["generated"] = t.sort_values(keys).generated.values
assert len(u) == 90 and (u.kind == "passkey").all() and (u.model == "SmolLM2-135M-Instruct.Q4_1").all()
for c in ("trial", "cache", "correct", "generated", "memory"):
    assert a[c].equals(b[c]) or (a[c].isna() == b[c].isna()).all() and (a[c].dropna() == b[c].dropna()).all(), c
assert a.needle_kept_share.fillna(-1).round(9).equals(b.needle_kept_share.fillna(-1).round(9))
PY
mkdir -p "$TMP/rempty/trials"
# Budgets per layer and head (plots/allocation.py): a sweep → kvsim allocate → a 3-window run with the uniform
# split and the files; the table's uniform column is sequences.csv's mean, and the heat maps are written.
printf 'name="al"\n[data]\nsynthetic="heavy_hitter"\nn=128\nd=8\nn_layers=2\nn_heads=2\nn_kv_heads=2\nsequences=3\n[eval]\nevery=8\n[[policy]]\nname="h2o"\nmemory=[0.1,0.2,0.4]\n' > "$TMP/al.toml"
run "$TMP/al.toml" --out "$TMP/alfit"
for g in head layer; do
  "$KVSIM" allocate "$TMP/alfit" --policy h2o --memory 0.25 --granularity $g --out "$TMP/al_$g.json" >/dev/null \
    || { echo "FAIL: kvsim allocate --granularity $g"; fails=$((fails+1)); }
done
printf '[[policy]]\nname="h2o"\nmemory=0.25\n[[policy]]\nname="h2o"\nmemory=0.25\nbudgets_file="%s"\n[[policy]]\nname="h2o"\nmemory=0.25\nbudgets_file="%s"\n' \
  "$TMP/al_head.json" "$TMP/al_layer.json" | cat <(sed '/^\[\[policy/,$d' "$TMP/al.toml") - > "$TMP/al_eval.toml"
run "$TMP/al_eval.toml" --out "$TMP/aleval" --set seed=9
out=$("$PY" "$SRC/plots/allocation.py" "$TMP/aleval" --budgets "$TMP/al_head.json" "$TMP/al_layer.json" --memory 0.25 --out "$TMP/al.png")
uniform=$(awk -F, '$1=="h2o" && $3=="rel_err" && $2 !~ /budgets_file/ {printf "%.4f", $5}' "$TMP/aleval/sequences.csv")
grep -q "^| h2o | 0.25 | $uniform \[.*%.*%" <<<"$out" && [ -s "$TMP/al.png" ] && passes=$((passes+1)) \
  || { echo "FAIL: allocation.py table (uniform $uniform): $out"; fails=$((fails+1)); }
# --closed-loop: per head − uniform paired over windows (here −0.05 in both windows, so the interval is a point).
printf 'policy,label,window,ce_increase\nh2o,h2o(memory=0.2),0,0.1\nh2o,h2o(memory=0.2),1,0.3\nh2o,"h2o(budgets_file=a_head.json,memory=0.2)",0,0.05\nh2o,"h2o(budgets_file=a_head.json,memory=0.2)",1,0.25\n' > "$TMP/cl.csv"
out=$("$PY" "$SRC/plots/allocation.py" "$TMP/aleval" --closed-loop "$TMP/cl.csv")
grep -q "^| h2o | 0.2 | 0.2000 | — | 0.1500 | — | -0.0500 \[-0.0500, -0.0500\] | 2/2 |" <<<"$out" && passes=$((passes+1)) \
  || { echo "FAIL: allocation.py --closed-loop table: $out"; fails=$((fails+1)); }
"$PY" "$SRC/plots/retrieval.py" "$TMP/rempty" > /dev/null 2> "$TMP/err" && { echo "FAIL: empty folder accepted"; fails=$((fails+1)); }
[ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q "trials.csv not found" "$TMP/err" && passes=$((passes+1)) \
  || { echo "FAIL: empty folder message: $(cat "$TMP/err")"; fails=$((fails+1)); }
echo "plots: $passes passed, $fails failed"
[ $fails -eq 0 ]

#!/usr/bin/env bash
# scripts/reproduce.sh --quick end to end (the small models' single-window experiments and SmolLM2 on one
# 2048-token window, figures, results/report.md), with the embedded figures copied into a temporary folder
# instead of docs/figures (no test writes a tracked file); then a resumed run must skip every step, and a
# bad option must fail with one line. Exit 77 (SKIPPED) without ../shared/data or the SmolLM2 file.
# Usage: reproduce_test.sh SOURCE_DIR SHARED_DATA     (ctest label: slow, a few minutes on 2 cores;
# the full `bash scripts/reproduce.sh` is documented in docs/experiments.md with its time)
set -euo pipefail
SRC=$(cd "$1" && pwd); DATA=$2
[ -d "$DATA" ] || { echo "SKIPPED: reproduce needs the real model files in $DATA"; exit 77; }
MODELS=${KVSIM_MODELS:-$SRC/models}
[ -f "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" ] || { echo "SKIPPED: reproduce needs $MODELS/SmolLM2-135M-Instruct.Q4_1.gguf (bash scripts/setup.sh)"; exit 77; }
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cd "$SRC"
KVSIM_SHARED_DATA=$DATA KVSIM_FIGURES=$TMP bash scripts/reproduce.sh --quick --fresh 2 | tee "$TMP/first.log"
for f in budget_sweep.png metric_vs_budget.png buzz_tw_sweep.png closed_loop.png clusterability.png \
         h2o_observations.png subgen_theorem1.png subgen_theorem1_stories260k.png; do
  [ -s "$TMP/$f" ] || { echo "FAIL: figure $f was not written"; exit 1; }
done
for d in smollm2_quick_budget smollm2_quick_prefill h2o_observations_smollm2_quick; do
  [ -s "results/$d/results.h5" ] || { echo "FAIL: results/$d/results.h5 missing"; exit 1; }
done
[ -s results/clusterability_smollm2_quick/clusters.csv ] || { echo "FAIL: SmolLM2 clusterability missing"; exit 1; }
# The SmolLM2 closed loop: a row per policy entry, finite cross-entropies, the window losing more than H2O.
"$PY" - results/smollm2_quick_closed_loop/closed_loop.csv <<'EOF' || { echo "FAIL: SmolLM2 closed loop"; exit 1; }
import csv, math, sys
rows = {r["label"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert len(rows) == 10, len(rows)
assert all(math.isfinite(float(r["ce_increase"])) for r in rows.values())
assert float(rows["window(memory=0.3)"]["ce_increase"]) > float(rows["h2o(memory=0.3)"]["ce_increase"])
EOF
grep -q "smollm2_quick_closed_loop" results/report.md || { echo "FAIL: report.md lacks the SmolLM2 closed loop"; exit 1; }
# The quick passkey task: 4 trials x (exact, 5 policies, evict_needle), the exact cache answering.
"$PY" - results/smollm2_quick_passkey/trials.csv <<'EOF' || { echo "FAIL: SmolLM2 passkey task"; exit 1; }
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 4 * 7, len(rows)
assert all(r["correct"] == "1" for r in rows if r["cache"] == "exact")
assert all(r["correct"] == "0" for r in rows if r["cache"] == "evict_needle")
EOF
grep -q "smollm2_quick_passkey" results/report.md || { echo "FAIL: report.md lacks the passkey task"; exit 1; }
[ -s results/report.md ] || { echo "FAIL: results/report.md missing"; exit 1; }
grep -q "smollm2_quick_budget" results/report.md || { echo "FAIL: results/report.md does not cover SmolLM2"; exit 1; }
# The SmolLM2 window is traceable to its text: file, sha256 and token offset are recorded.
"$PY" - results/recordings/smollm2_quick_w00.h5 results/texts/python_stdlib.txt <<'EOF'
import hashlib, sys, h5py
rec, text = sys.argv[1:]
with h5py.File(rec, "r") as f:
    a = f.attrs
    want = hashlib.sha256(open(text, "rb").read()).hexdigest()
    got = a["text_sha256"].decode() if isinstance(a["text_sha256"], bytes) else a["text_sha256"]
    assert got == want, f"{rec}: text_sha256 {got} != sha256 of {text} {want}"
    assert int(a["text_token_offset"]) == 0 and f["tokens"].shape[0] == 2048, "window offset / length"
print(f"ok: {rec} names its text by sha256 and token offset")
EOF
# Resume: the same steps again run nothing (every stamp matches; --no-figures skips the redrawing).
KVSIM_SHARED_DATA=$DATA KVSIM_FIGURES=$TMP bash scripts/reproduce.sh --quick --no-figures 2 > "$TMP/second.log"
ran=$(grep -E "^reproduce: [a-z0-9_]+: [0-9.]+ s$" "$TMP/second.log" || true)
[ -z "$ran" ] || { echo "FAIL: the resumed run re-ran steps:"; echo "$ran"; exit 1; }
skipped=$(grep -c "done earlier, skipped" "$TMP/second.log" || true)
[ "$skipped" -ge 15 ] || { echo "FAIL: the resumed run skipped only $skipped steps"; exit 1; }
# Negative control: an unknown option fails with one line and runs nothing.
if bash scripts/reproduce.sh --bogus > "$TMP/bad.log" 2>&1; then echo "FAIL: --bogus was accepted"; exit 1; fi
[ "$(wc -l < "$TMP/bad.log")" -eq 1 ] || { echo "FAIL: --bogus gave more than one line"; cat "$TMP/bad.log"; exit 1; }
echo "ok: reproduce.sh --quick wrote the figures, SmolLM2 results and results/report.md; a resumed run skipped $skipped steps"

#!/usr/bin/env bash
# The RULER suite's --quick run (scripts/ruler_suite.sh, docs/tasks.md) on SmolLM2-135M-Instruct: every
# kind once at 1024 tokens with the exact cache, h2o at half the memory and the evict_needle control;
# each run writes its rows with the evidence spans and the open-loop link over them, a second call
# skips the finished runs, and plots/ruler.py builds the suite table from the seven folders.
# Usage: ruler_quick_test.sh KVSIM_BINARY SOURCE_DIR MODELS_DIR SHARED_DATA
set -u
KVSIM=$1; SRC=$2; MODELS=$(cd "$3" 2>/dev/null && pwd); DATA=$(cd "$4" && pwd)
GGUF=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || { echo "SKIPPED: $GGUF is absent (bash scripts/setup.sh fetches it)"; exit 77; }
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
cat > "$TMP/suite.toml" <<TOML
name = "ruler_quick"
seed = 1
[model]
checkpoint = "$GGUF"
[task]
kind = "niah_single"
filler = "$DATA/tinystories-sample/tinystories.txt"
lengths = [1024]
[[policy]]
name = "h2o"
memory = 0.5
TOML
KVSIM=$KVSIM bash "$SRC/scripts/ruler_suite.sh" "$TMP/suite.toml" "$TMP/out" --quick > "$TMP/log" 2>&1 || { cat "$TMP/log"; echo "FAIL: ruler_suite.sh --quick"; exit 1; }
KVSIM=$KVSIM bash "$SRC/scripts/ruler_suite.sh" "$TMP/suite.toml" "$TMP/out" --quick > "$TMP/again" 2>&1 || { echo "FAIL: second call"; exit 1; }
[ "$(grep -c 'is done (trials.csv); skipped' "$TMP/again")" -eq 7 ] && echo "ok: a second call skips the 7 finished runs" || { cat "$TMP/again"; echo "FAIL: finished runs not skipped"; exit 1; }
"$PY" "$SRC/plots/ruler.py" "$TMP"/out/* --out-dir "$TMP/tables" > "$TMP/tables.txt" || { cat "$TMP/tables.txt"; echo "FAIL: plots/ruler.py"; exit 1; }
"$PY" - "$TMP" <<'PY'
import csv, glob, os, sys
tmp = sys.argv[1]
bad = 0
def check(cond, what):
    global bad
    print(("ok: " if cond else "FAIL: ") + what)
    bad += not cond
dirs = sorted(glob.glob(f"{tmp}/out/*_1024"))
check(len(dirs) == 7, f"seven runs at 1024 tokens: {[os.path.basename(d) for d in dirs]}")
for d in dirs:
    rows = list(csv.DictReader(open(f"{d}/trials.csv")))
    kind = rows[0]["kind"]
    check([r["cache"] for r in rows] == ["exact", "h2o(memory=0.5)", "evict_needle"], f"{kind}: exact, h2o, control")
    check(all(r["evidence"] for r in rows), f"{kind}: evidence spans in every row")
    h2o = rows[1]
    kept, share = float(h2o["needle_kept"]), float(h2o["needle_kept_share"])
    check(0 <= kept <= 1 and 0 <= share <= 1 and 0 < float(h2o["rel_err"]) < 2, f"{kind}: h2o's link over the evidence ({kept:.3f}, {share:.3f})")
    check(all(0 <= float(r["score"]) <= 1 and r["correct"] == str(int(float(r["score"]) == 1)) for r in rows), f"{kind}: scores")
suite = list(csv.DictReader(open(f"{tmp}/tables/suite.csv")))
check(len(suite) == 21 and {r["kind"] for r in suite} == {os.path.basename(d)[:-5] for d in dirs}, "suite.csv: 7 kinds x 3 caches")
sys.exit(1 if bad else 0)
PY

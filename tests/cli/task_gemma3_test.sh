#!/usr/bin/env bash
# `kvsim task` on Gemma 3 270M (docs/tasks.md, "Gemma 3"), 640-token prompts: past the local layers'
# 512-token window, so with the needle at depth 0.1 only the three global layers (5, 11, 17) can read
# it when the question is decoded. Checked: every prompt opens with <bos> (the tokenizer's add_bos) and
# is exactly L tokens; the needle is more than 512 tokens before the question's end; the exact cache
# answers and the evict_needle control does not; a window cache on the global layers keeping the
# newest 25% (160 tokens) holds 160 tokens per global-layer cache and, with the needle outside it on
# every layer, does not answer either (the local layers' exact window alone cannot retrieve it).
# Usage: task_gemma3_test.sh KVSIM_BINARY SOURCE_DIR MODELS_DIR SHARED_DATA
set -u
KVSIM=$1; SRC=$2; MODELS=$3; DATA=$(cd "$4" && pwd)
GGUF=$MODELS/gemma-3-270m-q4_k_m.gguf
[ -f "$GGUF" ] || { echo "SKIPPED: $GGUF is absent (bash scripts/setup.sh fetches it)"; exit 77; }
GGUF=$(cd "$MODELS" && pwd)/gemma-3-270m-q4_k_m.gguf
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fails=0
bad() { echo "FAIL: $1"; fails=$((fails+1)); }
# The shipped config's templates, with absolute paths and a short run.
sed -e "s|^checkpoint = .*|checkpoint = \"$GGUF\"|" -e "s|^filler = .*|filler = \"$DATA/tinystories-sample/tinystories.txt\"|" \
  "$SRC/experiments/gemma3_passkey.toml" | awk '/^\[\[policy\]\]/{exit} {print}' > "$TMP/t.toml"
printf '[[policy]]\nname = "window"\nmemory = 0.25\n' >> "$TMP/t.toml"
SET=(--set 'task.lengths=[640]' --set 'task.depths=[0.1]' --set task.trials=3)
"$KVSIM" task "$TMP/t.toml" "${SET[@]}" --out "$TMP/run" --threads 2 --quiet > /dev/null 2> "$TMP/run.err" || bad "run ($(tail -1 "$TMP/run.err"))"
"$KVSIM" task "$TMP/t.toml" "${SET[@]}" --prompts "$TMP/prompts.jsonl" > /dev/null || bad "--prompts"
"$PY" - "$TMP" <<'PY' || fails=$((fails+1))
import csv, json, sys
tmp = sys.argv[1]
bad = 0
def check(cond, what):
    global bad
    print(("ok: " if cond else "FAIL: ") + what)
    bad += not cond
prompts = [json.loads(l) for l in open(f"{tmp}/prompts.jsonl")]
check(len(prompts) == 3, "--prompts: 3 trials")
check(all(p["tokens"][0] == 2 and p["tokens"].count(2) == 1 for p in prompts), "every prompt opens with <bos> (id 2), once")
check(all(len(p["tokens"]) == 640 for p in prompts), "every prompt is 640 tokens")
# Position t of a local layer sees keys t - 511 .. t: from the question's first token on, none of the needle.
check(all(p["question_begin"] - 511 > p["needle_end"] - 1 for p in prompts),
      "the needle lies outside every local layer's window from the question on: "
      + ", ".join(f"needle [{p['needle_begin']}, {p['needle_end']}), question from {p['question_begin']}" for p in prompts))
rows = list(csv.DictReader(open(f"{tmp}/run/trials.csv")))
by = lambda cache: [r for r in rows if r["cache"] == cache]
check(len(rows) == 3 * 3, "3 trials x (exact, window, evict_needle) rows")
check(all(r["correct"] == "1" for r in by("exact")), "the exact cache answers every trial: " + "; ".join(r["generated"] for r in by("exact")))
check(all(r["correct"] == "0" for r in by("evict_needle")), "the cache without the needle's tokens never does")
win = by("window(memory=0.25)")
check(all(r["correct"] == "0" for r in win), "window(25%) on the global layers, the needle outside it, never does")
check(all(float(r["cache_tokens"]) == 160 for r in win), "window(25%) holds 160 tokens per global-layer cache: "
      + ", ".join(r["cache_tokens"] for r in win))
check(all(float(r["needle_kept"]) == 0 and float(r["needle_mass"]) > 0 for r in win),
      "the open loop (global layers) sees the needle's attention mass and the window keeping none of it")
sys.exit(1 if bad else 0)
PY
[ $fails -eq 0 ] && echo "task_gemma3_test: all passed" || echo "task_gemma3_test: $fails failed"
exit $((fails > 0))

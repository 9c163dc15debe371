#!/usr/bin/env bash
# `kvsim task` end to end on SmolLM2-135M-Instruct (docs/tasks.md), short prompts: the exact cache
# retrieves the pass key and the word where the evict_needle control — the exact cache without the
# needle's tokens — does not (the negative control: a cache that loses exactly the needle fails where
# the exact cache succeeds); every trial row carries the open-loop link, at the question's steps or (link_steps =
# "answer") at the exact answer's, where --open-loop gives the full run's rows; a run killed with kill -9 after
# its first checkpointed trial is refused without --resume, and resumed it ends with the same answers
# and metrics as an uninterrupted run; --prompts writes the same trials' prompts; bad [task] keys fail
# in one line.
# Usage: task_test.sh KVSIM_BINARY SOURCE_DIR MODELS_DIR SHARED_DATA
set -u
KVSIM=$1; SRC=$2; MODELS=$3; DATA=$(cd "$4" && pwd)
GGUF=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || { echo "SKIPPED: $GGUF is absent (bash scripts/setup.sh fetches it)"; exit 77; }
GGUF=$(cd "$MODELS" && pwd)/SmolLM2-135M-Instruct.Q4_1.gguf  # the config's paths are absolute
PY=${KVSIM_PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=python3
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails+1)); }
cat > "$TMP/t.toml" <<TOML
name = "task_test"
seed = 3
[model]
checkpoint = "$GGUF"
[task]
kind = "passkey"
filler = "$DATA/tinystories-sample/tinystories.txt"
lengths = [256]
depths = [0.3, 0.7]
trials = 2
[[policy]]
name = "window"
memory = 0.5
[[policy]]
name = "h2o"
memory = 0.5
TOML
"$KVSIM" task "$TMP/t.toml" --out "$TMP/full" --threads 2 > "$TMP/full.txt" 2> "$TMP/full.err" || bad "uninterrupted run ($(tail -1 "$TMP/full.err"))"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/word" --threads 2 --set task.kind=word --quiet > /dev/null || bad "word run"
"$KVSIM" task "$TMP/t.toml" --prompts "$TMP/prompts.jsonl" > /dev/null || bad "--prompts"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/open" --threads 2 --open-loop --quiet > /dev/null || bad "--open-loop run"
# [task] link_steps = "answer": the open loop at the steps that produce the exact cache's answer.
"$KVSIM" task "$TMP/t.toml" --out "$TMP/full_ans" --threads 2 --set 'task.link_steps="answer"' --quiet > /dev/null || bad "link_steps = answer run"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/open_ans" --threads 2 --set 'task.link_steps="answer"' --open-loop --quiet > /dev/null || bad "link_steps = answer --open-loop run"
# --open-loop: the policies' rows of the full run, open-loop columns to the bit, and no answers.
"$PY" - "$TMP" <<'PY' || fails=$((fails+1))
import csv, os, sys
tmp = sys.argv[1]
full = [r for r in csv.DictReader(open(f"{tmp}/full/trials.csv")) if r["cache"] not in ("exact", "evict_needle")]
ol = list(csv.DictReader(open(f"{tmp}/open/open_loop.csv")))
cols = ["length", "depth", "trial", "cache", "needle_begin", "question_begin", "rel_err", "eps", "kept_mass", "needle_kept_share",
        "topk_kept", "rel_err_rheads", "kept_mass_rheads", "topk_kept_rheads", "rel_err_worst_layer", "topk_kept_worst_layer"]
same = len(ol) == len(full) and all(a[c] == b[c] for a, b in zip(full, ol) for c in cols)
print(("ok: " if same else "FAIL: ") + f"--open-loop rows = the full run's policy rows ({len(ol)} rows)")
ok2 = all(r["correct"] == "-1" and r["generated"] == "" for r in ol) and not os.path.exists(f"{tmp}/open/accuracy.csv")
print(("ok: " if ok2 else "FAIL: ") + "--open-loop runs no cache: correct = -1, nothing generated, no accuracy.csv")
# At the answer's steps (its own decode of the exact answer for --open-loop) the rows equal the full run's,
# and they are other steps than the question's (negative control): the exact model, copying the pass key,
# puts more attention on the needle there than while it reads the question.
fa = [r for r in csv.DictReader(open(f"{tmp}/full_ans/trials.csv")) if r["cache"] not in ("exact", "evict_needle")]
oa = list(csv.DictReader(open(f"{tmp}/open_ans/open_loop.csv")))
same_a = len(oa) == len(fa) and all(a[c] == b[c] for a, b in zip(fa, oa) for c in cols)
print(("ok: " if same_a else "FAIL: ") + f"link_steps = answer: --open-loop rows = the full run's ({len(oa)} rows)")
differ = all(a["rel_err"] != b["rel_err"] for a, b in zip(fa, full))
mean = lambda rows: sum(float(r["needle_mass"]) for r in rows) / len(rows)
more = mean(fa) > 1.5 * mean(full)
print(("ok: " if differ and more else "FAIL: ") + f"answer steps differ from the question's; needle mass {mean(fa):.3f} vs {mean(full):.3f}")
sys.exit(0 if same and ok2 and same_a and differ and more else 1)
PY
"$PY" - "$TMP" <<'PY' || fails=$((fails+1))
import csv, math, re, sys
tmp = sys.argv[1]
bad = 0
def check(cond, what):
    global bad
    print(("ok: " if cond else "FAIL: ") + what)
    bad += not cond
for run in ("full", "word"):
    rows = list(csv.DictReader(open(f"{tmp}/{run}/trials.csv")))
    by = lambda cache: [r for r in rows if r["cache"] == cache]
    check(len(rows) == 4 * 4, f"{run}: 4 trials x (exact, 2 policies, evict_needle) rows")
    check(all(r["correct"] == "1" for r in by("exact")), f"{run}: the exact cache answers every trial")
    check(all(r["correct"] == "0" for r in by("evict_needle")), f"{run}: the cache without the needle's tokens never does")
    for r in by("exact") + by("evict_needle"):
        check(int(r["needle_end"]) > int(r["needle_begin"]) and int(r["question_begin"]) < 256, f"{run}: positions of trial {r['trial']}")
    for r in by("window(memory=0.5)") + by("h2o(memory=0.5)"):
        share, nm, kept = float(r["needle_kept_share"]), float(r["needle_mass"]), float(r["needle_kept"])
        check(0 < nm < 1 and 0 <= share <= 1 and 0 <= kept <= 1 and 0 < float(r["rel_err"]) < 2,
              f"{run}: {r['cache']} depth {r['depth']} link metrics in range (share {share:.3f})")
    # The offline scores (docs/tasks.md): shares in [0, 1]; the worst layer is no better than the mean
    # over layers (every layer has the same rows); the exact cache keeps every top-k token.
    for r in by("window(memory=0.5)") + by("h2o(memory=0.5)"):
        f = {k: float(r[k]) for k in ("rel_err", "kept_mass", "topk_kept", "rel_err_rheads", "kept_mass_rheads",
                                      "topk_kept_rheads", "rel_err_worst_layer", "kept_mass_worst_layer", "topk_kept_worst_layer")}
        check(all(0 <= f[k] <= 1 for k in f if "kept" in k) and f["rel_err_rheads"] > 0
              and f["rel_err_worst_layer"] >= f["rel_err"] - 1e-6 and f["kept_mass_worst_layer"] <= f["kept_mass"] + 1e-6
              and f["topk_kept_worst_layer"] <= f["topk_kept"] + 1e-6 and f["topk_kept"] < 1,
              f"{run}: {r['cache']} depth {r['depth']} offline scores in range ({f['topk_kept']:.3f}, {f['rel_err_rheads']:.3f})")
    # window(memory = 0.5) keeps the newest 128 tokens: at question step t (1-based, t = question_begin
    # + 1 .. 256) it holds [t - 128, t), so its needle_kept is the mean of that window's overlap with
    # the needle (the same in every layer and head).
    for r in by("window(memory=0.5)"):
        b, e, q = int(r["needle_begin"]), int(r["needle_end"]), int(r["question_begin"])
        want = sum(max(0, min(e, t) - max(b, t - 128)) for t in range(q + 1, 257)) / (e - b) / (256 - q)
        check(abs(float(r["needle_kept"]) - want) < 1e-5, f"{run}: window's needle_kept {r['needle_kept']} = {want:.6f} from the positions")
    acc = {(r["length"], r["cache"]): r for r in csv.DictReader(open(f"{tmp}/{run}/accuracy.csv"))}
    e = acc[("256", "exact")]
    check(e["trials"] == "4" and e["correct"] == "4" and e["counts"] == "1", f"{run}: accuracy.csv counts the exact cache 4/4")
    lo, hi = float(e["wilson_low"]), float(e["wilson_high"])
    check(abs(lo - 0.5101) < 1e-3 and hi == 1, f"{run}: Wilson interval of 4/4 = [0.510, 1] ({lo}, {hi})")
# --prompts writes the trials' prompts without running them: the same positions as the run's rows, and
# the budgets pinned to tokens (memory = 0.5 of L = 256), so that another implementation answers the
# same tokens (scripts/kvpress_task.py).
import json
prompts = [json.loads(l) for l in open(f"{tmp}/prompts.jsonl")]
exact = [r for r in csv.DictReader(open(f"{tmp}/full/trials.csv")) if r["cache"] == "exact"]
check(len(prompts) == len(exact) == 4, "--prompts: one line per trial")
for p, r in zip(prompts, exact):
    same = all(str(p[k]) == r[k] for k in ("length", "trial", "needle_begin", "needle_end", "question_begin")) \
        and p["depth"] == float(r["depth"]) and p["value"] == r["answer"] and len(p["tokens"]) == 256
    check(same, f"--prompts: trial {r['depth']}/{r['trial']} has the run's positions and answer")
check(all(p["budgets"] == {"window(memory=0.5)": 128, "h2o(memory=0.5)": 128} and p["generate"] == 12 for p in prompts),
      "--prompts: budgets pinned to 128 tokens")
check(len({tuple(p["tokens"]) for p in prompts}) == 4, "--prompts: four different prompts")
# Trials run every depth's #0 first (a stopped run covers the depths evenly); rows keep the config's order.
progress = [re.search(r"depth ([0-9.]+), #(\d+)", l).groups() for l in open(f"{tmp}/full.err") if l.startswith("kvsim task: trial")]
check(progress == [("0.3", "0"), ("0.7", "0"), ("0.3", "1"), ("0.7", "1")], f"trials run trial-index-major: {progress}")
exact = [(r["depth"], r["trial"]) for r in csv.DictReader(open(f"{tmp}/full/trials.csv")) if r["cache"] == "exact"]
check(exact == [("0.3", "0"), ("0.3", "1"), ("0.7", "0"), ("0.7", "1")], f"trials.csv in (depth, trial) order: {exact}")
sys.exit(1 if bad else 0)
PY
# Kill -9 once the first trial is checkpointed; the unfinished run is refused, then resumed.
"$KVSIM" task "$TMP/t.toml" --out "$TMP/killed" --threads 2 --quiet > /dev/null 2>&1 &
pid=$!
for _ in $(seq 600); do ls "$TMP/killed/trials/"*.toml 2>/dev/null | grep -q _t000 && break; sleep 0.1; done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
[ -d "$TMP/killed/trials" ] && ok "a checkpoint was left" || bad "no checkpoint folder after the kill"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/killed" --threads 2 > /dev/null 2> "$TMP/refused.err"
rc=$?
[ $rc -eq 2 ] && grep -q "pass --resume to continue it or --force" "$TMP/refused.err" && ok "unfinished run refused without --resume" || bad "unfinished run: rc $rc, $(cat "$TMP/refused.err")"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/killed" --threads 2 --resume > /dev/null 2> "$TMP/resumed.err" || bad "resume"
grep -q "(checkpointed)" "$TMP/resumed.err" && ok "the resumed run reused a checkpointed trial" || bad "no checkpointed trial reused: $(cat "$TMP/resumed.err")"
[ -f "$TMP/killed/trials.csv" ] && [ ! -e "$TMP/killed/trials" ] && ok "a finished run leaves no checkpoints" || bad "checkpoints left behind"
[ -f "$TMP/full/trials.csv" ] && cmp <(cut -d, -f1-29 "$TMP/full/trials.csv") <(cut -d, -f1-29 "$TMP/killed/trials.csv") > /dev/null \
  && ok "resumed trials.csv = uninterrupted (timings aside)" || bad "resumed trials.csv differs"
# Bad input: one line naming the key, exit 2.
"$KVSIM" task "$TMP/t.toml" --out "$TMP/bad" --set task.depth=0.5 > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l < "$TMP/bad.err")" -eq 1 ] && grep -q "unknown key 'depth' in \[task\]" "$TMP/bad.err" && ok "unknown [task] key refused" || bad "unknown key: rc $rc, $(cat "$TMP/bad.err")"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/bad" --set 'task.lengths=[40]' > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q "task.lengths: 40 tokens leave" "$TMP/bad.err" && ok "a prompt too short for the templates refused" || bad "short prompt: rc $rc, $(cat "$TMP/bad.err")"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/oracle" --set policy.1.score=oracle > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q "non-causal oracle" "$TMP/bad.err" && [ ! -e "$TMP/oracle/trials" ] && ok "a non-causal oracle refused before any trial" || bad "oracle: rc $rc, $(cat "$TMP/bad.err")"
# A RULER kind with several needles (niah_multivalue: four values of one key, each its own needle): the
# control without all four scores nothing, the exact cache scores, and window's needle_kept is the share
# of the four spans' tokens inside its newest 128 tokens, from the positions in the evidence column.
"$KVSIM" task "$TMP/t.toml" --out "$TMP/multi" --threads 2 --quiet --set 'task.kind="niah_multivalue"' --set 'task.lengths=[512]' \
  --set 'task.depths=[0.2]' > /dev/null 2> "$TMP/multi.err" || bad "niah_multivalue run: $(tail -1 "$TMP/multi.err")"
"$PY" - "$TMP/multi/trials.csv" <<'PY' || fails=$((fails+1))
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
bad = 0
def check(cond, what):
    global bad
    print(("ok: " if cond else "FAIL: ") + what)
    bad += not cond
by = lambda cache: [r for r in rows if r["cache"] == cache]
check(len(by("exact")) == 2 and all(len(r["answer"].split(", ")) == 4 for r in rows), "multivalue: two trials, four values each")
check(all(len(r["evidence"].split()) == 4 for r in rows), "multivalue: four evidence spans per trial")
check(sum(float(r["score"]) for r in by("exact")) >= 1, f"multivalue: the exact cache scores {[r['score'] for r in by('exact')]}")
check(all(float(r["score"]) == 0 for r in by("evict_needle")), "multivalue: the control without the four needles scores 0")
for r in by("window(memory=0.5)"):
    spans = [tuple(map(int, s.split("-"))) for s in r["evidence"].split()]
    q = int(r["question_begin"])
    shares = []
    for t in range(q + 1, 513):
        inside = sum(max(0, min(e, t) - max(b, t - 256)) for b, e in spans)
        shares.append(inside / sum(min(e, t) - b for b, e in spans))
    want = sum(shares) / len(shares)
    check(abs(float(r["needle_kept"]) - want) < 1e-5, f"multivalue: window's needle_kept {r['needle_kept']} = {want:.6f} over four spans")
sys.exit(1 if bad else 0)
PY
"$KVSIM" task "$TMP/t.toml" --out "$TMP/bad" --set task.hops=3 > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q "task.hops does not apply to task.kind \"passkey\"" "$TMP/bad.err" && ok "a setting of another kind refused" || bad "hops: rc $rc, $(cat "$TMP/bad.err")"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/bad" --set 'task.kind="niah_multikey"' --set task.needles=40 > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q "task.lengths: 256 tokens leave .*; lower task.needles" "$TMP/bad.err" && [ ! -e "$TMP/bad/trials" ] && ok "too many needles for L refused by key" || bad "needles: rc $rc, $(cat "$TMP/bad.err")"
# The fuzz campaign's findings: a trial count that would run for days, and a count that wraps at 32 bits
# (4294967297 read as 1), are refused by key, not run.
"$KVSIM" task "$TMP/t.toml" --prompts "$TMP/p.jsonl" --set task.trials=99999999999 > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q "task.trials must be in \[1, 10000\]" "$TMP/bad.err" && [ ! -e "$TMP/p.jsonl" ] && ok "task.trials beyond 10000 refused" || bad "trials: rc $rc, $(cat "$TMP/bad.err")"
"$KVSIM" task "$TMP/t.toml" --prompts "$TMP/p.jsonl" --set task.generate=4294967297 > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q "task.generate must be in \[1, 256\]" "$TMP/bad.err" && ok "task.generate past 32 bits refused, not wrapped" || bad "generate: rc $rc, $(cat "$TMP/bad.err")"
"$KVSIM" task "$TMP/t.toml" --prompts "$TMP/p.jsonl" --set 'task.lengths=[4294967552]' > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q "task.lengths: 4294967552 does not fit in 32 bits" "$TMP/bad.err" && ok "task.lengths past 32 bits refused, not wrapped" || bad "lengths: rc $rc, $(cat "$TMP/bad.err")"
"$KVSIM" task "$TMP/t.toml" --out "$TMP/bad" --set 'task.link_steps="answers"' > /dev/null 2> "$TMP/bad.err"
rc=$?
[ $rc -eq 2 ] && grep -q 'task.link_steps must be "question" or "answer" (got "answers")' "$TMP/bad.err" && ok "an unknown task.link_steps refused by key" || bad "link_steps: rc $rc, $(cat "$TMP/bad.err")"
[ $fails -eq 0 ] && echo "task_test: all passed" || echo "task_test: $fails failed"
exit $((fails > 0))

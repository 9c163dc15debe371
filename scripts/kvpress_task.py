#!/usr/bin/env python3
"""A `kvsim task` config's trials answered through kvpress's own pipeline, beside kvsim's answers.

Usage: .venv/bin/python scripts/kvpress_task.py TASK.toml [--set key=value]... [--kvsim DIR]
           [--presses StreamingLLMPress,SnapKVPress,ExpectedAttentionPress | all] [--ratio 0.5]
           [--out DIR] [--threads N] [--stop-after N]

kvsim's closed loop compresses the context (the prompt before the question) once, as kvpress's
KVPressTextGenerationPipeline does, and decodes the question and the answer through the compressed
cache. This script checks that setting against kvpress itself, on the same tokens:

1. `kvsim task TASK.toml --prompts` writes every trial's prompt (tokens, needle, question start) and
   each [[policy]] entry's cache size in tokens, pinned as `kvsim task` pins it.
2. transformers loads the same GGUF (float32, CPU). For every trial, kvpress's pipeline
   (`KVPressTextGenerationPipeline._forward`, kvpress 0.5.5) prefills the context with no press and
   with each press, then answers the question greedily (`generate` tokens). The press's
   compression_ratio r is set so that it keeps int(C·(1 − r)) = B tokens of the C context tokens,
   where B is the size of the kvsim entry it stands beside (PRESS_POLICY below). kvpress appends the
   question and the answer to the compressed cache; kvsim's snapkv and expected_attention do the
   same, while its `sink` streams at B tokens. Any other press kvsim.kvpress_catalog runs (built as the
   catalogue builds it: wrappers around SnapKVPress, the decoding presses through the pipeline's
   generation; `--presses all` = every one but PyramidKV and PerLayerCompression, which kvpress decodes
   with flash attention only) answers at compression ratio --ratio, with no kvsim entry beside it.
3. Each answer is scored by `kvsim task`'s own rule (_kvsim._answer_score: the share of the expected
   strings found, RULER's string_match_all or whole words, as the config says; correct = all found). OUT/trials.csv holds one
   row per (trial, cache): the press, its compression_ratio, the budget B it aims at and `kept`, the
   compressed context's size read back from kvpress's cache (mean over layers), `needle_kept` (the
   share of the needle's tokens the press kept, mean over layers and KV heads, read from its scores
   as ScorerPress.compress ranks them: kvsim's column of that name), the answer and its score.
   OUT/accuracy.csv: the accuracy per (L, cache) with its 95% Wilson interval.
   A kvsim entry run with `budgets_file` (a per-(layer, KV head) allocation, `kvsim allocate`) gets its
   press wrapped in kvsim.kvpress_budgets' BudgetsPress: the file's counts scaled to the entry's B, the
   rest masked as AdaKVPress masks; `kept` is then the mean of the counts the press left, read back.
4. With --kvsim DIR (a finished `kvsim task` run of the same config), OUT/agreement.csv pairs every
   kvpress answer with kvsim's for the same trial and budget: both right, both wrong, only kvsim right,
   only kvpress right, and the share of identical answer texts.

5. Resumable: every finished trial's rows are appended to OUT/trials.partial.jsonl, and a rerun with the
   same config, --set, --presses and --ratio (the same prompts) skips them; trials.csv is written, and the
   partial file removed, once every trial is done. A partial file of another run is refused.
   `--stop-after N` answers at most N new trials and stops, so a long run can be time-boxed.

Exit 0; 2 on bad input (missing config, model or kvsim folder); 3 when torch/transformers/kvpress
are missing. docs/kvpress.md shows a run.
"""
import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import time

# kvpress press → the kvsim policy whose budget it takes (kvsim's label "policy(memory=…)").
# (PyramidKVPress is not among them: kvpress decodes its per-layer budgets with flash attention only.)
PRESS_POLICY = {"StreamingLLMPress": "sink", "SnapKVPress": "snapkv", "ExpectedAttentionPress": "expected_attention",
                "TOVAPress": "tova", "KnormPress": "knorm"}
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg, code=2):
    print(f"kvpress_task: {msg}", file=sys.stderr)
    sys.exit(code)


def read_prompts(a, path):
    """Runs `kvsim task --prompts`; returns the trials (dicts) and the checkpoint path."""
    cmd = [a.kvsim_bin, "task", a.config, "--prompts", path] + [x for s in a.set for x in ("--set", s)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        fail(r.stderr.strip() or f"{' '.join(cmd)} failed")
    with open(path, encoding="utf-8") as f:
        trials = [json.loads(line) for line in f]
    import tomllib

    # The checkpoint kvsim used: the last `--set model.checkpoint=…` (relative to the working directory, as
    # kvsim reads a path given on the command line), else the config's (relative to the config's folder).
    for spec in reversed(a.set):
        key, _, value = spec.partition("=")
        if key.strip() == "model.checkpoint":
            try:
                value = tomllib.loads("x = " + value)["x"]
            except tomllib.TOMLDecodeError:
                pass  # a bare path, as kvsim takes it
            return trials, os.path.normpath(os.path.abspath(value))
    with open(a.config, "rb") as f:
        ckpt = tomllib.load(f).get("model", {}).get("checkpoint", "")
    return trials, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(a.config)), ckpt))


def entries(trial, presses, ratio):
    """[(cache label, press name, kvsim label, budget)] for one trial: exact, then each press of PRESS_POLICY
    at the budget of every kvsim entry of its policy, and every other press at compression ratio `ratio`
    (no kvsim label: budget int(C·(1 − ratio)) of the C context tokens), as is a press of PRESS_POLICY whose
    policy has no entry in the config."""
    out = [("exact", "", "exact", -1)]
    C = trial["question_begin"]
    for p in presses:
        pol = PRESS_POLICY.get(p)
        beside = [(label, b) for label, b in trial["budgets"].items() if pol and label.split("(")[0] == pol and b > 0]
        for label, b in beside:
            out.append((f"{p}{label[len(pol):]}", p, label, b))
        if not beside:  # no kvsim entry of its policy in the config: the press runs at --ratio alone
            out.append((f"{p}(ratio={ratio:g})", p, "", int(C * (1 - ratio))))
    return out


def label_budgets(label, config):
    """(budgets file, memory) of a kvsim entry run with `budgets_file` (its label
    'policy(budgets_file=P,memory=M)'), else None. The path is taken as kvsim printed it (relative to the
    working directory), else relative to the config's folder, as kvsim reads it."""
    if "budgets_file=" not in label:
        return None
    keys = dict(kv.split("=", 1) for kv in label[label.index("(") + 1:-1].split(",") if "=" in kv)
    path, memory = keys["budgets_file"], keys.get("memory", "")
    if not os.path.isfile(path):
        path = os.path.join(os.path.dirname(os.path.abspath(config)), path)
    if not os.path.isfile(path):
        fail(f"{label}: budgets file {keys['budgets_file']} not found")
    try:
        m = float(memory) if "." in memory or "e" in memory else int(memory)
    except ValueError:
        fail(f"{label}: memory '{memory}' is not a number")
    return path, m


def cache_key(label):
    """A kvsim cache label with its budgets file named by its base name, so runs that gave the same file by
    another path (results/alloc/x.json, budgets/x.json) pair up."""
    if "budgets_file=" not in label:
        return label
    head, _, rest = label.partition("budgets_file=")
    path, sep, tail = rest.partition(",")
    return head + "budgets_file=" + os.path.basename(path) + sep + tail


def track_needle(press, spans):
    """Wraps a ScorerPress's `score` so that every layer's kept context positions are read as kvpress's
    ScorerPress.compress picks them (the top compute_n_kept(k_len, r) scores per KV head); returns the
    list that collects, per (layer, KV head), the share of the needle's tokens (the [begin, end) spans)
    kept."""
    from kvpress.utils import compute_n_kept

    shares, score = [], press.score
    size = sum(e - b for b, e in spans)

    def scored(module, hidden_states, keys, values, attentions, kwargs):
        s = score(module, hidden_states, keys, values, attentions, kwargs)
        kept = s.topk(compute_n_kept(keys.shape[2], press.compression_ratio), dim=-1).indices
        inside = sum(((kept >= b) & (kept < e)).sum(-1) for b, e in spans)
        shares.extend((inside.float() / size).flatten().tolist())
        return s

    press.score = scored
    return shares


def answer(pipe, torch, transformers, ctx, question, press, trial):
    """kvpress's answer (trial["generate"] tokens), the compressed context's mean size over layers (read
    from the cache, which kvpress truncates back to the compressed context after answering), and the
    mean share of the needle's tokens (the trial's evidence spans) the press kept over (layer, KV head)
    (nan without a press: kvsim's `needle_kept` of a prompt compressor, which keeps its set through the
    question)."""
    spans = trial.get("evidence") or [[trial["needle_begin"], trial["needle_end"]]]
    from kvpress import ScorerPress

    # The needle's kept share is read where the press ranks by its own scores (a ScorerPress); a wrapper
    # (AdaKV, chunking, decoding-time presses) reports nan.
    scorer = isinstance(press, ScorerPress) and press.compression_ratio > 0
    shares = track_needle(press, spans) if scorer and spans and spans[0][0] >= 0 else []
    cache = transformers.DynamicCache()
    with torch.no_grad():
        text = pipe._forward({"context_ids": ctx, "questions_ids": [question]}, max_new_tokens=trial["generate"], press=press,
                             cache=cache)[0]
    sizes = [cache.get_seq_length(layer) for layer in range(len(cache))]
    if getattr(press, "kept", None):  # a BudgetsPress masks: the tokens it left per compressed cache, read back
        sizes = press.kept
    return text, sum(sizes) / len(sizes), (sum(shares) / len(shares) if shares else float("nan"))


def agreement(rows, kvsim_dir):
    """Per (L, kvsim label): the kvpress and kvsim answers of the same trials, paired."""
    path = os.path.join(kvsim_dir, "trials.csv")
    if not os.path.isfile(path):
        fail(f"{path}: no such file (--kvsim names a finished `kvsim task` run)")
    with open(path, encoding="utf-8") as f:
        theirs = {(int(r["length"]), r["depth"], int(r["trial"]), cache_key(r["cache"])): r for r in csv.DictReader(f)}
    groups = {}
    for r in rows:
        k = theirs.get((r["length"], r["depth"], r["trial"], cache_key(r["kvsim_cache"])))
        if k is None:
            continue
        g = groups.setdefault((r["length"], r["cache"], r["kvsim_cache"]), [0, 0, 0, 0, 0])
        a, b = int(k["correct"]), r["correct"]
        g[0] += a and b
        g[1] += (not a) and (not b)
        g[2] += a and not b
        g[3] += b and not a
        g[4] += k["generated"].strip() == r["generated"].replace("\n", "\\n").strip()
    return groups


def write_accuracy(rows, out, _kvsim):
    """OUT/accuracy.csv and a markdown table: per (L, cache) the accuracy with its 95% Wilson interval."""
    acc = {}
    for r in rows:
        acc.setdefault((r["length"], r["cache"]), []).append((r["correct"], r["score"]))
    with open(os.path.join(out, "accuracy.csv"), "w", encoding="utf-8") as f:
        f.write("length,cache,trials,correct,accuracy,wilson_low,wilson_high,score\n")
        print("| L | cache | accuracy [95% Wilson] | score |\n|---|---|---|---|")
        for (L, cache), cs in acc.items():
            v = [c for c, _ in cs]
            score = sum(s for _, s in cs) / len(cs)
            lo, hi = _kvsim._wilson_interval(sum(v), len(v))
            f.write(f"{L},\"{cache}\",{len(v)},{sum(v)},{sum(v) / len(v):.4f},{lo:.4f},{hi:.4f},{score:.4f}\n")
            print(f"| {L} | {cache} | {sum(v)}/{len(v)} = {sum(v) / len(v):.2f} [{lo:.2f}, {hi:.2f}] | {score:.2f} |")


class Checkpoint:
    """OUT/trials.partial.jsonl: one line per finished trial (its rows), so that a run stopped midway resumes
    where it stopped. The first line fingerprints the run (config text, --set, presses, ratio, the prompts'
    tokens); a partial file of another run is refused (exit 2) rather than mixed in."""

    def __init__(self, out, setup):
        self.path = os.path.join(out, "trials.partial.jsonl")
        self.setup = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()
        self.done, self.added = {}, 0
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                lines = [json.loads(line) for line in f if line.endswith("\n")]  # a torn last line is redone
            if not lines or lines[0].get("setup") != self.setup:
                fail(f"{self.path}: left by a different run (config, --set, --presses, --ratio or prompts differ); "
                     "remove it or choose another --out")
            self.done = {d["trial"]: d["rows"] for d in lines[1:]}
            print(f"kvpress_task: resuming {self.path}: {len(self.done)} trials done", file=sys.stderr)
        else:
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(json.dumps({"setup": self.setup}) + "\n")

    def rows(self, i):
        return self.done.get(i)

    def add(self, i, rows):
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"trial": i, "rows": rows}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.added += 1

    def finish(self):
        os.remove(self.path)


def run_trial(tr, presses, ratio, model, pipe, torch, transformers, cat, _kvsim, config):
    """One trial's rows: the exact cache and every press entry (see entries) answering through kvpress's
    pipeline, each scored by kvsim's rule. Beside a kvsim entry run with a budgets file, the press is
    kvsim.kvpress_budgets' BudgetsPress around it: the file's per-(layer, KV head) counts, scaled to the
    entry's pinned budget B, as kvsim scales them."""
    from kvsim import kvpress_budgets
    ids = torch.tensor(tr["tokens"], dtype=torch.long)
    ctx, q = ids[: tr["question_begin"]].unsqueeze(0), ids[tr["question_begin"]:].unsqueeze(0)
    C = tr["question_begin"]
    rows = []
    for cache, press_name, label, B in entries(tr, presses, ratio):
        press, r = None, 0.0
        if press_name:
            r = 1.0 - (B + 0.5) / C if label else ratio  # int(C·(1 − r)) = B
            press = cat.build(press_name, r)
            budgets = label_budgets(label, config) if label else None
            if budgets:
                press = kvpress_budgets.budgets_press(press, kvpress_budgets.counts_for(*budgets, C, mean=B))
        # A press reading the attention weights (ObservedAttention) runs on eager attention.
        model.set_attn_implementation("eager" if press_name in cat.EAGER else "sdpa")
        torch.manual_seed(0)  # presses with random sketches (LeverageScore, Compactor) give the same answer again
        text, kept, needle_kept = answer(pipe, torch, transformers, ctx, q, press, tr)
        score = _kvsim._answer_score(text, tr["answers"], tr["match"])
        rows.append({"kind": tr["kind"], "length": tr["length"], "depth": f"{tr['depth']:g}", "trial": tr["trial"],
                     "cache": cache, "press": press_name or "none", "kvsim_cache": label,
                     "compression_ratio": f"{r:.6f}", "budget": B if press_name else C, "kept": kept,
                     "needle_kept": f"{needle_kept:.6g}", "answer": tr["value"], "generated": text,
                     "correct": int(score == 1), "score": score})
    return rows


def choose_presses(a, cat):
    """The --presses list, checked against the catalogue (exit 2 naming a press kvsim does not run)."""
    runnable = cat.pipeline_runnable()
    presses = runnable if a.presses == "all" else [p for p in a.presses.split(",") if p]
    for p in presses:
        if p in cat.NO_CPU_PIPELINE:
            fail(f"--presses: '{p}': {cat.NO_CPU_PIPELINE[p]}")
        if p not in runnable:
            why = f"kvsim does not run it: {cat.CATALOG[p].how}" if p in cat.CATALOG else "not a kvpress export"
            fail(f"--presses: '{p}': {why}")
    if not (0 < a.ratio < 1):
        fail(f"--ratio {a.ratio}: must be in (0, 1)")
    return presses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], help="a `kvsim task` override (repeatable)")
    ap.add_argument("--presses", default="StreamingLLMPress,SnapKVPress,ExpectedAttentionPress",
                    help="kvpress presses: those of PRESS_POLICY take the budgets of the config's kvsim entries, any "
                         "other press kvsim.kvpress_catalog runs (direct, wrapped or pipeline) runs at --ratio; "
                         "'all' = every such press")
    ap.add_argument("--ratio", type=float, default=0.5, help="compression ratio of presses without a kvsim entry")
    ap.add_argument("--kvsim", help="a finished `kvsim task` run of the same config, to pair answers with")
    ap.add_argument("--out", default=None, help="output folder (default results/kvpress_<task name>)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    ap.add_argument("--kvsim-bin", default=os.path.join(HERE, "..", "build", "kvsim"))
    ap.add_argument("--stop-after", type=int, default=0, metavar="N",
                    help="answer at most N trials not yet in the partial file, then stop (exit 0); rerun to resume")
    a = ap.parse_args()
    if not os.path.isfile(a.config):
        fail(f"{a.config}: no such task config")
    try:
        import torch
        import transformers
        import kvpress
    except ImportError as e:
        fail(f"{e} (bash scripts/setup.sh installs torch and kvpress)", 3)
    from kvsim import _kvsim
    from kvsim import kvpress as bridge
    from kvsim import kvpress_catalog as cat

    presses = choose_presses(a, cat)
    out = a.out or os.path.join("results", "kvpress_" + os.path.splitext(os.path.basename(a.config))[0])
    os.makedirs(out, exist_ok=True)
    trials, gguf = read_prompts(a, os.path.join(out, "prompts.jsonl"))
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    model, tok = bridge.load_model(gguf)
    pipe = kvpress.KVPressTextGenerationPipeline(model=model, tokenizer=tok)
    ckpt = Checkpoint(out, {"config": open(a.config, encoding="utf-8").read(), "set": a.set, "presses": presses,
                            "ratio": a.ratio, "prompts": [t["tokens"] for t in trials]})
    rows = []
    for i, tr in enumerate(trials):
        t0 = time.time()
        done = ckpt.rows(i)
        if done is None:
            if a.stop_after > 0 and ckpt.added >= a.stop_after:
                print(f"kvpress_task: stopped after {ckpt.added} new trials ({i} of {len(trials)} done); "
                      f"rerun the same command to resume from {ckpt.path}", file=sys.stderr)
                return 0
            done = run_trial(tr, presses, a.ratio, model, pipe, torch, transformers, cat, _kvsim, a.config)
            ckpt.add(i, done)
        rows += done
        right = sum(r["correct"] for r in done)
        print(f"kvpress_task: trial {i + 1}/{len(trials)} (L={tr['length']}, depth {tr['depth']:g}, #{tr['trial']}): "
              f"{right}/{len(done)} caches right, {time.time() - t0:.1f} s", file=sys.stderr)
    fields = list(rows[0])
    with open(os.path.join(out, "trials.csv.tmp"), "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "generated": r["generated"].replace("\n", "\\n")})
    os.replace(os.path.join(out, "trials.csv.tmp"), os.path.join(out, "trials.csv"))
    write_accuracy(rows, out, _kvsim)
    if a.kvsim:
        groups = agreement(rows, a.kvsim)
        with open(os.path.join(out, "agreement.csv"), "w", encoding="utf-8") as f:
            f.write("length,cache,kvsim_cache,trials,both_right,both_wrong,only_kvsim,only_kvpress,same_text\n")
            print("\n| L | kvpress | kvsim | trials | both right | both wrong | only kvsim | only kvpress | same text |")
            print("|---|---|---|---|---|---|---|---|---|")
            for (L, cache, label), g in groups.items():
                n = g[0] + g[1] + g[2] + g[3]
                f.write(f"{L},\"{cache}\",\"{label}\",{n},{g[0]},{g[1]},{g[2]},{g[3]},{g[4]}\n")
                print(f"| {L} | {cache} | {label} | {n} | {g[0]} | {g[1]} | {g[2]} | {g[3]} | {g[4]} |")
    ckpt.finish()
    print(f"wrote {out}/trials.csv and accuracy.csv" + (" and agreement.csv" if a.kvsim else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A retrieval task answered by kvpress's own pipeline beside `kvsim task` (scripts/kvpress_task.py).

  kvpress_task_test.py KVSIM SOURCE_DIR MODELS_DIR DATA_DIR

Two 256-token passkey trials (depths 0.3 and 0.7) with sink, snapkv and
expected_attention at memory 0.5 (128 tokens), and snapkv with the shipped per-(layer, KV head) budgets
(experiments/budgets/smollm2_snapkv_head.json), answered by `kvsim task` and by kvpress 0.5.5's
KVPressTextGenerationPipeline on transformers (the same GGUF, float32, CPU). Checked:
  1. every press compressed the context (233 tokens) to exactly the kvsim budget (128), read back
     from kvpress's own cache (for the budgets entry, a BudgetsPress around SnapKVPress: the mean of the
     counts it left unmasked per cache, which are uneven);
  2. without a press, kvpress's pipeline answers every trial, with the same text as kvsim's exact cache
     (kvsim's closed loop decodes the same tokens as transformers);
  3. negative control: StreamingLLMPress keeps the 4 sinks and the last 124 context tokens, which at
     depth 0.3 excludes the needle, so it answers none of those trials while the exact cache answers
     all (the press really acted on the cache);
  4. agreement.csv pairs every kvpress answer with kvsim's for the same trial and budget, the budgets
     entry included;
  5. the config names an absent checkpoint, and both tools take the model from `--set model.checkpoint`;
  6. a run stopped after one trial (--stop-after 1) resumes to the same trials.csv; another run's partial
     file is refused.
Exit 0 passed, 1 failed, 77 SKIPPED (torch/transformers/kvpress or the model file absent).
"""
import csv
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)


def check_resume(src, kvsim_bin, cfg, ckpt, tmp, theirs):
    """Resumption: stopped after one trial, the partial file holds it and no trials.csv exists; rerun, the
    second trial is answered and trials.csv equals the uninterrupted run's (`theirs`); a partial file of another
    run (other presses) is refused by name."""
    again = os.path.join(tmp, "again")
    cmd = [sys.executable, os.path.join(src, "scripts", "kvpress_task.py"), cfg, "--out", again, "--threads", "2",
           "--kvsim-bin", kvsim_bin, "--set", ckpt]
    r1 = subprocess.run(cmd + ["--stop-after", "1"], capture_output=True, text=True)
    partial = os.path.join(again, "trials.partial.jsonl")
    check(r1.returncode == 0 and os.path.exists(partial) and not os.path.exists(os.path.join(again, "trials.csv"))
          and sum(1 for _ in open(partial, encoding="utf-8")) == 2, "--stop-after 1 left one trial in the partial file")
    r2 = subprocess.run(cmd + ["--presses", "SnapKVPress"], capture_output=True, text=True)
    check(r2.returncode == 2 and "left by a different run" in r2.stderr, "a partial file of another run is refused")
    r3 = subprocess.run(cmd, capture_output=True, text=True)
    same_csv = r3.returncode == 0 and open(os.path.join(again, "trials.csv"), encoding="utf-8").read() == \
        open(os.path.join(theirs, "trials.csv"), encoding="utf-8").read()
    check(same_csv and "resuming" in r3.stderr and not os.path.exists(partial),
          "the resumed run's trials.csv equals the uninterrupted run's")


def check_budgets_entry(rows, budgets):
    """The snapkv entry with a budgets file ran as SnapKVPress in BudgetsPress, with uneven counts of mean 128."""
    wrapped = [row for row in rows if "budgets_file=" in row["cache"]]
    check(len(wrapped) == 2 and all(row["press"] == "SnapKVPress" for row in wrapped),
          "the budgets entry ran as SnapKVPress wrapped in the file's counts")
    from kvsim import kvpress_budgets
    counts = [c for r in kvpress_budgets.counts_for(budgets, 0.5, 233, mean=128) for c in r]
    check(min(counts) < 128 < max(counts) and sum(counts) == 128 * len(counts),
          f"the budgets are uneven per cache ({min(counts)}..{max(counts)}) with mean exactly 128")


def main():
    kvsim_bin, src, models, data = sys.argv[1:5]
    gguf = os.path.abspath(os.path.join(models, GGUF))
    if not os.path.isfile(gguf):
        print(f"SKIPPED: {gguf} is absent (bash scripts/setup.sh fetches it)")
        return SKIP
    try:
        import kvpress  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e} (bash scripts/setup.sh installs torch and kvpress)")
        return SKIP
    filler = os.path.abspath(os.path.join(data, "tinystories-sample", "tinystories.txt"))
    budgets = os.path.abspath(os.path.join(src, "experiments", "budgets", "smollm2_snapkv_head.json"))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "t.toml")
        with open(cfg, "w", encoding="utf-8") as f:
            # The config names no real checkpoint: both tools must take it from --set model.checkpoint.
            f.write(f'name = "kvpress_task_test"\nseed = 3\n[model]\ncheckpoint = "absent.gguf"\n[task]\nkind = "passkey"\n'
                    f'filler = "{filler}"\nlengths = [256]\ndepths = [0.3, 0.7]\ntrials = 1\n'
                    '[[policy]]\nname = "sink"\nsink = 4\nmemory = 0.5\n'
                    '[[policy]]\nname = "snapkv"\nmemory = 0.5\n'
                    '[[policy]]\nname = "expected_attention"\nmemory = 0.5\n'
                    f'[[policy]]\nname = "snapkv"\nmemory = 0.5\nbudgets_file = "{budgets}"\n')
        ours = os.path.join(tmp, "kvsim")
        ckpt = f"model.checkpoint={gguf}"
        subprocess.run([kvsim_bin, "task", cfg, "--out", ours, "--threads", "2", "--quiet", "--set", ckpt], check=True,
                       stdout=subprocess.DEVNULL)
        theirs = os.path.join(tmp, "kvpress")
        r = subprocess.run([sys.executable, os.path.join(src, "scripts", "kvpress_task.py"), cfg, "--kvsim", ours,
                            "--out", theirs, "--threads", "2", "--kvsim-bin", kvsim_bin, "--set", ckpt],
                           capture_output=True, text=True)
        print(r.stdout)
        check(r.returncode == 0, "kvpress_task.py ran" + (f" (rc {r.returncode}: {r.stderr.strip()[-300:]})" if r.returncode else ""))
        if r.returncode:
            return 1
        rows = list(csv.DictReader(open(os.path.join(theirs, "trials.csv"), encoding="utf-8")))
        kv = {(row["depth"], row["trial"], row["cache"]): row
              for row in csv.DictReader(open(os.path.join(ours, "trials.csv"), encoding="utf-8"))}
        prompts = [json.loads(line) for line in open(os.path.join(theirs, "prompts.jsonl"), encoding="utf-8")]
        check(len(rows) == 2 * 5, f"2 trials x (no press + 3 presses + budgets) rows ({len(rows)})")
        check_budgets_entry(rows, budgets)
        pressed = [row for row in rows if row["press"] != "none"]
        check(all(float(row["kept"]) == 128 == int(row["budget"]) for row in pressed),
              "every press left exactly 128 context tokens in kvpress's cache: " +
              ", ".join(sorted({row["kept"] for row in pressed})))
        check(all(float(row["kept"]) == p["question_begin"] for row in rows if row["press"] == "none"
                  for p in prompts if p["depth"] == float(row["depth"]) and p["trial"] == int(row["trial"])),
              "without a press the whole context stays")
        # The needle's kept share, read from the press's own scores: StreamingLLMPress keeps the 4 sinks
        # and the last 124 of the C context tokens, so it must equal |F ∩ kept| / |F| exactly (all of a
        # needle at depth 0.7; at depth 0.3 only the needle's tail that reaches into the window).
        for row in (r for r in rows if r["press"] == "StreamingLLMPress"):
            p = next(p for p in prompts if p["depth"] == float(row["depth"]) and p["trial"] == int(row["trial"]))
            kept = set(range(4)) | set(range(p["question_begin"] - 124, p["question_begin"]))
            needle = range(p["needle_begin"], p["needle_end"])
            want = sum(j in kept for j in needle) / len(needle)
            check(abs(float(row["needle_kept"]) - want) < 1e-6,
                  f"StreamingLLMPress at depth {row['depth']} kept {row['needle_kept']} of the needle "
                  f"[{p['needle_begin']}, {p['needle_end']}) of {p['question_begin']} context tokens (expected {want:.6g})")
        check(len({row["needle_kept"] for row in rows if row["press"] == "StreamingLLMPress"}) == 2,
              "the two StreamingLLMPress trials keep different shares of their needles")
        check(all(row["needle_kept"] == "nan" for row in rows if row["press"] == "none"), "no press: needle_kept is nan")
        exact = [row for row in rows if row["press"] == "none"]
        check(all(row["correct"] == "1" for row in exact), "kvpress's pipeline without a press answers every trial")
        same = [row["generated"].strip() == kv[(row["depth"], row["trial"], "exact")]["generated"].strip() for row in exact]
        check(all(same), f"kvsim's exact cache generates kvpress's text in {sum(same)}/{len(same)} trials")
        streaming = [row for row in rows if row["press"] == "StreamingLLMPress" and row["depth"] == "0.3"]
        check(len(streaming) == 1 and all(row["correct"] == "0" for row in streaming),
              "negative control: StreamingLLMPress, whose 128 tokens exclude a needle at depth 0.3, answers nothing")
        agree = list(csv.DictReader(open(os.path.join(theirs, "agreement.csv"), encoding="utf-8")))
        check(len(agree) == 5 and all(int(a["trials"]) == 2 for a in agree),
              "agreement.csv pairs 2 trials for each of exact, the 3 presses and the budgets entry")
        ex = [a for a in agree if a["cache"] == "exact"]
        check(len(ex) == 1 and ex[0]["both_right"] == "2", "exact: both implementations right on 2/2")
        check_resume(src, kvsim_bin, cfg, ckpt, tmp, theirs)
    print("kvpress_task_test: " + ("all passed" if not failures else f"{len(failures)} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

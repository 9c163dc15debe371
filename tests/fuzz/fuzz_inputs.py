#!/usr/bin/env python3
"""Fuzz campaign over kvsim's untrusted inputs.

Usage: fuzz_inputs.py KVSIM [--count N] [--seed S] [--jobs J] [--timeout SEC] [--keep DIR]
                            [--corpus DIR] [--report FILE]

Feeds a kvsim binary (meant to be built with -DKVSIM_SANITIZE=ON: AddressSanitizer + UBSan) seeded,
mutated inputs of seven kinds and checks every outcome:

  recording-struct  HDF5 recordings changed with h5py: attributes deleted or set to extreme values or
                    wrong types, datasets deleted, replaced (float64/int/string/bool types, wrong
                    shapes, scalars, groups, unwritten or half-written chunks, lzf/external storage,
                    dangling links), non-finite and huge values                → kvsim run / inspect
  recording-bytes   the same files with 1–8 random bytes overwritten (mostly in the metadata), cut
                    short, or with junk appended                               → kvsim run / inspect
  config            TOML configs with values swapped for extreme ones, lines deleted, duplicated or
                    swapped, keys misspelt, bytes inserted                     → kvsim run
  set               --set overrides of every size-like key with extreme values → kvsim run
  checkpoint        llama2.c checkpoints and tokenizers (a tiny model written here) with header
                    fields set to extreme values, bytes flipped, files cut or extended
                                                                               → kvsim record
  gguf              a tiny GGUF model (llama architecture, byte-level BPE tokenizer, F32/F16/Q8_0/Q4_0/
                    Q4_1/Q5_1 tensors, written with llama.cpp's `gguf` package) with header counts,
                    metadata lengths and value types, tensor dimensions, types and offsets set to
                    extreme values, bytes flipped, files cut or extended       → kvsim record
  task              `kvsim task` configs of every kind (passkey, word, the RULER suite) mutated as
                    `config`, or --set overrides of the [task] keys (tests/fuzz/fuzz_task.py)
                                                                               → kvsim task --prompts

An outcome is accepted when kvsim exits 0, or exits non-zero with every stderr line from kvsim
itself and the last one a `kvsim: error: ...` line — and, after a failure, no result file or
temporary left in the output folder. Anything else — a sanitizer report, a signal, a timeout
(hang), an `internal error`, HDF5's own error stack, a half-written result — is a finding: the input
is copied to --keep and the script exits 1. Every input in --corpus (tests/fuzz/fuzz_corpus: inputs that
once crashed kvsim, each with the command and the message it must now give) runs first.
Same --seed, same inputs: the campaign is reproducible.
"""
import argparse
import concurrent.futures as cf
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuzz_gguf import gguf_cases  # noqa: E402
from fuzz_task import task_cases  # noqa: E402
from fuzz_budgets import budgets_cases  # noqa: E402
from fuzz_mutators import (RUN_CONFIG, checkpoint_cases, config_cases, recording_cases,  # noqa: E402
                           set_cases)

SANITIZER = re.compile(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer|"
                       r"SUMMARY: .*Sanitizer")
def kvsim_outcome(argv, out_dir, timeout, env):
    """Run kvsim; (verdict, detail) with verdict in ok | error | finding."""
    t0 = time.time()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return "finding", f"hang: no exit within {timeout} s"
    err = p.stderr
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if SANITIZER.search(err):
        first = next((ln for ln in lines if SANITIZER.search(ln)), lines[0] if lines else "")
        return "finding", "sanitizer: " + first.strip()[:300]
    if p.returncode < 0 or p.returncode >= 128:
        return "finding", f"killed by signal / status {p.returncode}: " + (lines[-1][:200] if lines else "")
    leftovers = []
    if out_dir and os.path.isdir(out_dir):
        for root, _, files in os.walk(out_dir):
            leftovers += [os.path.join(root, f) for f in files if f.endswith(".tmp")]
            if p.returncode != 0:
                leftovers += [os.path.join(root, f) for f in files if f in ("results.h5", "summary.csv")]
    if leftovers:
        return "finding", f"left {os.path.relpath(leftovers[0], out_dir)} behind (status {p.returncode})"
    if p.returncode == 0:
        return "ok", f"{time.time() - t0:.2f} s"
    if "--check-attn" in argv and p.returncode == 1 and "attention check: FAIL" in p.stdout and not lines:
        return "error", "attention check: FAIL (stored attn differs from recomputed: exit 1 by design)"
    if not lines:
        return "finding", f"status {p.returncode} with no message"
    if "internal error" in err or "HDF5-DIAG" in err:
        return "finding", "message: " + lines[-1][:300]
    if not lines[-1].startswith("kvsim: error: ") or any(not ln.startswith("kvsim") for ln in lines):
        return "finding", "not one kvsim line: " + " | ".join(lines)[:300]
    return "error", lines[-1][len("kvsim: error: "):][:300]

# ---------------------------------------------------------------- the regression corpus

def corpus_cases(kvsim, corpus, work):
    """tests/fuzz/fuzz_corpus/MANIFEST: `file | kvsim arguments ({} = the file, {out} = a fresh folder,
    {dir} = the corpus folder) | text the one-line error must contain` per line."""
    manifest = os.path.join(corpus, "MANIFEST")
    cases = []
    if not os.path.exists(manifest):
        return cases
    for n, line in enumerate(open(manifest)):
        if not line.strip() or line.startswith("#"):
            continue
        name, args, needle = (x.strip() for x in line.split("|"))
        out = os.path.join(work, f"corpus_{n}_out")
        cfg = os.path.join(work, f"corpus_{n}.toml")
        with open(cfg, "w") as f:
            f.write(RUN_CONFIG.format(path=os.path.join(corpus, name)))
        argv = [kvsim] + [a.replace("{}", os.path.join(corpus, name)).replace("{out}", out).replace("{cfg}", cfg)
                          .replace("{dir}", corpus) for a in args.split()]
        cases.append(("corpus", f"{name}: must say '{needle}'", argv, out, [os.path.join(corpus, name)], needle))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kvsim")
    ap.add_argument("--count", type=int, default=1000, help="mutated inputs in all (default 1000)")
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as a hang")
    ap.add_argument("--keep", default="fuzz_findings", help="folder for inputs that produced findings")
    ap.add_argument("--corpus", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_corpus"))
    ap.add_argument("--report", default=None, help="also write the per-kind table here (markdown)")
    a = ap.parse_args()
    kvsim = os.path.abspath(a.kvsim)
    rng = random.Random(a.seed)
    # Allocations over 8 GiB fail (as on a smaller machine) instead of paging: kvsim must report them.
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=8192:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    work = tempfile.mkdtemp(prefix="kvsim_fuzz_")
    t0 = time.time()
    try:
        share = {"recording-struct": 0.25, "recording-bytes": 0.20, "config": 0.15, "set": 0.12, "checkpoint": 0.12,
                 "gguf": 0.12, "task": 0.08, "budgets": 0.04}
        n = {k: max(1, round(a.count * v)) for k, v in share.items()}
        cases, notes = corpus_cases(kvsim, a.corpus, work), []
        for kind in ("recording-struct", "recording-bytes"):
            c, note = recording_cases(kvsim, work, random.Random(rng.random()), n[kind], kind)
            cases += c
            notes += [note] if note else []
        cases += config_cases(kvsim, work, random.Random(rng.random()), n["config"])
        cases += set_cases(kvsim, work, random.Random(rng.random()), n["set"])
        cases += checkpoint_cases(kvsim, work, random.Random(rng.random()), n["checkpoint"])
        cases += task_cases(kvsim, work, random.Random(rng.random()), n["task"])
        cases += budgets_cases(kvsim, work, random.Random(rng.random()), n["budgets"])
        c, note = gguf_cases(kvsim, work, random.Random(rng.random()), n["gguf"])
        cases += c
        notes += [note] if note else []
        with cf.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            results = list(pool.map(lambda c: kvsim_outcome(c[2], c[3], a.timeout, env), cases))
        table, findings = {}, []
        for case, (verdict, detail) in zip(cases, results):
            if case[0] == "corpus" and case[5] == "ok" and verdict == "error":
                verdict, detail = "finding", f"corpus input refused (it must run): {detail}"
            elif case[0] == "corpus" and case[5] != "ok" and verdict == "error" and case[5] not in detail:
                verdict, detail = "finding", f"corpus message lacks '{case[5]}': {detail}"
            elif case[0] == "corpus" and case[5] != "ok" and verdict == "ok":
                verdict, detail = "finding", "corpus input accepted (it must be refused)"
            row = table.setdefault(case[0], {"ok": 0, "error": 0, "finding": 0})
            row[verdict] += 1
            if verdict == "finding":
                findings.append((case, detail))
        lines = ["| input kind | inputs | accepted (exit 0) | refused with one kvsim: error line | findings |",
                 "|---|---|---|---|---|"]
        for kind, row in table.items():
            lines.append(f"| {kind} | {sum(row.values())} | {row['ok']} | {row['error']} | {row['finding']} |")
        total = sum(sum(r.values()) for r in table.values())
        print("\n".join(lines))
        for note in notes:
            print(note)
        print(f"fuzz: {total} inputs (seed {a.seed}) in {time.time() - t0:.0f} s, {len(findings)} findings")
        if a.report:
            with open(a.report, "w") as f:
                f.write("\n".join(lines) + "\n")
        if findings:
            os.makedirs(a.keep, exist_ok=True)
            for i, (case, detail) in enumerate(findings[:50]):
                print(f"FINDING [{case[0]}] {case[1]}: {detail}\n    {' '.join(case[2])}")
                for src in case[4]:
                    if os.path.exists(src):
                        shutil.copy(src, os.path.join(a.keep, f"{i:03d}_" + os.path.basename(src)))
            return 1
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

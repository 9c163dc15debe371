#!/usr/bin/env python3
"""Runs every command the README and docs/*.md show in ```sh blocks, from the repository root.

A block may be preceded by a marker comment saying what it needs:
    <!-- docs-test: needs=data -->          the real-model files (../shared/data, or argv[2])
    <!-- docs-test: needs=gpu -->           a usable CUDA device (nvidia-smi lists one)
    <!-- docs-test: needs=transformers -->  python3 with torch and transformers
    <!-- docs-test: needs=models -->        the model files that scripts/setup.sh fetches into models/
    <!-- docs-test: skip=REASON -->         never run here (e.g. the test command itself)
A block whose need is missing is reported SKIPPED with the reason; every other block must exit 0.
```text blocks are illustrations (synopses, outputs) and are not run.

Usage: docs_test.py REPO_ROOT [SHARED_DATA_DIR]   exit 0 when every runnable block passed, 1 otherwise
       docs_test.py --self-test                   the parser and runner on planted blocks
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

MARK = re.compile(r"<!--\s*docs-test:\s*(needs|skip)=(.*?)\s*-->")


def blocks(path):
    """(line, marker kind, marker value, script) of every ```sh block in a Markdown file."""
    out, lines = [], open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            m = MARK.search(lines[k]) if k >= 0 else None
            out.append((i + 1, m.group(1) if m else None, m.group(2) if m else None, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return out


def have(need, data_dir):
    if need == "data":
        return os.path.isdir(data_dir), f"{data_dir} is absent"
    if need == "gpu":
        ok = shutil.which("nvidia-smi") is not None and subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True).returncode == 0
        return ok, "no CUDA device (nvidia-smi lists none)"
    if need == "transformers":
        ok = subprocess.run([sys.executable, "-c", "import torch, transformers"], capture_output=True).returncode == 0
        return ok, "python3 has no torch/transformers"
    if need == "models":
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        r = subprocess.run([sys.executable, os.path.join(here, "scripts", "fetch_models.py"), "--check"],
                           capture_output=True, text=True)
        return r.returncode == 0, (r.stderr.strip() or "model files absent") + " (bash scripts/setup.sh fetches them)"
    return False, f"unknown need '{need}'"


def run_docs(root, data_dir, files):
    failed, ran, skipped = [], 0, []
    for f in files:
        rel = os.path.relpath(f, root)
        for line, kind, value, script in blocks(f):
            where = f"{rel}:{line}"
            if kind == "skip":
                skipped.append(f"{where}: {value}")
                continue
            if kind == "needs":
                ok, why = have(value, data_dir)
                if not ok:
                    skipped.append(f"{where}: needs {value}: {why}")
                    continue
            print(f"--- running {where}", flush=True)
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=root, capture_output=True, text=True)
            ran += 1
            if r.returncode != 0:
                tail = (r.stdout + r.stderr).strip().split("\n")[-8:]
                failed.append(f"{where}: exit {r.returncode}\n    " + "\n    ".join(tail))
    return ran, skipped, failed


def report(ran, skipped, failed):
    for s in skipped:
        print(f"SKIPPED {s}")
    for f in failed:
        print(f"FAILED {f}")
    print(f"docs_test: {ran} block(s) run, {len(failed)} failed, {len(skipped)} skipped")
    return 1 if failed else 0


def self_test():
    with tempfile.TemporaryDirectory() as root:
        md = os.path.join(root, "x.md")
        with open(md, "w") as f:
            f.write("```sh\ntrue\n```\n\n<!-- docs-test: needs=data -->\n```sh\nfalse\n```\n"
                    "<!-- docs-test: skip=why not -->\n```sh\nfalse\n```\n```text\nfalse\n```\n```sh\nexit 3\n```\n")
        ran, skipped, failed = run_docs(root, os.path.join(root, "absent"), [md])
    assert ran == 2 and len(skipped) == 2 and len(failed) == 1 and "exit 3" in failed[0], (ran, skipped, failed)
    print("docs_test: self-test runs sh blocks, skips marked ones, ignores text blocks and reports a failing one")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    if len(sys.argv) not in (2, 3):
        print("usage: docs_test.py REPO_ROOT [SHARED_DATA_DIR]", file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    data = sys.argv[2] if len(sys.argv) == 3 else os.path.join(root, "..", "shared", "data")
    docs = os.path.join(root, "docs")
    files = [os.path.join(root, "README.md")] + sorted(
        os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))
    return report(*run_docs(root, data, files))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Source code as a recording text: the top-level modules of the Python standard library that Debian's
``libpython3.X-stdlib`` package installs, concatenated in file-name order.

kvsim's real-LLM results (docs/results.md) replay SmolLM2 on two genres, prose and source code. Code is
taken from an installed Debian package so that every machine of this kind makes the same bytes without a
download; the package name and version, each file's sha256 and the text's sha256 go to a JSON sidecar
(OUT with the suffix .json), and the recordings store the text's sha256 and token offsets (kvsim record's
attributes text_file, text_sha256, text_token_offset).

Each file is preceded by one line ``# ---- FILE.py ----`` so that a window's text can be traced to its files.
Files are taken in sorted order until the text reaches --bytes (a whole file at a time).

Usage: make_code_text.py OUT [--bytes 400000] [--stdlib /usr/lib/python3.11]
Exit 2 with one line naming the folder or file on bad input; OUT is written atomically.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import sysconfig


def debian_package(path):
    """(package, version) owning `path` by dpkg, or ("unknown", "unknown") off Debian."""
    try:
        owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True, check=True).stdout
        pkg = owner.split(":", 1)[0].strip()
        ver = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True,
                             check=True).stdout.strip()
        return pkg, ver
    except (OSError, subprocess.CalledProcessError):
        return "unknown", "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=400_000, help="stop once the text holds at least this many bytes")
    ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"], help="the standard library folder")
    a = ap.parse_args()
    if a.bytes <= 0:
        sys.exit("make_code_text.py: --bytes must be positive")
    try:
        names = sorted(f for f in os.listdir(a.stdlib) if f.endswith(".py"))
    except OSError as e:
        sys.exit(f"make_code_text.py: {a.stdlib}: cannot list the standard library ({e.strerror})")
    if not names:
        print(f"make_code_text.py: {a.stdlib}: no .py files", file=sys.stderr)
        sys.exit(2)
    parts, files = [], []
    size = 0
    for name in names:
        with open(os.path.join(a.stdlib, name), "rb") as f:
            data = f.read()
        block = f"# ---- {name} ----\n".encode() + data + (b"" if data.endswith(b"\n") else b"\n")
        parts.append(block)
        pkg, ver = debian_package(os.path.join(a.stdlib, name))
        files.append({"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "package": pkg, "version": ver})
        size += len(block)
        if size >= a.bytes:
            break
    if size < a.bytes:
        print(f"make_code_text.py: {a.stdlib}: only {size} bytes of .py files, fewer than --bytes {a.bytes}",
              file=sys.stderr)
        sys.exit(2)
    text = b"".join(parts)
    packages = sorted({f"{f['package']} {f['version']}" for f in files})
    meta = {"source": "Python standard library, top-level modules in file-name order", "folder": a.stdlib,
            "packages": packages, "bytes": len(text), "sha256": hashlib.sha256(text).hexdigest(),
            "files": files}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    for path, payload in ((a.out, text), (os.path.splitext(a.out)[0] + ".json",
                                          (json.dumps(meta, indent=1) + "\n").encode())):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    print(f"make_code_text.py: {a.out}: {len(files)} files of {', '.join(packages)}, {len(text)} bytes, "
          f"sha256 {meta['sha256'][:12]}…")


if __name__ == "__main__":
    main()

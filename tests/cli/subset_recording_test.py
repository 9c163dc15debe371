#!/usr/bin/env python3
"""datasets/subset_recording.py on a synthetic recording: the chosen layers, renumbered, with their
tensors (float16-rounded when asked), the attributes following them, and a recording kvsim replays;
bad input refused in one line with exit status 2 and no file written.

Usage: subset_recording_test.py KVSIM_BINARY
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "datasets", "subset_recording.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def main():
    kvsim = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "src.h5"), os.path.join(tmp, "out.h5")
        subprocess.run([kvsim, "synth", "--preset", "gaussian", "--n", "64", "--d", "8", "--layers", "3", "--heads", "4",
                        "--kv-heads", "2", "--out", src], check=True, capture_output=True)
        r = run(src, out, "--layers", "2,0", "--dtype", "float16")
        assert r.returncode == 0, r.stderr
        with h5py.File(src) as a, h5py.File(out) as b:
            assert int(b.attrs["n_layers"]) == 2 and list(b.attrs["subset_layers"]) == [2, 0]
            for new, old in ((0, 2), (1, 0)):
                for t in ("q", "k", "v"):
                    x, y = a[f"layer_{old:03d}/{t}"][()], b[f"layer_{new:03d}/{t}"][()]
                    assert y.dtype == np.float16 and np.array_equal(y, x.astype(np.float16)), (new, t)
            # Negative control: the layers really were reordered (layer 2's keys are not layer 0's).
            assert not np.array_equal(b["layer_000/k"][()], a["layer_000/k"][()].astype(np.float16))
        rr = subprocess.run([kvsim, "inspect", out], capture_output=True, text=True)
        assert rr.returncode == 0 and "layers:        2" in rr.stdout, rr.stdout + rr.stderr
        for args, says in (((src, out + "2", "--layers", "3"), "out of range [0, 3)"),
                           ((os.path.join(tmp, "none.h5"), out + "2", "--layers", "0"), "no such file"),
                           ((SCRIPT, out + "2", "--layers", "0"), "not an HDF5 file"),
                           ((src, out + "2", "--layers", "a"), "not a comma list")):
            r = run(*args)
            assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
            assert not os.path.exists(out + "2") and not os.path.exists(out + "2.tmp"), args
    print("ok: layers copied and renumbered, float16 as asked, kvsim reads the result; 4 bad inputs refused")


if __name__ == "__main__":
    main()

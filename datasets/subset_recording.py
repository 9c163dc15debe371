#!/usr/bin/env python3
"""Copy some layers of a kvsim recording into a smaller one, optionally stored as float16.

Used to carry a real recording to the GPU machine (the device tool takes at most 64 MiB): Gemma 3
270M's three global layers (5, 11, 17) at 4096 tokens are 38 MB in float16, all 18 layers in float32
450 MB. The chosen layers are renumbered 0, 1, … in the given order; the file's attributes are kept,
n_layers and layer_windows follow the chosen layers, and `subset_of` / `subset_layers` /
`model_n_layers` name the source. Q, K and V only (the attention output, if present, is dropped).

    .venv/bin/python datasets/subset_recording.py IN.h5 OUT.h5 --layers 5,11,17 --dtype float16

Errors (a missing file, a layer out of range, a file that is not a kvsim recording) are one line on
stderr and exit status 2; OUT is written to OUT.tmp first and renamed only when complete.
"""
import argparse
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--layers", required=True, help="comma list of layer indices, e.g. 5,11,17")
    ap.add_argument("--dtype", choices=("float16", "float32"), default="float32")
    a = ap.parse_args(argv)
    import h5py
    import numpy as np

    def fail(msg):
        print(f"subset_recording.py: {msg}", file=sys.stderr)
        sys.exit(2)

    try:
        layers = [int(x) for x in a.layers.split(",") if x.strip()]
    except ValueError:
        fail(f"--layers '{a.layers}': not a comma list of integers")
    if not layers:
        fail("--layers: no layer given")
    if not os.path.exists(a.input):
        fail(f"{a.input}: no such file")
    try:
        src = h5py.File(a.input, "r")
    except OSError as e:
        fail(f"{a.input}: not an HDF5 file ({e})")
    tmp = a.output + ".tmp"
    try:
        copy(src, a, layers, tmp, fail)
    except (KeyError, OSError, ValueError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        fail(f"{a.input}: {e}")
    finally:
        src.close()
    os.replace(tmp, a.output)
    print(f"{a.output}: layers {layers} of {a.input} as {a.dtype}")


def copy(src, a, layers, tmp, fail):
    """The chosen layers of the open recording `src` into the new file `tmp`."""
    import h5py
    import numpy as np

    if "kvsim_schema" not in src.attrs or "n_layers" not in src.attrs:
        fail(f"{a.input}: not a kvsim recording (no kvsim_schema / n_layers attribute)")
    n_layers = int(src.attrs["n_layers"])
    for l in layers:
        if not 0 <= l < n_layers:
            fail(f"--layers: layer {l} is out of range [0, {n_layers}) of {a.input}")
    with h5py.File(tmp, "w") as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        dst.attrs["n_layers"] = np.int64(len(layers))
        if "layer_windows" in src.attrs:
            w = np.asarray(src.attrs["layer_windows"])[layers]
            if w.any():
                dst.attrs["layer_windows"] = w.astype(np.int64)
            else:
                del dst.attrs["layer_windows"]
        dst.attrs["subset_of"] = os.path.basename(a.input)
        dst.attrs["subset_layers"] = np.asarray(layers, dtype=np.int64)
        dst.attrs["model_n_layers"] = np.int64(src.attrs.get("model_n_layers", n_layers))
        for i, l in enumerate(layers):
            g = dst.create_group(f"layer_{i:03d}")
            for t in ("q", "k", "v"):
                x = src[f"layer_{l:03d}/{t}"][()]
                g.create_dataset(t, data=x.astype(a.dtype), chunks=(1, min(x.shape[1], 1024), x.shape[2]),
                                 shuffle=True, compression="gzip", compression_opts=4)


if __name__ == "__main__":
    main()

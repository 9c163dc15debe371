#!/usr/bin/env python3
"""Whether a long recording's first positions are a short recording's (the long path is the short path).

Usage: PYTHONPATH=build/python .venv/bin/python scripts/recording_prefix.py LONG.h5 SHORT.h5 [--tol 1e-5]

SHORT holds m tokens, LONG at least m, both recorded from the start of the same text by the same model (e.g.
`kvsim record --tokens 4096` and `--tokens 16384`). Checked: the token ids of SHORT equal LONG's first m,
then q, k and v of every layer and head over those m positions, as max |Δ| / max |SHORT| per tensor (the
largest difference relative to the reference's largest magnitude). Negative control: LONG shifted by one
position must differ from SHORT by more than 100 × tol, else the check could not have failed. Exit 0 when
every tensor is within tol, 1 when one is not (or the control fails), 2 on bad input (a file kvsim cannot
open, different layers or heads, SHORT longer than LONG).
"""
import argparse
import sys

import numpy as np


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), np.finfo(np.float32).tiny))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("long")
    ap.add_argument("short")
    ap.add_argument("--tol", type=float, default=1e-5, help="largest relative deviation allowed (default 1e-5)")
    a = ap.parse_args(argv)
    try:
        import kvsim
    except ImportError as e:
        print(f"recording_prefix.py: the kvsim Python module is not importable ({e}); set PYTHONPATH=build/python")
        return 2
    try:
        lng, sht = kvsim.Recording(a.long), kvsim.Recording(a.short)
    except kvsim.Error as e:
        print(f"recording_prefix.py: {e}")
        return 2
    keys = ("n_layers", "n_heads", "n_kv_heads", "head_dim")
    if any(lng.meta[k] != sht.meta[k] for k in keys):
        print(f"recording_prefix.py: {a.long} and {a.short} differ in " +
              ", ".join(f"{k} ({lng.meta[k]} vs {sht.meta[k]})" for k in keys if lng.meta[k] != sht.meta[k]))
        return 2
    m, n = sht.meta["n_tokens"], lng.meta["n_tokens"]
    if m > n or m < 2:
        print(f"recording_prefix.py: {a.short} holds {m} tokens and {a.long} {n}: need 2 ≤ short ≤ long")
        return 2
    ok = list(sht.tokens()) == list(lng.tokens()[:m])
    print(f"token ids of the first {m} positions: {'equal' if ok else 'DIFFERENT'}")
    heads = {"q": sht.meta["n_heads"], "k": sht.meta["n_kv_heads"], "v": sht.meta["n_kv_heads"]}
    for t, count in heads.items():
        worst = max(rel(getattr(lng, t)(layer, h)[:m], getattr(sht, t)(layer, h))
                    for layer in range(sht.meta["n_layers"]) for h in range(count))
        ok &= worst <= a.tol
        print(f"{t}: max relative deviation over {sht.meta['n_layers']} layers x {count} heads: {worst:.2e} "
              f"({'within' if worst <= a.tol else 'BEYOND'} {a.tol:g})")
    shifted = rel(lng.k(0, 0)[1:m], sht.k(0, 0)[:m - 1])
    control = shifted > 100 * a.tol
    print(f"negative control, keys one position off: {shifted:.2e} ({'>' if control else 'NOT >'} {100 * a.tol:g})")
    return 0 if ok and control else 1


if __name__ == "__main__":
    sys.exit(main())

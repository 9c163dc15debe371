"""Imported first by every figure script: checks that this Python has what the plots need (numpy,
h5py, matplotlib) and otherwise exits with one line naming the interpreter and the fix."""
import sys

_missing = []
for _mod in ("numpy", "h5py", "matplotlib"):
    try:
        __import__(_mod)
    except ImportError:
        _missing.append(_mod)
if _missing:
    sys.exit(f"error: {sys.executable} lacks {', '.join(_missing)}: the plots need Python 3 with numpy, h5py and "
             "matplotlib (run them with .venv/bin/python after bash scripts/setup.sh)")

"""scripts/recording_prefix.py: a 160-token stories260K recording is the first 160 positions of a 240-token
one (exit 0, every tensor within 1e-5); a recording of other text is not (exit 1); bad input is exit 2."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "recording_prefix.py"


def record(kvsim_bin, shared_data, out, tokens, text="tinystories-sample/tinystories.txt"):
    ckpt, tok = shared_data / "stories260K" / "stories260K.bin", shared_data / "stories260K" / "tok512.bin"
    text = shared_data / text
    for f in (ckpt, tok, text):
        if not f.exists():
            pytest.skip(f"{f} is absent (the real stories260K checkpoint and text)")
    subprocess.run([kvsim_bin, "record", "--checkpoint", str(ckpt), "--tokenizer", str(tok), "--text", str(text),
                    "--tokens", str(tokens), "--out", str(out)], check=True, capture_output=True)
    return out


def prefix(*args):
    import os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env)
    return r.returncode, r.stdout


def test_the_long_path_is_the_short_path(tmp_path, kvsim_bin, shared_data):
    long_ = record(kvsim_bin, shared_data, tmp_path / "long.h5", 240)
    short = record(kvsim_bin, shared_data, tmp_path / "short.h5", 160)
    rc, out = prefix(long_, short)
    assert rc == 0, out
    assert "token ids of the first 160 positions: equal" in out and out.count("within") == 3
    # Negative control: another text's recording is not a prefix (tokens and tensors differ).
    other = record(kvsim_bin, shared_data, tmp_path / "other.h5", 160, "tinyshakespeare/input.txt")
    rc, out = prefix(long_, other)
    assert rc == 1 and "DIFFERENT" in out and "BEYOND" in out, out
    # Bad input: the short one longer than the long one, and a file that is not a recording.
    assert prefix(short, long_)[0] == 2
    (tmp_path / "junk.h5").write_text("not hdf5")
    rc, out = prefix(long_, tmp_path / "junk.h5")
    assert rc == 2 and "junk.h5" in out

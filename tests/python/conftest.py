"""Shared fixtures of the Python API tests (run by tests/python/run_pytest.py under ctest).

Environment: KVSIM_BIN (the kvsim binary, default build/kvsim), KVSIM_SHARED_DATA (the real model
checkpoints, default ../shared/data). Tests that need the stories260K checkpoint skip with the reason
when it is absent."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def kvsim_bin():
    return os.environ.get("KVSIM_BIN", str(ROOT / "build" / "kvsim"))


@pytest.fixture(scope="session")
def shared_data():
    return Path(os.environ.get("KVSIM_SHARED_DATA", str(ROOT.parent / "shared" / "data")))


@pytest.fixture(scope="session")
def stories_recording(tmp_path_factory, kvsim_bin, shared_data):
    """stories260K (8 query heads, 4 KV heads, head_dim 8) teacher-forced on 160 TinyStories tokens."""
    ckpt = shared_data / "stories260K" / "stories260K.bin"
    tok = shared_data / "stories260K" / "tok512.bin"
    text = shared_data / "tinystories-sample" / "tinystories.txt"
    for f in (ckpt, tok, text):
        if not f.exists():
            pytest.skip(f"{f} is absent (the real stories260K checkpoint and text)")
    out = tmp_path_factory.mktemp("rec") / "stories260k.h5"
    subprocess.run([kvsim_bin, "record", "--checkpoint", str(ckpt), "--tokenizer", str(tok), "--text", str(text),
                    "--tokens", "160", "--out", str(out)], check=True, capture_output=True)
    return out


@pytest.fixture
def scratch_root(tmp_path):
    """A scratch folder laid out like the repository root for running a doc's commands as written:
    results/recordings/ empty, models/ linked to the checkout's. The docs test runs the same
    commands in the root itself, and ctest -j may run both at once, so the examples never write there."""
    work = tmp_path / "root"
    (work / "results" / "recordings").mkdir(parents=True)
    (work / "models").symlink_to(ROOT / "models")
    return work


@pytest.fixture
def reference_policies():
    """Registers the Python twins of window and h2o (kvsim.examples)."""
    import kvsim
    import kvsim.examples as rp
    kvsim.register_policy("py_window", rp.PyWindow)
    kvsim.register_policy("py_h2o", rp.PyH2O)
    return rp

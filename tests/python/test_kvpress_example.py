"""docs/kvpress.md's complete example runs as written: its ```sh recording block, then its ```python
block, in a scratch copy of the root's layout (models/ linked); the printed table has both presses and kvsim's h2o with finite errors.
And `python -m kvsim.kvpress` writes a press file, or exits 2 with one line naming the bad press,
argument or file. SKIPPED without the SmolLM2 model file or kvpress (tests/cli/setup_check.py fails the suite in that case
after setup)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fenced(text, lang):
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, flags=re.S | re.M)


def test_docs_kvpress_example_runs(shared_data, kvsim_bin, tmp_path, scratch_root):
    if not (ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists():
        pytest.skip("models/SmolLM2-135M-Instruct.Q4_1.gguf missing (bash scripts/setup.sh)")
    pytest.importorskip("kvpress")
    doc = (ROOT / "docs" / "kvpress.md").read_text()
    (record,) = [b for b in fenced(doc, "sh") if "kvsim record" in b]
    (code,) = [b for b in fenced(doc, "python") if "kvpress_budgets" not in b]  # the complete example
    cmd = record.strip().replace("./build/kvsim", kvsim_bin).replace("../shared/data", str(shared_data))
    work = scratch_root
    subprocess.run(cmd, shell=True, check=True, cwd=work, capture_output=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(Path(kvsim_bin).parent / "python"), os.environ.get("PYTHONPATH", "")])}
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    table = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[1:] if line.strip()}
    for label in ("SnapKVPress", "ExpectedAttentionPress"):
        rel_err, kept_mass, cache = (float(x) for x in table[label])
        assert 0 < rel_err < 1 and 0.5 < kept_mass < 1 and 128 < cache < 192  # 128 kept + the decoded tokens
    assert "kvsim" in out.stdout


def test_docs_budgets_press_example_runs(kvsim_bin):
    """docs/kvpress.md's kvsim.kvpress_budgets block runs from the repository root on the shipped budgets files: per
    (layer, KV head) counts averaging int(985 · 0.25) for SmolLM2's 30 × 3 caches, a BudgetsPress around
    SnapKVPress holding them, and kvpress's PerLayerCompressionPress with one ratio per layer."""
    kvpress = pytest.importorskip("kvpress")
    doc = (ROOT / "docs" / "kvpress.md").read_text()
    (code,) = [b for b in fenced(doc, "python") if "kvpress_budgets" in b]
    sys.path.insert(0, str(Path(kvsim_bin).parent / "python"))
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        scope = {}
        exec(code, scope)  # noqa: S102 - the documentation's own example
    finally:
        os.chdir(cwd)
    counts = scope["counts"]
    assert len(counts) == 30 and all(len(row) == 3 for row in counts)
    assert sum(map(sum, counts)) == 90 * int(985 * 0.25) and len({b for row in counts for b in row}) > 1
    assert isinstance(scope["press"], kvpress.PerLayerCompressionPress) and len(scope["press"].compression_ratios) == 30


def _cli(kvsim_bin, *args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(Path(kvsim_bin).parent / "python"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kvsim.kvpress", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def test_kvpress_cli_writes_a_press_file_and_names_bad_input(shared_data, kvsim_bin, tmp_path):
    """`python -m kvsim.kvpress`: a press file press_replay reads, or exit 2 with one line naming the fault."""
    gguf = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.exists():
        pytest.skip("models/SmolLM2-135M-Instruct.Q4_1.gguf missing (bash scripts/setup.sh)")
    pytest.importorskip("kvpress")
    h5py = pytest.importorskip("h5py")
    text = shared_data / "tinyshakespeare" / "input.txt"
    out = tmp_path / "snap.h5"
    ok = _cli(kvsim_bin, "SnapKVPress", "--model", gguf, "--text", text, "--tokens", 64, "--ratio", 0.5,
              "--set", "window_size=16", "--out", out)
    assert ok.returncode == 0, ok.stderr[-2000:]
    with h5py.File(out, "r") as f:
        assert f.attrs["press"] == "SnapKVPress" and f.attrs["prompt"] == 64 and f.attrs["ratio"] == 0.5
        kept = [f[f"layer_{l:03d}/kv_head_{h:02d}"][()] for l in range(30) for h in range(3)]
    assert all(len(k) == 32 and k.min() >= 0 and k.max() < 64 for k in kept)
    assert any(not (k == kept[0]).all() for k in kept)  # a real selection: the heads disagree somewhere

    cases = [(("NoSuchPress",), "NoSuchPress"),
             (("SnapKVPress", "--set", "no_such_argument=1"), "no_such_argument"),
             (("SnapKVPress", "--ratio", 1.5), "SnapKVPress"),
             (("SnapKVPress", "--model", tmp_path / "absent.gguf"), "absent.gguf")]
    for args, named in cases:
        base = ["--model", gguf, "--text", text, "--tokens", 64, "--out", tmp_path / "bad.h5"]
        if "--model" in args:
            base = base[2:]
        r = _cli(kvsim_bin, *args, *base)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and lines[0].startswith("kvsim.kvpress: error:"), (args, r.stderr)
        assert not (tmp_path / "bad.h5").exists()

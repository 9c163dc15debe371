"""docs/kvpress.md's complete example runs as written: its ```sh recording block, then its ```python
block, from the repository root; the printed table has both presses and kvsim's h2o with finite errors.
SKIPPED without the SmolLM2 model file or kvpress (tests/setup_check.py fails the suite in that case
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


def test_docs_kvpress_example_runs(shared_data, kvsim_bin, tmp_path):
    if not (ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists():
        pytest.skip("models/SmolLM2-135M-Instruct.Q4_1.gguf missing (bash scripts/setup.sh)")
    pytest.importorskip("kvpress")
    doc = (ROOT / "docs" / "kvpress.md").read_text()
    (record,) = [b for b in fenced(doc, "sh") if "kvsim record" in b]
    (code,) = fenced(doc, "python")
    cmd = record.strip().replace("./build/kvsim", kvsim_bin).replace("../shared/data", str(shared_data))
    subprocess.run(cmd, shell=True, check=True, cwd=ROOT, capture_output=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(Path(kvsim_bin).parent / "python"), os.environ.get("PYTHONPATH", "")])}
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    table = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[1:] if line.strip()}
    for label in ("SnapKVPress", "ExpectedAttentionPress"):
        rel_err, kept_mass, cache = (float(x) for x in table[label])
        assert 0 < rel_err < 1 and 0.5 < kept_mass < 1 and 128 < cache < 192  # 128 kept + the decoded tokens
    assert "kvsim" in out.stdout

"""docs/python.md's example runs as written: its ```sh recording block,
then its ```python blocks, in a scratch directory laid out like the repository root (so that the
docs test, which runs the same recording command in the root, never races it under ctest -j); the
plot is written and the printed table has every policy. SKIPPED without stories260K."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fenced(text, lang):
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, flags=re.S | re.M)


def test_docs_python_example_runs(stories_recording, shared_data, kvsim_bin, tmp_path, scratch_root):
    doc = (ROOT / "docs" / "python.md").read_text()
    record = [b for b in fenced(doc, "sh") if "kvsim record" in b]
    code = fenced(doc, "python")
    assert len(record) == 1 and len(code) == 1 and "register_policy" in code[0]
    cmd = record[0].strip().replace("./build/kvsim", kvsim_bin).replace("../shared/data", str(shared_data))
    work = scratch_root
    subprocess.run(cmd, shell=True, check=True, cwd=work, capture_output=True)
    png = work / "results" / "python_example.png"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(kvsim_bin).parent / "python"), os.environ.get("PYTHONPATH", "")])}
    script = tmp_path / "example.py"
    script.write_text(code[0])
    out = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for label in ("window(memory=0.2)", "h2o(memory=0.2)", "decayed_h2o(gamma=0.5,memory=0.2)",
                  "decayed_h2o(gamma=0.9,memory=0.2)"):
        assert label in out.stdout
    assert png.stat().st_size > 10000

"""kvsim.compare_torch (docs/performance.md, "Beside PyTorch"): its kvsim exact pass equals a float64
reference with the GQA head mapping, its PyTorch caches answer what kvsim's caches answer (and a wrong
cache is caught), its JSON holds every row at every thread count, and bad input is named."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvsim  # noqa: E402
from kvsim import _kvsim, compare_torch as ct  # noqa: E402


def small_stream(n=96, d=16):
    rec = kvsim.synth("heavy_hitter", n=n, d=d, layers=1, heads=ct.HEADS, kv_heads=ct.KV_HEADS, seed=1)  # kvsim_policies runs seed 1
    q = np.stack([rec.q(0, h) for h in range(ct.HEADS)])
    k = np.stack([rec.k(0, h) for h in range(ct.KV_HEADS)])
    v = np.stack([rec.v(0, h) for h in range(ct.KV_HEADS)])
    return q, k, v, rec.meta["softmax_scale"]


def test_exact_causal_equals_float64_attention_with_the_gqa_mapping():
    q, k, v, scale = small_stream()
    for threads in (1, 3):
        z, seconds = _kvsim._exact_causal(q, k, v, scale, threads)
        assert z.shape == q.shape and seconds > 0
        err = ct.rel_err_at(q, k, v, scale, z, list(range(1, q.shape[1] + 1)))
        assert err.max() < 1e-5
    # Negative control: the KV heads swapped (a wrong group mapping) is far off.
    swapped = ct.rel_err_at(q, k[::-1].copy(), v[::-1].copy(), scale, z, list(range(2, q.shape[1] + 1)))
    assert swapped.mean() > 0.05


def test_exact_causal_names_bad_shapes():
    q, k, v, scale = small_stream()
    with pytest.raises(kvsim.Error, match="_exact_causal: shapes"):
        _kvsim._exact_causal(q[:3], k, v, scale, 1)  # 3 query heads over 2 KV heads
    with pytest.raises(kvsim.Error, match=r"\[heads, n, head_dim\]"):
        _kvsim._exact_causal(q[0], k, v, scale, 1)


def test_torch_caches_answer_what_kvsim_caches_answer():
    n, d, budget = 96, 16, 24
    q, k, v, scale = small_stream(n, d)
    _, rows = ct.kvsim_policies(n, d, budget, threads=1)
    tq4 = torch.from_numpy(q).view(ct.KV_HEADS, ct.HEADS // ct.KV_HEADS, n, d)
    tk, tv = torch.from_numpy(k), torch.from_numpy(v)
    steps = list(range(1, n + 1))

    def diff(z, name):
        return ct.rel_err_row_diff(q, k, v, scale, z.reshape(ct.HEADS, n, d).numpy(), rows, name, steps)

    assert diff(ct.torch_banded(torch, tq4, tk, tv, scale, budget, 0, block=32), "window") < 1e-5
    assert diff(ct.torch_banded(torch, tq4, tk, tv, scale, budget, ct.SINK, block=32), "sink") < 1e-5
    # Negative controls: a window one token short, and the sink cache without its sinks.
    assert diff(ct.torch_banded(torch, tq4, tk, tv, scale, budget - 1, 0, block=32), "window") > 1e-3
    assert diff(ct.torch_banded(torch, tq4, tk, tv, scale, budget, 0, block=32), "sink") > 1e-3
    # The step loops hold at most `budget` tokens; before the cache fills they are exact (rel_err 0).
    for name in ("h2o", "tova"):
        z = ct.torch_step_loop(torch, tq4, tk, tv, scale, budget, name).reshape(ct.HEADS, n, d).numpy()
        err = ct.rel_err_at(q, k, v, scale, z, steps)
        assert err[:, :budget].max() < 1e-5 and err[:, budget + 8:].mean() > 1e-3


def test_torch_blocked_h2o_answers_what_its_step_loop_answers():
    n, d, budget = 96, 16, 24
    q, k, v, scale = small_stream(n, d)
    tq4 = torch.from_numpy(q).view(ct.KV_HEADS, ct.HEADS // ct.KV_HEADS, n, d)
    tk, tv = torch.from_numpy(k), torch.from_numpy(v)
    loop = ct.torch_step_loop(torch, tq4, tk, tv, scale, budget, "h2o").reshape(ct.HEADS, n, d).numpy()

    def worst(**kw):
        z = ct.torch_blocked_h2o(torch, tq4, tk, tv, scale, budget, **kw).reshape(ct.HEADS, n, d).numpy()
        return float(np.max(np.linalg.norm(z - loop, axis=-1) / np.linalg.norm(loop, axis=-1)))

    for block in (1, 7, 32, 128):  # one step, blocks ending inside and after the fill, the whole stream
        assert worst(block=block) < 1e-5, block
    # Negative control: a slot taken over inside a block that keeps the evicted token's logit.
    assert worst(block=32, masking=False) > 1e-3


def test_the_json_holds_every_row_and_bad_threads_are_named(tmp_path, capsys):
    out = tmp_path / "ct.json"
    assert ct.main(["--n", "256", "--d", "32", "--threads", "1,2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["torch_version"] == torch.__version__ and report["shape"]["n"] == 256
    names = {"exact causal attention", "window (banded)", "sink (banded)", "h2o (step loop)", "tova (step loop)",
             "h2o (blocked)"}
    for threads in (1, 2):
        rows = [r for r in report["rows"] if r["threads"] == threads]
        assert {r["name"] for r in rows} == names
        for r in rows:
            assert r["kvsim_s"] > 0 and r["torch_s"] > 0 and r["ratio"] == pytest.approx(r["torch_s"] / r["kvsim_s"])
    assert all(c["exact_max_rel_diff"] < 1e-4 and c["h2o_blocked_steps_off"] <= 0.01 for c in report["checks"])
    assert ct.main(["--threads", "0"]) == 2
    assert "--threads '0'" in capsys.readouterr().out

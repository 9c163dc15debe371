"""The Python API against the CLI and h5py: configs, results, recordings, errors."""
import subprocess
import tomllib

import h5py
import numpy as np
import pandas as pd
import pytest

import kvsim

CONFIG = {
    "name": "api_test",
    "seed": 3,
    "data": {"synthetic": "heavy_hitter", "n": 96, "d": 8, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2},
    "eval": {"every": 4},
    "policy": [{"name": "window", "memory": [16, 32]}, {"name": "h2o", "memory": 16}, {"name": "subgen", "memory": 24}],
}
TIMING = ["policy_ns"]  # the one metric that is a measurement, not a function of the inputs


def numbers(df):
    return df.drop(columns=[c for c in TIMING if c in df.columns]).reset_index(drop=True)


def stats_without_timing(df):
    return df[~df.metric.isin(TIMING)].reset_index(drop=True)


def test_version_matches_the_cli(kvsim_bin):
    out = subprocess.run([kvsim_bin, "--version"], capture_output=True, text=True, check=True).stdout
    assert kvsim.__version__ and kvsim.__version__ in out


def test_dict_config_equals_its_toml_twin(tmp_path):
    text = kvsim.to_toml(CONFIG)
    assert tomllib.loads(text) == CONFIG  # the dict → TOML writer round-trips
    path = tmp_path / "twin.toml"
    path.write_text(text)
    a, b = kvsim.run(CONFIG), kvsim.run(path)
    assert [p["label"] for p in a.policies] == ["window(memory=16)", "window(memory=32)", "h2o(memory=16)", "subgen(memory=24)"]
    pd.testing.assert_frame_equal(numbers(a.rows()), numbers(b.rows()))
    assert a.config == b.config and a.config["data"]["n"] == 96
    # Negative control: another seed gives other numbers (the comparison is not vacuous).
    c = kvsim.run({**CONFIG, "seed": 4})
    assert not numbers(a.rows()).equals(numbers(c.rows()))


def test_rows_are_long_form_with_every_metric():
    r = kvsim.run(CONFIG)
    rows = r.rows()
    assert list(rows.columns[:5]) == ["policy", "label", "layer", "head", "step"]
    assert [m["name"] for m in kvsim.metrics() if m["name"] in rows.columns] == r.metrics
    steps = sorted(set(range(1, 97, 4)) | {96})  # every 4th step from step 1, and the last
    per_policy = 2 * 4 * len(steps)  # layers × query heads × steps
    assert len(rows) == 4 * per_policy
    one = r.rows("h2o")
    assert len(one) == per_policy and set(one.policy) == {"h2o"}
    assert sorted(one[(one.layer == 1) & (one["head"] == 3)].step) == steps
    assert one.kept_mass.between(0, 1 + 1e-12).all() and r.rows("subgen").kept_mass.isna().all()
    assert len(r.rows(["window(memory=16)", "h2o"])) == 2 * per_policy
    with pytest.raises(kvsim.Error, match="no policy 'tova'"):
        r.rows("tova")


def test_out_writes_the_cli_files(tmp_path, kvsim_bin):
    cfg = tmp_path / "c.toml"
    cfg.write_text(kvsim.to_toml(CONFIG))
    r = kvsim.run(cfg, out=tmp_path / "py", threads=1)
    subprocess.run([kvsim_bin, "run", str(cfg), "--out", str(tmp_path / "cli"), "--quiet"], check=True)
    for name in ("summary.csv", "cells.csv"):
        py, cli = pd.read_csv(tmp_path / "py" / name), pd.read_csv(tmp_path / "cli" / name)
        pd.testing.assert_frame_equal(stats_without_timing(py), stats_without_timing(cli))
    pd.testing.assert_frame_equal(stats_without_timing(r.summary), stats_without_timing(pd.read_csv(tmp_path / "cli" / "summary.csv")))
    with h5py.File(tmp_path / "cli" / "results.h5") as f:
        g = f["policy_02"]
        assert g.attrs["label"] == "h2o(memory=16)"
        rows = r.rows("h2o")
        for col in ("layer", "head", "step", "rel_err", "eps_spectral", "kept_mass"):
            np.testing.assert_array_equal(g[col][:], rows[col].to_numpy())


def test_overrides_dict_and_list_match_the_cli_set(tmp_path, kvsim_bin):
    cfg = tmp_path / "c.toml"
    cfg.write_text(kvsim.to_toml(CONFIG))
    a = kvsim.run(cfg, overrides={"eval.every": 8, "policy.0.memory": 20, "data.layers": [1]})
    b = kvsim.run(cfg, overrides=["eval.every=8", "policy.0.memory=20", "data.layers=[1]"])
    pd.testing.assert_frame_equal(numbers(a.rows()), numbers(b.rows()))
    assert set(a.rows().layer) == {1} and a.policies[0]["params"]["memory"] == 20
    subprocess.run([kvsim_bin, "run", str(cfg), "--out", str(tmp_path / "cli"), "--quiet", "--set", "eval.every=8",
                    "--set", "policy.0.memory=20", "--set", "data.layers=[1]"], check=True)
    pd.testing.assert_frame_equal(stats_without_timing(a.summary),
                                  stats_without_timing(pd.read_csv(tmp_path / "cli" / "summary.csv")))


def test_several_sequences_give_the_cli_intervals(tmp_path, kvsim_bin):
    cfg = tmp_path / "c.toml"
    cfg.write_text(kvsim.to_toml({**CONFIG, "data": {**CONFIG["data"], "sequences": 3}}))
    r = kvsim.run(cfg, threads=2)
    assert r.sequences == 3 and sorted(set(r.rows().sequence)) == [0, 1, 2]
    subprocess.run([kvsim_bin, "run", str(cfg), "--out", str(tmp_path / "cli"), "--quiet"], check=True)
    cli = pd.read_csv(tmp_path / "cli" / "sequences.csv")
    pd.testing.assert_frame_equal(stats_without_timing(r.across_sequences), stats_without_timing(cli))
    r.save(tmp_path / "py")
    assert (tmp_path / "py" / "seq_02" / "results.h5").exists() and (tmp_path / "py" / "sequences.csv").exists()
    # Sequence 0 is the one-sequence run (the same seed); the others are new draws.
    one = kvsim.run(cfg, overrides={"data.sequences": 1})
    rows = numbers(r.rows())
    first = rows[rows.sequence == 0].drop(columns="sequence").reset_index(drop=True)
    pd.testing.assert_frame_equal(first, numbers(one.rows()))
    assert not rows[rows.sequence == 1].rel_err.reset_index(drop=True).equals(first.rel_err)


def cli_error(kvsim_bin, args):
    p = subprocess.run([kvsim_bin, *args], capture_output=True, text=True)
    assert p.returncode != 0
    return p.stderr.strip().removeprefix("kvsim: error: ")


@pytest.mark.parametrize("broken", [
    {"policy": [{"name": "windw", "budget": 4}]},
    {"policy": [{"name": "window", "budgt": 4}]},
    {"policy": [{"name": "window", "budget": 0}]},
    {"eval": {"gqa": "per_head"}},
    {"data": {"synthetic": "heavy_hitter", "n": -5}},
    {"data": {"path": "no/such/recording.h5"}},
    {"colour": "blue"},
])
def test_bad_configs_raise_the_cli_message(tmp_path, kvsim_bin, broken):
    cfg = {**CONFIG, **broken}
    path = tmp_path / "bad.toml"
    path.write_text(kvsim.to_toml(cfg))
    with pytest.raises(kvsim.Error) as e:
        kvsim.run(path, out=tmp_path / "out")
    assert str(e.value) == cli_error(kvsim_bin, ["run", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    assert not (tmp_path / "out").exists()
    with pytest.raises(kvsim.Error):
        kvsim.run(cfg)  # the dict form fails alike


def test_bad_overrides_and_arguments_raise():
    with pytest.raises(kvsim.Error, match="unknown key .evry. in \\[eval\\]"):
        kvsim.run(CONFIG, overrides={"eval.evry": 2})
    with pytest.raises(TypeError):
        kvsim.run(42)
    with pytest.raises(kvsim.Error, match="no/such.h5"):
        kvsim.Recording("no/such.h5")


def test_recording_arrays_equal_h5py(tmp_path):
    path = tmp_path / "syn.h5"
    rec = kvsim.synth("clustered", n=80, d=16, layers=2, heads=4, kv_heads=2, seed=7, path=path, cluster_gamma=0.3)
    mem = kvsim.synth("clustered", n=80, d=16, layers=2, heads=4, kv_heads=2, seed=7, cluster_gamma=0.3)
    assert rec.meta == mem.meta and rec.meta["n_kv_heads"] == 2 and rec.path == str(path) and mem.path is None
    with h5py.File(path) as f:
        for layer in range(2):
            g = f[f"layer_{layer:03d}"]
            for h in range(4):
                q = rec.q(layer, h)
                assert q.dtype == np.float32 and q.shape == (80, 16)
                np.testing.assert_array_equal(q, g["q"][h])
                np.testing.assert_array_equal(mem.q(layer, h), q)
            for h in range(2):
                np.testing.assert_array_equal(rec.k(layer, h), g["k"][h])
                np.testing.assert_array_equal(rec.v(layer, h), g["v"][h])
    other = kvsim.synth("clustered", n=80, d=16, layers=2, heads=4, kv_heads=2, seed=8, cluster_gamma=0.3)
    assert not np.array_equal(other.k(0, 0), rec.k(0, 0))  # negative control: the seed matters
    with pytest.raises(kvsim.Error, match="kv head 2 out of range"):
        rec.k(0, 2)
    with pytest.raises(kvsim.Error, match="layer 2 out of range"):
        rec.q(2, 0)
    with pytest.raises(kvsim.Error, match="unknown parameter 'gamma'"):
        kvsim.synth("clustered", gamma=0.3)
    with pytest.raises(kvsim.Error, match="preset"):
        kvsim.synth("spiky")


def test_policies_come_from_the_registry():
    pols = {p["name"]: p for p in kvsim.policies()}
    for name in ("exact", "window", "h2o", "subgen", "snapkv", "quest", "kivi"):
        assert name in pols and pols[name]["source"]
    h2o = {q["name"]: q for q in pols["h2o"]["params"]}
    assert h2o["heavy_ratio"]["default"] == "0.5" and h2o["budget"]["kind"] == "tokens"
    assert all(m["unit"] and m["source"] for m in kvsim.metrics())


KEPT_CONFIG = {
    "name": "kept", "seed": 4,
    "data": {"synthetic": "heavy_hitter", "n": 80, "d": 8, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2},
    "eval": {"every": 13},
    "policy": [{"name": "window", "budget": 12}, {"name": "knorm", "budget": 10}, {"name": "h2o", "budget": 16},
               {"name": "subgen", "memory": 24}, {"name": "oracle_topk", "budget": 8}],
}


def test_kept_tokens_follow_each_policys_definition():
    rec = kvsim.synth("heavy_hitter", n=80, d=8, layers=2, heads=4, kv_heads=2, seed=4)
    for t in (5, 40, 80):
        (w,) = kvsim.kept_tokens(KEPT_CONFIG, layer=1, kv_head=0, step=t, policy=0)
        assert w.tolist() == list(range(max(0, t - 12), t))  # window: the last B tokens
        # knorm: token t−1 joins after the largest-norm key leaves, so the B − 1 lowest norms of 0..t−2 and t−1
        (k,) = kvsim.kept_tokens(KEPT_CONFIG, layer=1, kv_head=0, step=t, policy=1)
        norms = np.linalg.norm(rec.k(1, 0)[: t - 1].astype(np.float64), axis=1)
        expect = sorted(np.argsort(norms, kind="stable")[:9].tolist() + [t - 1]) if t > 10 else list(range(t))
        assert k.tolist() == expect
    per_query = kvsim.kept_tokens(KEPT_CONFIG, layer=0, kv_head=1, step=40, policy=2, overrides={"eval.gqa": "query_head"})
    assert len(per_query) == 2 and all(len(s) == 16 for s in per_query)


def test_kept_tokens_are_the_cache_the_engine_measures():
    # kept_mass at an evaluated step = the exact attention mass of the kept set: the same replay.
    res = kvsim.run(KEPT_CONFIG | {"policy": [KEPT_CONFIG["policy"][2]]})
    rows = res.rows()
    rec = kvsim.synth("heavy_hitter", n=80, d=8, layers=2, heads=4, kv_heads=2, seed=4)
    scale = rec.meta["softmax_scale"]
    for t in (14, 53, 80):
        (kept,) = kvsim.kept_tokens(KEPT_CONFIG, layer=1, kv_head=1, step=t, policy=2)
        for head in (2, 3):
            logits = rec.k(1, 1)[:t].astype(np.float64) @ (rec.q(1, head)[t - 1].astype(np.float64) * scale)
            a = np.exp(logits - logits.max())
            a /= a.sum()
            got = rows[(rows["layer"] == 1) & (rows["head"] == head) & (rows["step"] == t)]["kept_mass"].item()
            assert got == pytest.approx(a[kept].sum(), abs=1e-12)
            other = np.setdiff1d(np.arange(t), kept)[: len(kept)]  # negative control: another set of that size
            assert abs(a[other].sum() - got) > 1e-6


def test_kept_tokens_refuse_what_has_no_kept_set():
    with pytest.raises(kvsim.Error, match="answers without a kept token set"):
        kvsim.kept_tokens(KEPT_CONFIG, layer=0, kv_head=0, step=30, policy=3)
    with pytest.raises(kvsim.Error, match="non-causal oracle"):
        kvsim.kept_tokens(KEPT_CONFIG, layer=0, kv_head=0, step=30, policy=4)
    with pytest.raises(kvsim.Error, match=r"step 81 is outside \[1, 80\]"):
        kvsim.kept_tokens(KEPT_CONFIG, layer=0, kv_head=0, step=81)
    with pytest.raises(kvsim.Error, match="KV head 2 is out of range"):
        kvsim.kept_tokens(KEPT_CONFIG, layer=0, kv_head=2, step=30)


def test_keydiff_streaming_keeps_the_keys_least_like_the_anchor():
    # KeyDiff with blocks of one token (Algorithm 1): token t joins; if B + 1 are cached, the older key with
    # the highest cosine to the mean unit key of all B + 1 leaves. Simulated here from the keys alone.
    cfg = {"data": {"synthetic": "clustered", "n": 60, "d": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1},
           "seed": 9, "policy": [{"name": "keydiff", "budget": 12}, {"name": "window", "budget": 12}]}
    keys = kvsim.synth("clustered", n=60, d=8, layers=1, heads=2, kv_heads=1, seed=9).k(0, 0).astype(np.float64)
    unit = keys / np.linalg.norm(keys, axis=1, keepdims=True)
    cache = []
    for t in range(60):
        if len(cache) == 12:
            anchor = unit[cache].sum(0) + unit[t]
            cache.remove(cache[int(np.argmax(unit[cache] @ anchor))])
        cache.append(t)
        if t + 1 in (12, 13, 40, 60):
            (got,) = kvsim.kept_tokens(cfg, layer=0, kv_head=0, step=t + 1)
            assert got.tolist() == sorted(cache)
    (window,) = kvsim.kept_tokens(cfg, layer=0, kv_head=0, step=60, policy=1)
    assert window.tolist() != sorted(cache)  # control: not merely the most recent tokens


def test_prefill_logits_are_the_one_token_paths_last_rows(shared_data):
    """Model.prefill_logits (the batched prefill `kvsim record` runs) keeps the last rows of
    Model.logits (the one-token path); one row off disagrees; `last` out of range raises kvsim.Error."""
    import numpy as np
    from kvsim.model import Model
    ckpt, tok = shared_data / "stories260K" / "stories260K.bin", shared_data / "stories260K" / "tok512.bin"
    if not ckpt.exists():
        pytest.skip(f"{ckpt} is absent (the real stories260K checkpoint)")
    m = Model(ckpt, tok)
    ids = [m.bos_id] + m.encode("Once upon a time there was a little girl who liked to play")
    full, tail = m.logits(ids), m.prefill_logits(ids, last=5, threads=2)
    assert tail.shape == (5, full.shape[1])
    assert np.abs(tail - full[-5:]).max() <= 1e-5 * np.abs(full).max()
    assert np.abs(tail[1:] - full[-5:-1]).max() > 1e-2 * np.abs(full).max()
    assert np.array_equal(m.prefill_logits(ids, threads=1)[-5:], tail)
    for bad in (0, len(ids) + 1):
        with pytest.raises(kvsim.Error, match=f"last = {bad} is outside"):
            m.prefill_logits(ids, last=bad)

"""Policies written in Python, measured by the C++ engine."""
import numpy as np
import pandas as pd
import pytest

import kvsim
import kvsim.examples as rp


def synthetic(gqa, policies, n=120, closed_form="per_step", stepping="per_step"):
    # The Python twins step their caches like the built-ins' per-step replay; the default blocked
    # replays (closed-form caches: window, sink; block steppers: h2o, ...) answer the same within 1e-12
    # (checked below).
    return {"name": "py_policies", "seed": 5,
            "data": {"synthetic": "heavy_hitter", "n": n, "d": 8, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2},
            "eval": {"gqa": gqa, "every": 3, "closed_form": closed_form, "stepping": stepping}, "policy": policies}


def metric_rows(res, policy):
    return res.rows(policy).drop(columns=["policy", "label", "policy_ns"]).reset_index(drop=True)


@pytest.mark.parametrize("gqa", ["kv_head", "query_head"])
def test_python_twins_equal_the_builtins_bit_for_bit(reference_policies, gqa):
    res = kvsim.run(synthetic(gqa, [{"name": n, "memory": 24} for n in ("window", "py_window", "h2o", "py_h2o")]))
    for builtin in ("window", "h2o"):
        a, b = metric_rows(res, builtin), metric_rows(res, "py_" + builtin)
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        assert a.kept_mass.notna().all() and (a.cache_tokens <= 24).all()
    # The built-in window's blocked replay (banded GEMMs): the same rows up to rounding.
    blocked = kvsim.run(synthetic(gqa, [{"name": n, "memory": 24} for n in ("window", "h2o")], closed_form="blocked",
                                  stepping="blocked"))
    for builtin in ("window", "h2o"):
        a, b = metric_rows(blocked, builtin), metric_rows(res, "py_" + builtin)
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=0, atol=1e-12)


class NewestTieH2O(rp.PyH2O):
    """Negative control: H2O scoring by the attention's square (a different rule the test must tell
    apart from the built-in's)."""

    def attend(self, t, q):
        answer, p = self.store.answer(q)
        self.score[:p.shape[0]] += (p ** 2).mean(axis=1)
        return answer


def test_a_different_rule_gives_different_rows(reference_policies):
    kvsim.register_policy("py_h2o_variant", NewestTieH2O)
    res = kvsim.run(synthetic("kv_head", [{"name": "h2o", "memory": 24}, {"name": "py_h2o_variant", "memory": 24}]))
    a, b = metric_rows(res, "h2o"), metric_rows(res, "py_h2o_variant")
    assert not a.equals(b)
    assert (a.rel_err != b.rel_err).any()


def test_results_are_identical_at_any_thread_count(reference_policies):
    cfg = synthetic("kv_head", [{"name": "py_h2o", "memory": 0.2}, {"name": "tova", "memory": 0.2}])
    one, two = kvsim.run(cfg, threads=1), kvsim.run(cfg, threads=2)
    pd.testing.assert_frame_equal(one.rows().drop(columns="policy_ns"), two.rows().drop(columns="policy_ns"))


class Broken(kvsim.Policy):
    """A policy that fails in a configurable way."""

    params = {"mode": kvsim.Param("string", "raise", "how to fail", "raise|shape|kept|twice|hoard|fine"),
              "budget": kvsim.Param("tokens", 8, "tokens kept")}
    memory = "budget"

    def __init__(self, stream, mode, budget):
        super().__init__(stream)
        self.mode, self.d, self.n, self.budget = mode, stream.head_dim, 0, budget

    def observe(self, i, k, v):
        self.n = i + 1

    def attend(self, t, q):
        if self.mode == "raise":
            raise ValueError("no answer today")
        if self.mode == "shape":
            return kvsim.Answer(np.zeros(self.d + 1))
        if self.mode == "kept":
            return kvsim.Answer(np.zeros((q.shape[0], self.d)), kept=[t])
        if self.mode == "twice":
            return kvsim.Answer(np.zeros((q.shape[0], self.d)), kept=[0, 0])
        return kvsim.Answer(np.zeros((q.shape[0], self.d)))

    def cache_tokens(self):
        return self.n if self.mode == "hoard" else min(self.n, self.budget)


@pytest.mark.parametrize("mode,message", [
    ("raise", r"policy 'broken': ValueError: no answer today \(.*test_policies.py:\d+ in attend\)"),
    ("shape", r"policy 'broken': attend\(\) answer z has the wrong shape"),
    ("kept", r"policy 'broken': attend\(\) answer kept holds token \d+, outside the \d+ observed"),
    ("twice", r"policy 'broken': attend\(\) answer kept holds token 0 twice"),
    ("hoard", r"memory"),
])
def test_policy_errors_raise_kvsim_error(mode, message):
    kvsim.register_policy("broken", Broken)
    with pytest.raises(kvsim.Error, match=message):
        kvsim.run(synthetic("kv_head", [{"name": "broken", "mode": mode, "memory": 8}], n=40))


def test_parameters_are_checked_like_builtins():
    kvsim.register_policy("broken", Broken)
    with pytest.raises(kvsim.Error, match="unknown parameter|not used|budgt"):
        kvsim.run(synthetic("kv_head", [{"name": "broken", "budgt": 3}], n=40))
    with pytest.raises(kvsim.Error, match="budget"):
        kvsim.run(synthetic("kv_head", [{"name": "broken", "budget": 4, "memory": 8}], n=40))
    kvsim.register_policy("py_window", rp.PyWindow)
    with pytest.raises(kvsim.Error, match="policy 'py_window': missing parameter 'budget'"):
        kvsim.run(synthetic("kv_head", [{"name": "py_window"}], n=40))
    ok = kvsim.run(synthetic("kv_head", [{"name": "broken", "mode": "fine"}], n=40))
    assert (ok.rows().cache_tokens <= 8).all()
    info = {p["name"]: p for p in kvsim.policies()}["broken"]
    assert info["summary"] == "A policy that fails in a configurable way." and info["gpu"].startswith("no")
    assert [(q["name"], q["default"]) for q in info["params"]] == [("mode", "raise"), ("budget", "8")]
    # The declared range is checked as for the built-ins (and shown by kvsim.policies()).
    assert info["params"][0]["range"] == "raise|shape|kept|twice|hoard|fine"
    with pytest.raises(kvsim.Error, match="parameter 'mode' must be one of raise,shape"):
        kvsim.run(synthetic("kv_head", [{"name": "broken", "mode": "rais"}], n=40))
    h2o = {p["name"]: p for p in kvsim.policies()}["h2o"]
    assert {q["name"]: q["range"] for q in h2o["params"]}["heavy_ratio"] == "(0, 1)"


def test_registration_is_checked():
    with pytest.raises(kvsim.Error, match="built-in"):
        kvsim.register_policy("h2o", rp.PyH2O)
    with pytest.raises(kvsim.Error, match="not a subclass"):
        kvsim.register_policy("thing", dict)
    with pytest.raises(kvsim.Error, match="one word"):
        kvsim.register_policy("two words", rp.PyWindow)

    class BadKind(rp.PyWindow):
        params = {"budget": kvsim.Param("tokenz")}
    with pytest.raises(kvsim.Error, match="kind must be"):
        kvsim.register_policy("bad_kind", BadKind)

    class BadMemory(rp.PyWindow):
        memory = "size"
    with pytest.raises(kvsim.Error, match="memory names 'size'"):
        kvsim.register_policy("bad_memory", BadMemory)


def test_attend_is_the_engines_kernel():
    rng = np.random.default_rng(0)
    K, V, q = rng.normal(size=(30, 8)), rng.normal(size=(30, 8)), rng.normal(size=(2, 8))
    z, p, log_sum = kvsim.attend(K, V, q)
    logits = q @ K.T
    ref = np.exp(logits - logits.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(p, ref.T, rtol=1e-12)
    np.testing.assert_allclose(z, ref @ V, rtol=1e-12)
    np.testing.assert_allclose(log_sum, np.log(np.exp(logits).sum(axis=1)), rtol=1e-12)
    z0, p0, l0 = kvsim.attend(np.zeros((0, 8)), np.zeros((0, 8)), q)
    assert p0.shape == (0, 2) and (z0 == 0).all() and np.isneginf(l0).all()
    with pytest.raises(kvsim.Error, match="must agree"):
        kvsim.attend(K, V[:5], q)


class RegistersWhileRunning(rp.PyWindow):
    """Tries to change the registry from inside a run."""

    def __init__(self, stream, budget):
        super().__init__(stream, budget)
        kvsim.register_policy("late", rp.PyWindow)


def test_the_registry_does_not_change_during_a_run():
    kvsim.register_policy("registers_while_running", RegistersWhileRunning)
    with pytest.raises(kvsim.Error, match="in progress"):
        kvsim.run(synthetic("kv_head", [{"name": "registers_while_running", "budget": 8}], n=40))
    assert "late" not in [p["name"] for p in kvsim.policies()]

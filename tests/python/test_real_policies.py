"""Python twins of window and h2o on stories260K's recorded tensors (8 query heads sharing 4 KV heads):
metric rows identical to the built-in policies' in both GQA modes."""
import pandas as pd
import pytest

import kvsim


def metric_rows(res, policy):
    return res.rows(policy).drop(columns=["policy", "label", "policy_ns"]).reset_index(drop=True)


@pytest.mark.parametrize("gqa", ["kv_head", "query_head"])
def test_python_window_and_h2o_equal_the_builtins_on_stories260k(stories_recording, reference_policies, gqa):
    # per_step: the twins step their caches like the built-ins' per-step replay (the default blocked
    # replays of window and h2o differ by rounding only: tests/python/test_policies.py).
    cfg = {"name": "py_twins_stories260k", "data": {"path": str(stories_recording)},
           "eval": {"gqa": gqa, "closed_form": "per_step", "stepping": "per_step"},
           "policy": [{"name": n, "memory": m} for m in (0.1, 0.3) for n in ("window", "py_window", "h2o", "py_h2o")]}
    res = kvsim.run(cfg)
    assert res.meta["n_heads"] == 8 and res.meta["n_kv_heads"] == 4
    for m in ("0.1", "0.3"):
        for builtin in ("window", "h2o"):
            a = metric_rows(res, f"{builtin}(memory={m})")
            b = metric_rows(res, f"py_{builtin}(memory={m})")
            assert len(a) == 5 * 8 * 160  # layers × query heads × steps
            pd.testing.assert_frame_equal(a, b, check_exact=True)
    # Negative control: the two policies (and the two budgets) do measure differently.
    assert not metric_rows(res, "h2o(memory=0.1)").equals(metric_rows(res, "window(memory=0.1)"))
    assert not metric_rows(res, "py_h2o(memory=0.1)").equals(metric_rows(res, "py_h2o(memory=0.3)"))

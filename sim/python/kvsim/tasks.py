"""Reading `kvsim task` runs, and predicting a cache policy's task accuracy from its open loop alone
(docs/tasks.md, "Predicting the answer offline"; docs/results.md, "Can attention error predict the answer?").

  kvsim.tasks.load(dirs)              trials.csv of `kvsim task` runs (or an unfinished run's checkpoints)
  kvsim.tasks.load_open_loop(dirs)    open_loop.csv of `kvsim task --open-loop` runs
  kvsim.tasks.score_table(...)        every candidate score's fit, held out by policy, kind, length, model
  kvsim.predict_accuracy(...)         a new policy's accuracy per (model, kind, length, memory) from its open loop

A score's fit is a logistic regression of the answer (1/0) on the score (statsmodels `Logit`); held out,
each group's trials are predicted by the fit on every other group's. Bad input (a missing run, runs that
mix link_steps, an unknown score) raises kvsim.Error with a one-line message.
"""
import os

import numpy as np
import pandas as pd

from . import _kvsim

Error = _kvsim.Error


def parse_params(s):
    """"k=v,k=v" (a policy's params, or the inside of its label) as a dict of strings."""
    return dict(kv.split("=", 1) for kv in s.split(",") if "=" in kv)


KEYS = ["kind", "length", "depth", "trial", "cache", "model"]  # one trial's cache (the same prompts per model)
OPEN_LOOP = ["rel_err", "eps", "kept_mass", "needle_kept_share", "topk_kept", "rel_err_rheads", "kept_mass_rheads",
             "topk_kept_rheads", "rel_err_worst_layer", "kept_mass_worst_layer", "topk_kept_worst_layer"]
# (name, column, log10?): the candidates (no needle position), then the upper reference.
SCORES = (("log10 rel_err", "rel_err", True), ("log10 eps", "eps", True), ("kept_mass", "kept_mass", False),
          ("topk_kept", "topk_kept", False), ("log10 rel_err, retrieval heads", "rel_err_rheads", True),
          ("kept_mass, retrieval heads", "kept_mass_rheads", False), ("topk_kept, retrieval heads", "topk_kept_rheads", False),
          ("log10 rel_err, worst layer", "rel_err_worst_layer", True), ("kept_mass, worst layer", "kept_mass_worst_layer", False),
          ("topk_kept, worst layer", "topk_kept_worst_layer", False), ("needle_kept_share (reference)", "needle_kept_share", False))


def merge_runs(t, dirs):
    """One row per (task, length, depth, trial, cache, model): folders of the same task and seed (e.g.
    smollm2_passkey.toml and smollm2_retrieval_evictors.toml) both hold the exact cache and the
    evict_needle control, which must answer alike trial by trial; each is then counted once. Exits with
    one line naming the first trial whose answers differ (not the same prompts: another seed or config)."""
    keys = [c for c in ("kind", "length", "depth", "trial", "cache", "model") if c in t.columns]
    same = [c for c in ("correct", "generated", "answer") if c in t.columns]
    dup = t.duplicated(keys, keep=False)
    if not dup.any():
        return t
    differ = t[dup].groupby(keys)[same].nunique(dropna=False)
    differ = differ[(differ > 1).any(axis=1)]
    if len(differ):
        where = ", ".join(f"{k}={v}" for k, v in zip(keys, differ.index[0]))
        raise Error(f"{' and '.join(dirs)}: the same trial answers differently ({where}): "
                 "were these runs made with the same task, seed and model?")
    return t.drop_duplicates(keys, keep="first").reset_index(drop=True)


def load_unfinished(d):
    """The trials an unfinished run (`kvsim task`, stopped or still running) has checkpointed in
    d/trials/, as trials.csv's rows: kind, model and link_steps from its config.toml, newlines in `generated`
    written as the two characters \\n as trials.csv writes them. None when there are none."""
    import glob
    import tomllib
    files = sorted(glob.glob(os.path.join(d, "trials", "L*_d*_t*.toml")))
    if not files:
        return None
    try:
        with open(os.path.join(d, "trials", "config.toml"), "rb") as f:
            cfg = tomllib.load(f)
        rows = []
        for path in files:
            with open(path, "rb") as f:
                rows += tomllib.load(f)["row"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise Error(f"{d}/trials: unreadable checkpoint ({e})")
    t = pd.DataFrame(rows)
    t["generated"] = t["generated"].str.replace("\n", "\\n", regex=False)
    t.insert(0, "kind", cfg["task"]["kind"])
    t["model"] = os.path.splitext(os.path.basename(cfg["model"]["checkpoint"]))[0]
    t["link_steps"] = cfg["task"].get("link_steps", "question")
    print(f"{d}: an unfinished run, {len(files)} trials checkpointed so far")
    return t


def load(dirs):
    """Every folder's trials.csv as one DataFrame with the memory fraction parsed from the label. A
    folder without trials.csv but with checkpoints (an unfinished run) gives the trials done so far."""
    frames = []
    for d in dirs:
        path = os.path.join(d, "trials.csv")
        if not os.path.exists(path):
            part = load_unfinished(d)
            if part is None:
                raise Error(f"{path} not found (run `kvsim task CONFIG --out {d}` first)")
            frames.append(part)
            continue
        frames.append(pd.read_csv(path, keep_default_na=False, na_values=["nan"]))
    t = pd.concat(frames, ignore_index=True)
    if "model" not in t.columns:
        t["model"] = ""
    t = merge_runs(t, dirs)
    inner = t["cache"].str.extract(r"\((.*)\)$")[0].fillna("")
    t["memory"] = [float(parse_params(s).get("memory", "nan")) for s in inner]
    # A policy run with two settings besides memory (kivi at 4 and 2 bits) is two policies: name each by
    # its other parameters, so that no figure or table pools them. A single setting keeps the bare name.
    rest = [",".join(kv for kv in s.split(",") if kv and not kv.startswith("memory=")) for s in inner]
    settings = pd.Series(rest, index=t.index).groupby(t.policy).nunique()
    t["policy"] = [f"{p}({r})" if settings[p] > 1 and r else p for p, r in zip(t.policy, rest)]
    exact = t[t.cache == "exact"].groupby(["kind", "length"]).correct.mean().rename("exact_acc")
    return t.join(exact, on=["kind", "length"])


def load_open_loop(dirs, what="--open-loop"):
    """Every folder's open-loop rows as one DataFrame: its open_loop.csv (`kvsim task --open-loop`), else
    a full run's trials.csv (whose open-loop columns are the same, to the bit), else its checkpoints so
    far. Folders of other link_steps than the first are refused (link_mode)."""
    frames = []
    for d in dirs:
        path = os.path.join(d, "open_loop.csv")
        full = os.path.join(d, "trials.csv")
        if os.path.exists(path) or os.path.exists(full):
            f = pd.read_csv(path if os.path.exists(path) else full, keep_default_na=False, na_values=["nan"])
            frames.append(f[~f.cache.isin(["exact", "evict_needle"])])
            continue
        part = load_unfinished(d)
        if part is None:
            raise Error(f"{path} not found (run `kvsim task CONFIG --open-loop --out {d}` first)")
        frames.append(part)
    o = pd.concat(frames, ignore_index=True)
    if "model" not in o.columns:
        o["model"] = ""
    link_mode(o, what)
    return o.drop_duplicates(KEYS, keep="last")[KEYS + [c for c in ["policy", "link_steps"] + OPEN_LOOP if c in o.columns]]


def link_mode(frame, what):
    """The one `[task] link_steps` of a set of runs (runs written before the column are "question");
    runs that mix the question's and the answer's steps are refused."""
    steps = frame["link_steps"].replace("", np.nan).fillna("question") if "link_steps" in frame.columns else pd.Series(["question"])
    modes = sorted(set(steps))
    if len(modes) > 1:
        raise Error(f"the {what} runs mix link_steps ({', '.join(modes)}); give runs of one")
    return modes[0]


def combine(answers, replace, open_loop):
    """The answers' policy rows (with --replace's rows instead of theirs) of counting cells. Given
    `open_loop`, every open-loop column (OPEN_LOOP) comes from it alone: NaN for a row it lacks, never the
    answers' own value (which may be of other steps: link_steps), so a partial open loop scores only its
    trials."""
    t = answers
    if replace is not None:
        r = replace[~replace.cache.isin(["exact", "evict_needle"])]
        t = pd.concat([t.merge(r[KEYS], on=KEYS, how="left", indicator=True).query("_merge == 'left_only'").drop(columns="_merge"),
                       r.drop(columns="exact_acc", errors="ignore").merge(t[["kind", "length", "exact_acc"]].drop_duplicates(),
                                                                          on=["kind", "length"])], ignore_index=True)
    t = t[~t.cache.isin(["exact", "evict_needle"]) & (t.exact_acc >= 0.8)].copy()
    if open_loop is not None:
        o = open_loop.drop(columns=["policy", "link_steps"], errors="ignore").set_index(KEYS)
        idx = pd.MultiIndex.from_frame(t[KEYS])
        have = idx.isin(o.index)
        for c in OPEN_LOOP:
            vals = np.full(len(t), np.nan)
            if c in o.columns:
                vals[have] = o.loc[idx[have], c].to_numpy(float)
            t[c] = vals
    return t.reset_index(drop=True)


def auc(x, y):
    """ROC AUC: the probability that a success has a larger x than a failure (ties count half); the
    caller passes x times the fitted slope's sign, so that 0.5 is chance and 1 a perfect ranking."""
    pos, neg = x[y == 1], x[y == 0]
    if len(pos) == 0 or len(neg) == 0:
        return np.nan
    return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg)))


def logit_fit(x, y):
    import statsmodels.api as sm
    return sm.Logit(y, sm.add_constant(x)).fit(disp=0, warn_convergence=False)


def spearman(a, b):
    from scipy.stats import spearmanr
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return np.nan
    return float(spearmanr(a, b).statistic)


SPLITS = ("policy", "kind", "length", "model")


def prediction_cells(c):
    """Per policy of one (model, kind, length, memory) cell: its trials, actual accuracy, the held-out predicted
    accuracy (the mean of the trials' predicted probabilities) and a 95% prediction interval for the
    accuracy of those n trials if the predictions are right (the trials as independent Bernoulli draws
    with their predicted probabilities: mean ± 1.96 sd of a Poisson-binomial count over n, widened by
    half a trial, the count's step), and whether the actual accuracy falls inside it."""
    rows = []
    for pol, d in c.groupby("policy"):
        p, n = d.held.to_numpy(float), len(d)
        half = 1.96 * np.sqrt(np.sum(p * (1 - p))) / n + 0.5 / n
        lo, hi = max(0.0, p.mean() - half), min(1.0, p.mean() + half)
        actual = d.correct.mean()
        rows.append({"model": d.model.iloc[0], "kind": d.kind.iloc[0], "length": d.length.iloc[0], "memory": d.memory.iloc[0], "policy": pol, "trials": n,
                     "actual": actual, "predicted": p.mean(), "low": lo, "high": hi, "covered": bool(lo <= actual <= hi)})
    return pd.DataFrame(rows)


def evaluate(t, name, col, log, split="policy"):
    """One score's row of predict.csv for one out-of-sample split (each value of `split` held out in
    turn and predicted by the fit on the others), its ranking rows and its reliability bins."""
    g = t[np.isfinite(t[col].astype(float)) & ((t[col] > 0) if log else True)] if col in t.columns else t.iloc[:0]
    y = g.correct.to_numpy(int)
    row = {"score": name, "held_out": split, "trials": len(g), "policies": g.policy.nunique(),
           "groups": g[split].nunique() if split in g.columns else 0}
    if len(g) < 10 or y.min() == y.max():
        return row, [], []
    x = np.log10(g[col].to_numpy(float)) if log else g[col].to_numpy(float)
    fit = logit_fit(x, y)
    sign = np.sign(fit.params[1]) or 1.0
    row.update({"mcfadden_r2": float(fit.prsquared), "auc": auc(sign * x, y)})
    if row["groups"] < 2:
        return row, [], []
    held = np.full(len(g), np.nan)
    grp = g[split].to_numpy()
    for q in pd.unique(grp):
        train = grp != q
        if y[train].min() == y[train].max():
            continue
        f = logit_fit(x[train], y[train])
        held[~train] = 1 / (1 + np.exp(-(f.params[0] + f.params[1] * x[~train])))
    ok = np.isfinite(held)
    if not ok.any():
        return row, [], []
    row.update({"auc_out": auc(held[ok], y[ok]), "brier_out": float(np.mean((held[ok] - y[ok]) ** 2))})
    g = g.assign(held=held)
    ranking = []
    for (model, kind, length, memory), c in g[ok].groupby(["model", "kind", "length", "memory"]):
        per = c.groupby("policy").agg(actual=("correct", "mean"), predicted=("held", "mean"))
        ranking.append({"score": name, "held_out": split, "model": model, "kind": kind, "length": length, "memory": memory,
                        "policies": len(per), "rho": spearman(per.predicted.to_numpy(), per.actual.to_numpy()),
                        "cells": prediction_cells(c)})
    rho = np.array([r["rho"] for r in ranking], float)
    rho = rho[np.isfinite(rho)]
    cells = pd.concat([r["cells"] for r in ranking], ignore_index=True)
    row.update({"cells": len(rho), "rho_mean": float(rho.mean()) if len(rho) else np.nan,
                "rho_ge_0.8": float((rho >= 0.8).mean()) if len(rho) else np.nan,
                "coverage": float(cells.covered.mean()), "policy_cells": len(cells)})
    for r in ranking:
        r["covered"] = float(cells[(cells.model == r["model"]) & (cells.kind == r["kind"]) & (cells.length == r["length"])
                                   & (cells.memory == r["memory"])].covered.mean())
    bins = np.minimum((held[ok] * 10).astype(int), 9)
    reliability = [{"score": name, "held_out": split, "bin": b, "predicted": float(held[ok][bins == b].mean()),
                    "observed": float(y[ok][bins == b].mean()), "trials": int((bins == b).sum())}
                   for b in range(10) if (bins == b).any()]
    return row, ranking, reliability


def predict_new(t, new, score):
    """The `--new` screening: `score`'s logistic fit on every answered trial in `t`, applied to the
    open-loop rows `new` of policies that need not have run in the closed loop; per (policy, kind,
    length, memory) the predicted accuracy and its 95% prediction interval (prediction_cells)."""
    name, col, log = next(x for x in SCORES if x[0] == score)
    g = t[np.isfinite(t[col].astype(float)) & ((t[col] > 0) if log else True)]
    f = logit_fit(np.log10(g[col].to_numpy(float)) if log else g[col].to_numpy(float), g.correct.to_numpy(int))
    n = new[np.isfinite(new[col].astype(float)) & ((new[col] > 0) if log else True)].copy()
    x = np.log10(n[col].to_numpy(float)) if log else n[col].to_numpy(float)
    n["held"] = 1 / (1 + np.exp(-(f.params[0] + f.params[1] * x)))
    n["correct"] = np.nan
    out = pd.concat([prediction_cells(c) for _, c in n.groupby(["model", "kind", "length", "memory"])], ignore_index=True)
    return out.drop(columns=["actual", "covered"]).assign(score=name)


SPLITS = ("policy", "kind", "length", "model")


def answered_trials(answers, replace, open_loop):
    """The fit's trials (combine) and the link_steps of their scores; raises kvsim.Error when the runs
    mix link_steps or no policy trial lies in a counting cell (the exact cache answering >= 80%)."""
    mode = link_mode(open_loop if open_loop is not None else answers, "--open-loop" if open_loop is not None else "--answers")
    t = combine(answers, replace, open_loop)
    if t.empty:
        raise Error("no policy trials in counting cells (the exact cache answers < 80% everywhere?)")
    return t, mode


def score_table(answers, open_loop=None, replace=None):
    """Every candidate score (SCORES) fitted and held out by policy, and by task kind, length and model
    where the runs hold more than one.

    answers: DataFrame of load() (whether each cache answered); open_loop: load_open_loop()'s frame or
      None (the answers' own open-loop columns); replace: load()'s frame of re-measured rows or None.
    Returns (predict, ranking, reliability, cells) DataFrames (docs/tasks.md: predict.csv, ranking.csv,
    reliability.csv, cells.csv), predict with its `link_steps` column. Raises kvsim.Error when no policy
    trial lies in a counting cell (the exact cache answering >= 80%) or the runs mix link_steps.
    """
    t, mode = answered_trials(answers, replace, open_loop)
    rows, ranking, reliability, cells = [], [], [], []
    for split in SPLITS:
        for name, col, log in SCORES:
            r, k, b = evaluate(t, name, col, log, split)
            if split != "policy" and r.get("groups", 0) < 2:
                continue  # one task, length or model only: nothing to hold out
            rows.append(r)
            for x in k:
                cells.append(x.pop("cells").assign(score=name, held_out=split))
            ranking += k
            reliability += b
    p = pd.DataFrame(rows)
    p["link_steps"] = mode
    cells = pd.concat(cells, ignore_index=True) if cells else pd.DataFrame()
    return p, pd.DataFrame(ranking), pd.DataFrame(reliability), cells


def predict_accuracy(answers, open_loop, new, score="log10 rel_err, retrieval heads", replace=None, check=None):
    """A new policy's task accuracy predicted from its open loop alone (no closed loop, no generation
    of its own): `score`'s logistic fit on every answered trial, applied to the new policy's trials.

    answers: `kvsim task` run folders (a list of paths) or load()'s DataFrame: the policies that ran in
      the closed loop, with their answers; open_loop: `kvsim task --open-loop` folders of the same
      configs (or load_open_loop()'s frame, or None to use the answers' own open-loop columns); new:
      `--open-loop` folders (or frame) of the policies to screen, at the same link_steps; score: one of
      SCORES' names; replace: folders (or frame) of re-measured rows; check: closed-loop runs (folders
      or load()'s frame) of the screened policies, run afterwards to check the screen.
    Returns a DataFrame, one row per (policy, model, kind, length, memory): trials, predicted accuracy (the
    mean predicted probability), and `low`, `high`: a 95% prediction interval for the accuracy of those
    trials (prediction_cells); with `check`, also `actual` (the closed loop's accuracy on the same
    trials; NaN for a cell it did not run) and `covered` (low <= actual <= high). Raises kvsim.Error for an unknown score, missing runs, runs that mix
    link_steps, or a screen at other steps than the fit's.
    """
    if score not in [x[0] for x in SCORES]:
        raise Error(f"score {score!r} is not one of: " + ", ".join(x[0] for x in SCORES))
    as_frame = lambda x, f: f(list(x)) if x is not None and not isinstance(x, pd.DataFrame) else x
    answers = as_frame(answers, load)
    open_loop = as_frame(open_loop, load_open_loop)
    replace = as_frame(replace, load)
    new = as_frame(new, lambda d: load_open_loop(d, "--new"))
    t, mode = answered_trials(answers, replace, open_loop)
    if link_mode(new, "--new") != mode:
        raise Error(f"the --new runs' link_steps ({link_mode(new, '--new')}) differ from the fit's ({mode}); screen at the same steps")
    new = new.copy()
    inner = new["cache"].str.extract(r"\((.*)\)$")[0].fillna("")
    new["memory"] = [float(parse_params(s).get("memory", "nan")) for s in inner]
    out = predict_new(t, new, score)
    if check is not None:
        c = as_frame(check, load)
        keys = ["policy", "model", "kind", "length", "memory"]
        screened = new[KEYS].merge(c[KEYS + ["correct"]], on=KEYS).merge(new[KEYS + ["policy", "memory"]], on=KEYS)
        actual = screened.groupby(keys).correct.mean().rename("actual").reset_index()
        out = out.merge(actual, on=keys, how="left")
        out["covered"] = (out.low <= out.actual) & (out.actual <= out.high)
    return out

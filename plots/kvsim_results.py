"""Shared helpers for kvsim figure scripts: open a run's results.h5 and save figures."""
import os
import sys

import kvsim_deps  # noqa: F401,E402  (exits with one line if numpy/h5py/matplotlib are missing)
import matplotlib

matplotlib.use("Agg")
import h5py  # noqa: E402


def text(x):
    """HDF5 attribute (bytes or str) as str."""
    return x.decode() if isinstance(x, bytes) else str(x)


def parse_params(s):
    """"k=v,k=v" (a policy's params, or the inside of its label) as a dict of strings."""
    return dict(kv.split("=", 1) for kv in s.split(",") if "=" in kv)


def params(group):
    """A policy group's `params` attribute ("k=v,k=v") as a dict of strings."""
    return parse_params(text(group.attrs["params"]))


def column(group, metric):
    """A policy group's metric dataset as a float array; all NaN when the run left it out because it
    does not apply to that policy (e.g. kept_mass for subgen, the objectives when they are off)."""
    import numpy as np
    if metric in group:
        return np.asarray(group[metric][:], dtype=float)
    return np.full(group["step"].shape, np.nan)


def data_set(f):
    """A run's data set in words, for figure titles: the model and recording file, or the synthetic source."""
    a = f.attrs
    if "recording_path" in a:
        model = os.path.splitext(os.path.basename(text(a.get("model", ""))))[0] or "model"
        return f"{model} on {os.path.basename(text(a['recording_path']))}, n = {int(a['n_tokens'])}"
    src = text(a.get("source", ""))
    return src.replace("kvsim synth ", "synthetic ") if src else text(a.get("experiment", ""))


def open_results(results_dir):
    """Open RESULTS_DIR/results.h5 or exit with a clear message naming it."""
    path = os.path.join(results_dir, "results.h5")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found (run `kvsim run CONFIG --out {results_dir}` first)")
    return h5py.File(path, "r")


def policies(f):
    """(group name, group) for every policy of a run, in run order."""
    return [(g, f[g]) for g in sorted(k for k in f if k.startswith("policy_"))]


def save(fig, results_dir, out, default_name):
    """Write the figure as PNG (at `out`, or RESULTS_DIR/default_name) and PDF beside it."""
    out = out or os.path.join(results_dir, default_name)
    fig.tight_layout()
    fig.savefig(out, dpi=130, bbox_inches="tight")  # "tight" keeps legends placed outside the axes
    pdf = os.path.splitext(out)[0] + ".pdf"
    fig.savefig(pdf, bbox_inches="tight")
    print(f"wrote {out} and {pdf}")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out


def _policy_colors():
    """One colour per policy, the same in every figure: each policy's PolicyInfo::color, written by
    `kvsim policies --colors` into policy_colors.json beside this file (tests/cli/cli_test.sh keeps the
    two equal)."""
    import json
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "policy_colors.json")) as f:
        return json.load(f)


POLICY_COLORS = _policy_colors()


def bootstrap_ci(values, seed=1, resamples=4000):
    """Mean of `values` with a 95% percentile-bootstrap interval over them (seeded numpy resampling,
    the method kvsim's sequences.csv uses): (mean, low, high); NaNs ignored, (nan, nan, nan) if none."""
    import numpy as np
    v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
    if v.size == 0:
        return np.nan, np.nan, np.nan
    means = np.random.default_rng(seed).choice(v, size=(resamples, v.size)).mean(axis=1)
    return float(v.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def color(policy_name):
    """The figure colour of a policy (by registry name; variants share it)."""
    base = policy_name.split(" ")[0].split("(")[0]
    return POLICY_COLORS.get(base, "#c7c7c7")

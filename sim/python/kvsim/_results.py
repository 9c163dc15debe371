"""kvsim.Results: a finished run in memory, as pandas DataFrames."""
import io
import tomllib

import numpy as np
import pandas as pd

from . import _kvsim


class Results:
    """What `kvsim.run` returns: every evaluated row of every policy, kept in memory.

    Attributes:
      name (str): the experiment's name.
      sequences (int): sequences replayed (1 unless `[data] path` is a list or `[data] sequences` > 1).
      config (dict): the resolved configuration (every default filled in), as a dict;
        `config_text` is the config as given (with overrides), `resolved_config` the resolved TOML.
      policies (list of dict): each [[policy]] entry after sweep expansion: name, label, params.
      metrics (list of str): the metric columns of `rows()`, in the metric registry's order
        (`kvsim.metrics()` gives each one's unit, description and paper source).
      meta (dict): the (first) sequence's recording attributes (n_layers, n_heads, head_dim, ...).
      wall_seconds (float): replay time, all sequences.
    """

    def __init__(self, run):
        self._run = run
        self.name = run.name
        self.sequences = run.sequences
        self.config_text = run.config_text
        self.resolved_config = run.resolved_config
        self.config = tomllib.loads(run.resolved_config)
        self.policies = run.policies
        self.meta = run.meta(0)
        self.wall_seconds = sum(run.wall_seconds(s) for s in range(run.sequences))
        self._rows = None
        first = run.columns(0, 0) if self.policies else {}
        self.metrics = [k for k in first if k not in ("layer", "head", "step")]

    def __repr__(self):
        labels = ", ".join(p["label"] for p in self.policies)
        return f"<kvsim.Results {self.name!r}: {self.sequences} sequence(s), policies {labels}>"

    def _frame(self, s, p):
        cols = self._run.columns(s, p)
        n = len(cols["step"])
        spec = self.policies[p]
        head = {"policy": np.full(n, spec["name"], dtype=object), "label": np.full(n, spec["label"], dtype=object)}
        if self.sequences > 1:
            head = {"sequence": np.full(n, s, dtype=np.int32), **head}
        return pd.DataFrame({**head, **cols})

    def _select(self, policy):
        if policy is None:
            return list(range(len(self.policies)))
        keys = [policy] if isinstance(policy, str) else list(policy)
        chosen = [i for i, p in enumerate(self.policies) if p["name"] in keys or p["label"] in keys]
        missing = [k for k in keys if not any(p["name"] == k or p["label"] == k for p in self.policies)]
        if missing:
            known = ", ".join(p["label"] for p in self.policies)
            raise _kvsim.Error(f"no policy {missing[0]!r} in this run (labels: {known})")
        return chosen

    def rows(self, policy=None):
        """Every evaluated row in long form: one row per (sequence,) policy, layer, query head and step.

        Columns: [sequence,] policy (registry name), label, layer, head (query head), step (1-based
        decode step t), then one float column per metric (NaN where a metric does not apply), exactly
        the values of results.h5. `policy` selects by name or label (or a list of them).
        Raises kvsim.Error for a policy that is not in the run.
        """
        chosen = self._select(policy)
        frames = [self._frame(s, p) for s in range(self.sequences) for p in chosen]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def _csv(self, text_of):
        frames = []
        for s in range(self.sequences):
            df = pd.read_csv(io.StringIO(text_of(s)))
            if self.sequences > 1:
                df.insert(0, "sequence", s)
            frames.append(df)
        return pd.concat(frames, ignore_index=True)

    @property
    def summary(self):
        """summary.csv as a DataFrame: per policy, layer (−1 = all layers) and metric the count, mean,
        median, p95 and max over evaluated rows, plus one column per policy parameter; with several
        sequences a leading `sequence` column."""
        return self._csv(lambda s: self._run.summary_csv(s))

    @property
    def cells(self):
        """cells.csv as a DataFrame: the same statistics per (layer, query head)."""
        return self._csv(lambda s: self._run.cells_csv(s))

    @property
    def across_sequences(self):
        """sequences.csv as a DataFrame (several sequences only, else None): per policy and metric the
        mean over sequences with a 95% percentile-bootstrap interval (ci_low, ci_high)."""
        if self.sequences == 1:
            return None
        return pd.read_csv(io.StringIO(self._run.sequences_csv()))

    def table(self, sequence=0):
        """The table `kvsim run` prints (means and p95 of the key metrics per policy)."""
        return self._run.table(sequence)

    def save(self, out):
        """Writes the CLI's files into folder `out`: results.h5, summary.csv, cells.csv (several
        sequences: each in out/seq_NN/, and out/sequences.csv). Files appear whole or not at all."""
        self._run.save(str(out))
        return out

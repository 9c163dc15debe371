"""Policies written in Python: kvsim.Policy, kvsim.Answer, kvsim.Param, kvsim.register_policy."""
import inspect

import numpy as np

from . import _kvsim


class Param:
    """A parameter a Python policy accepts from its [[policy]] entry.

    kind: "tokens" (an int count, or a float in (0, 1] = fraction of the stream length n; the
      policy receives tokens as an int, clamped to n), "int", "float", "bool" or "string".
    default: None = required (a config without it is refused); else a value of that kind.
    doc: meaning and unit, shown by kvsim.policies().
    range: the values allowed, checked on a given value as for the built-in policies: an interval
      for numbers ("(0, 1)", "[1, 64]", "[0, inf)"), the choices for strings ("max|avg"); "" = any.
    """

    def __init__(self, kind, default=None, doc="", range=""):
        self.kind, self.default, self.doc, self.range = kind, default, doc, range


class Answer:
    """A policy's answer at an evaluated step.

    z: the attention output estimate, [head_dim] for one query head or [G, head_dim] for a KV group's
      G query heads (the rows of attend()'s q), float.
    log_tau: None, or log τ̂ (the partition-function estimate, SubGen Eq. 2) — a float, or [G].
    kept: None, or the token indices (as observe() received them, 0-based) the answer attends over,
      shared by the group; enables kept_mass, mass_ratio, attention_loss and the H2O objectives.
    """

    def __init__(self, z, log_tau=None, kept=None):
        self.z, self.log_tau, self.kept = z, log_tau, kept


class Policy:
    """Base class of a KV-cache policy written in Python (docs/policies.md's stream protocol).

    The engine builds one instance per cache: `cls(stream, **params)`, where `stream` is a
    kvsim.Stream (n, head_dim, n_queries, group_agg, seed, prefill, layer, n_layers) and params are
    the declared `params` read from the config (a "tokens" budget already in tokens). Then, for
    token i = 0, 1, ..., n − 1 (step t = i + 1):
      observe(i, k, v)   token i joins the stream: k, v are float32 [head_dim] (copies).
      attend(t, q)       q is float64 [G, head_dim]: the scaled queries (softmax_scale · q) of the G
                         query heads this cache answers (the GQA group in kv_head mode, G = 1 in
                         query_head mode); tokens 0..t−1 have been observed. Return a kvsim.Answer
                         (or a list of G). Called at evaluated steps, or at every step when
                         `needs_every_query` is true (the return value is then ignored in between).
      cache_tokens()     tokens the cache holds now (int).
      cache_vectors()    stored vectors of head_dim floats now (default 2 · cache_tokens(): a key
                         and a value each); cache_bytes = cache_vectors · head_dim · 4.
    With `[data] prefill = P` the prompt streams through observe/attend like any other tokens.

    Class attributes read by kvsim.register_policy:
      params            {name: kvsim.Param}; parameters a config may give (others are refused).
      memory            None, or the name of a "tokens" parameter that `memory = M` sets to M (the
                        cache then must hold min(M, t) tokens' worth at every step, ±2%; checked).
      capacity_matched  True when the size oscillates by design and `memory` is a capacity instead.
      needs_every_query True when attend() must see every step's queries (score-based eviction).
      source            the paper, section and equation the policy implements.

    Every call holds Python's GIL: Python policies of different cells run one at a time while the
    C++ policies of a run keep their threads (docs/python.md measures the per-step cost).
    """

    params = {}
    memory = None
    capacity_matched = False
    needs_every_query = False
    source = ""

    def __init__(self, stream, **params):
        self.stream = stream

    def observe(self, i, k, v):
        raise NotImplementedError(f"{type(self).__name__}.observe")

    def attend(self, t, q):
        raise NotImplementedError(f"{type(self).__name__}.attend")

    def cache_tokens(self):
        raise NotImplementedError(f"{type(self).__name__}.cache_tokens")

    def cache_vectors(self):
        return 2 * int(self.cache_tokens())


def register_policy(name, cls):
    """Makes Python policy class `cls` (a kvsim.Policy subclass) available as `name` in configs and
    config dicts, with every metric of the built-in policies. Registering a name again replaces it.

    Raises kvsim.Error for a built-in name, a name that is not one word, an unknown parameter kind,
    a default that does not match its kind, or a `memory` that names no "tokens" parameter.
    """
    if not (inspect.isclass(cls) and issubclass(cls, Policy)):
        raise _kvsim.Error(f"kvsim.register_policy('{name}'): {cls!r} is not a subclass of kvsim.Policy")
    params = []
    for pname, p in dict(cls.params).items():
        if not isinstance(p, Param):
            raise _kvsim.Error(f"kvsim.register_policy('{name}'): params['{pname}'] must be a kvsim.Param")
        default = p.default.item() if isinstance(p.default, np.generic) else p.default
        params.append((str(pname), str(p.kind), default, str(p.doc), str(p.range)))
    doc = inspect.getdoc(cls) or ""
    summary = doc.split("\n\n")[0].replace("\n", " ") if doc else f"Python policy {cls.__qualname__}"
    source = cls.source or f"Python: {cls.__module__}.{cls.__qualname__}"
    _kvsim._register_policy(str(name), cls, params, cls.memory or "", bool(cls.capacity_matched), summary, source)
    return cls


def attend(keys, values, q):
    """Exact softmax attention of a query group over cached tokens — the kernel the built-in subset
    policies use (log-domain softmax in float64), so a Python policy that calls it on the same cache
    order answers bit for bit like its C++ twin.

    keys, values: [m, d]; q: [G, d] scaled queries (as attend() receives them).
    Returns (z [G, d], p [m, G] — column g is query g's softmax over the m tokens, log_sum [G] =
    log Σ_j exp(k_j · q_g)). m = 0 gives z = 0 and log_sum = −inf.
    Raises kvsim.Error when the shapes disagree.
    """
    return _kvsim._attend(np.asarray(keys, dtype=np.float64), np.asarray(values, dtype=np.float64),
                          np.asarray(q, dtype=np.float64))

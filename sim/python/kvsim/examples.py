"""Example policies written in Python: twins of two built-in policies, using the public kvsim.Policy
API only — a ring `window` (H2O §5.1 "Local") and H2O (H2O §4.1 Algorithm 1 with the built-in's
eviction order: lowest accumulated score outside the recent part, ties to the oldest). Each keeps its
cache in the C++ policy's slot order and answers with kvsim.attend, so its metric rows equal the
built-in's bit for bit (tests/python/test_policies.py); `.venv/bin/python -m kvsim.bench` times them against
their C++ twins. Register them with kvsim.register_policy("py_window", PyWindow) etc."""
import math

import numpy as np

from . import _policy as kvsim


class SlotStore:
    """Keys and values in float64 slots, with each slot's token index."""

    def __init__(self, capacity, d):
        self.keys = np.zeros((capacity, d))
        self.values = np.zeros((capacity, d))
        self.pos = np.full(capacity, -1, dtype=np.int64)
        self.size = 0

    def put(self, slot, i, k, v):
        self.keys[slot], self.values[slot], self.pos[slot] = k, v, i
        self.size = max(self.size, slot + 1)

    def answer(self, q):
        m = self.size
        z, p, _ = kvsim.attend(self.keys[:m], self.values[:m], q)
        return kvsim.Answer(z, kept=self.pos[:m].copy()), p


class PyWindow(kvsim.Policy):
    """The `budget` most recent tokens (a ring buffer)."""

    params = {"budget": kvsim.Param("tokens", doc="cache size B")}
    memory = "budget"

    def __init__(self, stream, budget):
        super().__init__(stream)
        self.budget = budget
        self.store = SlotStore(budget, stream.head_dim)

    def observe(self, i, k, v):
        self.store.put(i % self.budget, i, k, v)

    def attend(self, t, q):
        return self.store.answer(q)[0]

    def cache_tokens(self):
        return self.store.size


class PyH2O(kvsim.Policy):
    """Heavy hitters + recent tokens, scores = accumulated attention (H2O Alg. 1)."""

    params = {"budget": kvsim.Param("tokens", doc="cache size B"),
              "heavy_ratio": kvsim.Param("float", 0.5, "fraction of B for heavy hitters")}
    memory = "budget"
    needs_every_query = True
    source = "H2O §4.1 Alg. 1 (Python twin of the built-in h2o)"

    def __init__(self, stream, budget, heavy_ratio):
        super().__init__(stream)
        heavy = min(max(int(math.floor(heavy_ratio * budget + 0.5)), 1), budget - 1)
        self.budget, self.recent = budget, budget - heavy
        self.store = SlotStore(budget, stream.head_dim)
        self.score = np.zeros(budget)

    def observe(self, i, k, v):
        s = self.store
        if s.size < self.budget:
            self.score[s.size] = 0.0
            s.put(s.size, i, k, v)
            return
        evictable = np.flatnonzero(s.pos[:s.size] <= i - self.recent)
        order = np.lexsort((s.pos[evictable], self.score[evictable]))  # lowest score, then oldest
        victim = evictable[order[0]]
        s.put(victim, i, k, v)
        self.score[victim] = 0.0

    def attend(self, t, q):
        answer, p = self.store.answer(q)
        acc = np.zeros(p.shape[0])
        for g in range(p.shape[1]):  # the group's attention, combined as group_agg = "mean"
            acc += p[:, g]
        self.score[:p.shape[0]] += acc / p.shape[1]
        return answer

    def cache_tokens(self):
        return self.store.size

"""The fuzz campaign's `budgets` inputs (tests/fuzz/fuzz_inputs.py): budgets files (`kvsim allocate`'s JSON, a
policy's `budgets_file`, docs/cli.md "Budgets per layer and head") with keys deleted, values swapped for extreme
ones, rows shortened or lengthened, budgets moved so the total no longer matches, or bytes flipped, replayed by
`kvsim run` on a tiny synthetic stream of 2 layers × 2 KV heads; or the file intact and the policy's
`budgets_memory` (which allocation of the file to take) set to an extreme value."""
import json
import os

from fuzz_mutators import EXTREME

BASE = {"kvsim_budgets": 1, "n_layers": 2, "n_kv_heads": 2, "n": 48, "layers": [0, 1], "granularity": "head",
        "objective": "rel_err", "policy": "h2o", "source": "fuzz",
        "allocations": [{"memory": 0.5, "memory_tokens": 24, "budgets": [[12, 36], [20, 28]]}]}
CONFIG = ('name = "fuzz_budgets"\nseed = 3\n[data]\nsynthetic = "heavy_hitter"\nn = 48\nd = 8\nn_layers = 2\n'
          'n_heads = 2\nn_kv_heads = 2\n[eval]\nevery = 8\n[[policy]]\nname = "h2o"\nmemory = 0.5\n'
          'budgets_file = "{path}"\n')


def mutate(rng):
    """A mutated copy of BASE as text, and what was done."""
    d = json.loads(json.dumps(BASE))
    a = d["allocations"][0]
    choice = rng.randrange(8)
    if choice == 7:
        return json.dumps(d), "budgets_memory = " + rng.choice(EXTREME + ["0.5", "24", "0.25"])
    if choice == 0:
        key = rng.choice(list(d))
        del d[key]
        what = f"no '{key}'"
    elif choice == 1:
        key = rng.choice(["kvsim_budgets", "n_layers", "n_kv_heads", "n", "layers", "granularity"])
        d[key] = json.loads(rng.choice([x for x in EXTREME if x not in ("nan", "inf", "-inf", "{a = 1}")]))
        what = f"{key} = {d[key]!r}"
    elif choice == 2:
        key = rng.choice(["memory", "memory_tokens", "budgets"])
        a[key] = json.loads(rng.choice(["0", "-1", "1e308", "1.5", "\"x\"", "[]", "[[1]]", "[[24, 24, 24], [24]]", "99999999999"]))
        what = f"allocations[0].{key} = {a[key]!r}"
    elif choice == 3:
        i, j = rng.randrange(2), rng.randrange(2)
        a["budgets"][i][j] += rng.choice([-13, -1, 1, 100])
        what = f"budgets[{i}][{j}] moved"
    elif choice == 4:
        a["budgets"][rng.randrange(2)].append(rng.choice([0, 1, 24]))
        what = "a row one longer"
    elif choice == 5:
        d["allocations"] = rng.choice([[], [a, a], [{}], "x"])
        what = f"allocations = {d['allocations']!r}"[:60]
    else:
        text = json.dumps(d)
        pos = rng.randrange(len(text))
        return text[:pos] + rng.choice(["", "}", "\"", "\x00", "[", ","]) + text[pos + 1:], f"byte {pos} changed"
    return json.dumps(d), what


def budgets_cases(kvsim, work, rng, count):
    cases = []
    for i in range(count):
        path = os.path.join(work, f"budgets_{i:04d}.json")
        text, what = mutate(rng)
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        cfg = os.path.join(work, f"budgets_{i:04d}.toml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(path=path) + (what + "\n" if what.startswith("budgets_memory") else ""))
        out = os.path.join(work, f"budgets_{i:04d}_out")
        cases.append(("budgets", what, [kvsim, "run", cfg, "--out", out, "--threads", "1", "--quiet"], out, [cfg, path]))
    return cases

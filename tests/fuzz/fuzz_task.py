"""The fuzz campaign's `task` inputs (tests/fuzz/fuzz_inputs.py): `kvsim task` configs of every kind
(passkey, word and the RULER suite, docs/tasks.md) with values swapped for extreme ones, lines deleted,
duplicated or swapped, keys misspelt, bytes inserted, or `--set` overrides of the [task] keys, each
asked for its prompts (`--prompts`, which reads the config, tokenizes the filler and generates every
trial) on the campaign's tiny llama2.c model and its byte-level tokenizer."""
import os

from fuzz_mutators import EXTREME, mutate_config, tiny_model

KINDS = ["passkey", "word", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery",
         "variable_tracking", "common_words", "frequent_words"]
TASK_KEYS = ["task.lengths", "task.depths", "task.trials", "task.generate", "task.needles", "task.hops", "task.chains",
             "task.common", "task.common_repeats", "task.uncommon_repeats", "task.alpha", "task.vocab", "task.examples",
             "task.value_type", "task.format", "task.match", "task.kind", "task.link_steps", "seed"]


def filler(work):
    """A filler text of made-up words in sentences (enough distinct words for common_words' lists)."""
    syl = ["ba", "ko", "ri", "mu", "te", "sa", "lo", "ni", "pe", "du", "fa", "gi"]
    words = [syl[i % 12] + syl[(i // 12) % 12] + syl[(i // 144) % 12] + "n" for i in range(300)]
    path = os.path.join(work, "task_filler.txt")
    with open(path, "w") as f:
        for _ in range(6):
            for i in range(0, len(words) - 2, 3):
                f.write(f"The {words[i]} saw a {words[i + 1]} near the {words[i + 2]}.\n")
    return path


def task_cases(kvsim, work, rng, count):
    ckpt, tok, _ = tiny_model(work)
    text = filler(work)
    cases = []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        fmt = "" if kind in ("passkey", "word") else 'format = "plain"\n'
        tmpl = ('prefix = "Find it.\\n"\nquestion = "\\nWhat is it?\\n"\n' if kind in ("passkey", "word") else "")
        base = (f'name = "fuzz_task"\nseed = 1\n[model]\ncheckpoint = "{ckpt}"\ntokenizer = "{tok}"\n[task]\n'
                f'kind = "{kind}"\n{fmt}{tmpl}filler = "{text}"\nlengths = [2400]\ndepths = [0.5]\ntrials = 1\n'
                '[[policy]]\nname = "window"\nmemory = 0.5\n')
        out = os.path.join(work, f"task_{i:04d}_out")
        os.makedirs(out)
        cfg = os.path.join(work, f"task_{i:04d}.toml")
        if rng.random() < 0.5:
            body, what = mutate_config(base, rng)
            sets = []
        else:
            body, sets = base, []
            for _ in range(rng.randint(1, 2)):
                sets += ["--set", f"{rng.choice(TASK_KEYS)}={rng.choice(EXTREME)}"]
            what = " ".join(sets[1::2])
        with open(cfg, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(body)
        argv = [kvsim, "task", cfg, "--prompts", os.path.join(out, "prompts.jsonl")] + sets
        cases.append(("task", f"{kind}: {what}", argv, out, [cfg]))
    return cases

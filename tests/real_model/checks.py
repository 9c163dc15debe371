"""The real-model test scripts' one assertion helper: check(cond, what) prints "ok" or "FAIL" and the
claim, and records each failed claim in `failures`, which a script's main() turns into its exit status
(so one run reports every failing claim, not just the first)."""

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)

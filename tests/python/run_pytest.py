#!/usr/bin/env python3
"""Runs one pytest file of the Python API for ctest: exit 0 when its tests pass, 77 (ctest SKIPPED)
when pytest, pandas or the built extension is missing or when every test skipped (each reason is
printed), else pytest's failure status.

Usage: run_pytest.py TEST_FILE BUILD_DIR [KVSIM_SHARED_DATA]"""
import os
import sys


def main():
    test, build = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        os.environ["KVSIM_SHARED_DATA"] = sys.argv[3]
    os.environ["KVSIM_BIN"] = os.path.join(build, "kvsim")
    sys.path[:0] = [os.path.join(build, "python"), os.path.dirname(os.path.abspath(test))]
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(build, "python"), os.environ.get("PYTHONPATH", "")])
    for mod in ("pytest", "pandas"):
        try:
            __import__(mod)
        except ImportError:
            print(f"SKIPPED: {sys.executable} has no {mod} (scripts/setup-venv.sh installs it into .venv)")
            return 77
    try:
        import kvsim  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: the kvsim Python module is not built ({e}; needs pybind11 in .venv and python3-dev)")
        return 77
    import pytest

    class Outcomes:
        def __init__(self):
            self.counts = {}
            self.reasons = set()

        def pytest_runtest_logreport(self, report):
            if report.when == "call" or report.outcome != "passed":
                self.counts[report.outcome] = self.counts.get(report.outcome, 0) + 1
                if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
                    self.reasons.add(report.longrepr[2])

    seen = Outcomes()
    rc = pytest.main([test, "-q", "-rs", "-p", "no:cacheprovider"], plugins=[seen])
    if rc == 0 and seen.counts.get("skipped", 0) and not seen.counts.get("passed", 0):
        print("SKIPPED: " + "; ".join(sorted(seen.reasons)))
        return 77
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The house rules of kvsim's layout, checked on the tree:

  1. no source file over 450 lines (C++, CUDA, Python, shell) and README.md at most 250 lines;
  2. no function over 80 lines (C++/CUDA: brace matching of namespace- and class-level bodies;
     Python: the ast), except in a CUDA kernel file (sim/cuda/*.cu, *.cuh) or a test, where a function
     may be longer when one of the two lines above it says why, as `layout: long: REASON` (a kernel
     whose state lives in registers or shared memory, a test that reads as one story); the mark
     anywhere else is itself a violation;
  3. layers: sim/<layer>/ and include/kvsim/<layer>/ include only their own layer and lower ones:
     core < io, cuda < analysis < policies < replay, model < cli < python (io and cuda, replay and model do
     not include each other);
  4. a plain policy does not compile against CUDA: the headers every policy file sees
     (include/kvsim/policies/policy.hpp and registry.hpp, sim/policies/factories.hpp and scorer.hpp)
     never reach include/kvsim/cuda/ through their includes; only gpu_replay.hpp does;
  5. a KVSIM_* environment variable that steers a run is read in one place: C++ sources call
     getenv("KVSIM_…") only in include/kvsim/core/runtime.hpp (the [runtime] table's overrides), except
     the variables that locate files (ENV_LOCATORS), which change nothing about a run;
  6. tests live in a folder by kind (TEST_KINDS: unit, real_model, python, cli, gpu, fuzz, house), never
     directly in tests/.

Usage: layout_test.py REPO_ROOT  (exit 1 listing every violation)
       layout_test.py --self-test (the checks flag a planted long function and a bad include)
"""
import ast
import os
import re
import sys
import tempfile

MAX_FILE, MAX_README, MAX_FUNC = 450, 250, 80
RANK = {"core": 0, "io": 1, "cuda": 1, "analysis": 2, "policies": 3, "replay": 4, "model": 4, "cli": 5, "python": 6}
SOURCE_DIRS = ("sim", "include", "tests", "plots", "scripts", "datasets")
EXTS = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".py", ".sh")
RUNTIME_HEADER = "include/kvsim/core/runtime.hpp"
ENV_LOCATORS = {"KVSIM_CUDA_MODULE", "KVSIM_PYTHON"}  # where the CUDA module and the Python are
TEST_KINDS = ("unit", "real_model", "python", "cli", "gpu", "fuzz", "house")
LONG_MARK = re.compile(r"layout: long: \S")


def may_be_long(rel):
    """Kernels and tests may hold a function over MAX_FUNC lines, when marked (rule 2)."""
    return rel.startswith("tests/") or (rel.startswith("sim/cuda/") and rel.endswith((".cu", ".cuh")))


def marked_long(lines, first):
    """Whether one of the two lines above line `first` (1-based) carries the `layout: long: REASON` mark."""
    return any(LONG_MARK.search(lines[i]) for i in range(max(0, first - 3), first - 1))


def strip_cpp(text):
    """Comments and string/char literals blanked (newlines kept, so line numbers stay)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()):  # digit separator 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def cpp_functions(text):
    """(name, first line, line count) of every function body opened at namespace or class level."""
    s = strip_cpp(text)
    stack, found, head_start = [], [], 0  # stack entries: "scope" (namespace/class) or "body"/"data"
    line = 1
    for i, c in enumerate(s):
        if c == "\n":
            line += 1
        elif c == "{":
            head = s[head_start:i]
            if any(e[0] in ("body", "data", "inner") for e in stack):
                stack.append(("inner", line))
            elif re.search(r"\b(namespace|class|struct|union|enum)\b[^()]*$", head) or 'extern ""' in head:
                stack.append(("scope", line))
            elif ")" in head and not re.search(r"=\s*$", head.strip()) and not head.strip().endswith("="):
                name = re.findall(r"([~\w:]+)\s*\(", head)
                stack.append(("body", line, name[0] if name else "?"))
            else:
                stack.append(("data", line))
            head_start = i + 1
        elif c == "}":
            if stack:
                top = stack.pop()
                if top[0] == "body":
                    found.append((top[2], top[1], line - top[1] + 1))
            head_start = i + 1
        elif c == ";":
            if not any(k[0] in ("body", "data", "inner") for k in stack):
                head_start = i + 1
    return found


def py_functions(text):
    """(name, first line, own lines): a nested def's lines count toward itself, not its parent."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own = node.end_lineno - node.lineno + 1
            for child in ast.walk(node):
                if child is not node and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if not any(isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) and p is not node and
                               child in list(ast.walk(p)) for p in ast.walk(node) if p is not child):
                        own -= child.end_lineno - child.lineno + 1
            out.append((node.name, node.lineno, own))
    return out


def layer_of(rel):
    parts = rel.split(os.sep)
    if parts[0] == "sim" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ["include", "kvsim"] and len(parts) > 3:
        return parts[2]
    return None


def check_file(root, rel, problems):
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    if lines > MAX_FILE:
        problems.append(f"{rel}: {lines} lines (> {MAX_FILE})")
    funcs = []
    if rel.endswith(".py"):
        funcs = py_functions(text)
    elif rel.endswith((".cpp", ".hpp", ".cu", ".cuh", ".h")):
        funcs = cpp_functions(text)
    src_lines = text.split("\n")
    for name, first, count in funcs:
        if count > MAX_FUNC and not (may_be_long(rel) and marked_long(src_lines, first)):
            problems.append(f"{rel}:{first}: function {name} is {count} lines (> {MAX_FUNC})")
    if not may_be_long(rel) and rel != "tests/house/layout_test.py":
        for i, ln in enumerate(src_lines):
            if LONG_MARK.search(ln):
                problems.append(f"{rel}:{i + 1}: 'layout: long' marks a function outside kernels and tests")
    if rel.startswith("tests/") and rel.count("/") == 1:
        problems.append(f"{rel}: a test directly in tests/ (put it in its kind's folder: {', '.join(TEST_KINDS)})")
    elif rel.startswith("tests/") and rel.split("/")[1] not in TEST_KINDS:
        problems.append(f"{rel}: tests/{rel.split('/')[1]}/ is not a test kind ({', '.join(TEST_KINDS)})")
    if rel.startswith(("sim/", "include/")) and rel.endswith((".cpp", ".hpp", ".cu", ".cuh", ".h")) and rel != RUNTIME_HEADER:
        for m in re.finditer(r'getenv\(\s*"(KVSIM_\w+)"', text):
            if m.group(1) not in ENV_LOCATORS:
                problems.append(f"{rel}: reads {m.group(1)} itself (runtime switches are [runtime] keys, read in {RUNTIME_HEADER})")
    layer = layer_of(rel)
    if layer in RANK:
        for m in re.finditer(r'#include\s+"kvsim/(\w+)/', text):
            other = m.group(1)
            if other == layer or other not in RANK:
                continue
            if RANK[other] >= RANK[layer]:
                problems.append(f"{rel}: layer '{layer}' includes kvsim/{other}/ (a higher or sibling layer)")


PLAIN_POLICY_HEADERS = ("include/kvsim/policies/policy.hpp", "include/kvsim/policies/registry.hpp",
                        "sim/policies/factories.hpp", "sim/policies/scorer.hpp")


def reaches_cuda(root, rel, seen=None):
    """The include chain from `rel` to a kvsim/cuda/ header, or None (quoted includes resolved
    against include/ and the including file's folder)."""
    seen = set() if seen is None else seen
    if rel in seen:
        return None
    seen.add(rel)
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_cpp_keep_includes(f.read())
    for m in re.finditer(r'#include\s+"([^"]+)"', text):
        inc = m.group(1)
        if inc.startswith("kvsim/cuda/"):
            return [rel, inc]
        for cand in (os.path.join("include", inc), os.path.normpath(os.path.join(os.path.dirname(rel), inc))):
            chain = reaches_cuda(root, cand, seen)
            if chain:
                return [rel] + chain
    return None


def strip_cpp_keep_includes(text):
    """Comments removed, include lines kept (strip_cpp blanks their string literals)."""
    return re.sub(r"//[^\n]*", "", text)


def check_tree(root):
    problems = []
    for rel in PLAIN_POLICY_HEADERS:
        chain = reaches_cuda(root, rel)
        if chain:
            problems.append(f"{rel}: a plain policy header reaches the CUDA API: {' -> '.join(chain)}")
    for top in SOURCE_DIRS:
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if n.endswith(EXTS):
                    check_file(root, os.path.relpath(os.path.join(d, n), root), problems)
    readme = os.path.join(root, "README.md")
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_README:
            problems.append(f"README.md: {n} lines (> {MAX_README})")
    return problems


def self_test():
    long_fn = "namespace kvsim {\nint f(int x) {\n" + "  x += 1;\n" * 85 + "  return x;\n}\n}\n"
    short_fn = "namespace kvsim {\nstruct A {\n  int g() const {\n    return 1;\n  }\n};\nconst int t[] = {1, 2};\n}\n"
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "sim", "io"))
        with open(os.path.join(root, "sim", "io", "bad.cpp"), "w") as f:
            f.write('#include "kvsim/replay/engine.hpp"\n' + long_fn)
        with open(os.path.join(root, "sim", "io", "good.cpp"), "w") as f:
            f.write('#include "kvsim/core/error.hpp"\n' + short_fn + 'const char* m = std::getenv("KVSIM_PYTHON");\n')
        with open(os.path.join(root, "sim", "io", "env.cpp"), "w") as f:
            f.write('const char* e = std::getenv("KVSIM_CUDA_WORKERS");\n')
        os.makedirs(os.path.join(root, "tests", "unit"))
        marked = "// layout: long: one story\n" + long_fn
        for rel, body in (("tests/unit/t_marked.cpp", marked), ("tests/unit/t_unmarked.cpp", long_fn),
                          ("sim/io/marked.cpp", marked), ("tests/loose.py", "x = 1\n")):
            with open(os.path.join(root, rel), "w") as f:
                f.write(body)
        problems = check_tree(root)
    assert not any("t_marked.cpp" in p for p in problems), problems
    assert any("t_unmarked.cpp:2: function f" in p for p in problems), problems
    assert any("sim/io/marked.cpp:3: function f" in p for p in problems), problems
    assert any("sim/io/marked.cpp:1: 'layout: long' marks" in p for p in problems), problems
    assert any("tests/loose.py: a test directly in tests/" in p for p in problems), problems
    assert any("env.cpp: reads KVSIM_CUDA_WORKERS itself" in p for p in problems), problems
    assert any("function f is 88 lines" in p for p in problems), problems
    assert any("includes kvsim/replay/" in p for p in problems), problems
    assert not any("good.cpp" in p for p in problems), problems
    with tempfile.TemporaryDirectory() as root:  # policy.hpp -> hd.hpp -> cuda.hpp is flagged
        os.makedirs(os.path.join(root, "include", "kvsim", "policies"))
        os.makedirs(os.path.join(root, "include", "kvsim", "core"))
        with open(os.path.join(root, "include", "kvsim", "policies", "policy.hpp"), "w") as f:
            f.write('#include "kvsim/core/hd.hpp"\n')
        with open(os.path.join(root, "include", "kvsim", "core", "hd.hpp"), "w") as f:
            f.write('// #include "kvsim/cuda/not_really.hpp"\n#include "kvsim/cuda/cuda.hpp"\n')
        chain = reaches_cuda(root, "include/kvsim/policies/policy.hpp")
        assert chain == ["include/kvsim/policies/policy.hpp", "include/kvsim/core/hd.hpp", "kvsim/cuda/cuda.hpp"], chain
        with open(os.path.join(root, "include", "kvsim", "core", "hd.hpp"), "w") as f:
            f.write('// #include "kvsim/cuda/cuda.hpp"\n')
        assert reaches_cuda(root, "include/kvsim/policies/policy.hpp") is None
    print("layout_test: self-test flags a long function (a marked one only outside kernels and tests), an upward "
          "include and a policy header reaching CUDA, a runtime variable read outside runtime.hpp, a test outside a "
          "kind's folder, and nothing else")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    if len(sys.argv) != 2:
        print("usage: layout_test.py REPO_ROOT | --self-test", file=sys.stderr)
        return 2
    problems = check_tree(sys.argv[1])
    for p in problems:
        print(p)
    print(f"layout_test: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

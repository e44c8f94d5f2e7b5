"""The house rules of the code's shape (the developers' guide): ruff checks lines and pyflakes' findings
(ruff.toml); an `ast` walk checks that no file runs over 400 lines and no function over 60; the C kernels are held to
the same limits, and to ruff's 120 characters a line."""
import ast
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_LINE = 400, 60, 120
FLOORS = tuple(sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()))  # every package folder


def ruff(*paths) -> subprocess.CompletedProcess:
    pytest.importorskip("ruff", reason="ruff is installed with the tests' extras (pip install -e .[test])")
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "ruff.toml"),
                           "--output-format", "concise", *map(str, paths)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def too_long(source: str) -> list[str]:
    """What of one file's source breaks the length rules: the file itself, or each function (its name, lines)."""
    lines = source.count("\n")
    found = [f"the file ({lines} lines)"] if lines > MAX_FILE_LINES else []
    return found + [f"{fn.name} ({fn.end_lineno - fn.lineno + 1} lines)" for fn in ast.walk(ast.parse(source))
                    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES]


def c_too_long(source: str) -> list[str]:
    """What of one C file breaks the rules: the file, a line, or a function (a definition opening at column 0 and
    closing at the next `}` there; a prototype, ending in `;` before any `{`, is none)."""
    lines = source.splitlines()
    found = [f"the file ({len(lines)} lines)"] if len(lines) > MAX_FILE_LINES else []
    found += [f"line {i} ({len(line)} characters)" for i, line in enumerate(lines, 1) if len(line) > MAX_LINE]
    start = name = None
    for i, line in enumerate(lines, 1):
        if start is None and re.match(r"[A-Za-z_][^;]*\(", line) and not line.startswith("typedef"):
            start, name = i, re.search(r"(\w+)\((?!\()", line).group(1)  # past __attribute__((...))
        if start is None:
            continue
        code = line.split("/*")[0].rstrip()
        if "{" not in code and code.endswith(";") and not any("{" in lines[j - 1] for j in range(start, i)):
            start = None  # a prototype
        elif line.startswith("}") or (i == start and code.endswith("}")):
            if i - start + 1 > MAX_FUNCTION_LINES:
                found.append(f"{name} ({i - start + 1} lines)")
            start = None
    return found


def test_ruff_finds_nothing_in_the_repository():
    proc = ruff(".")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_no_file_or_function_runs_too_long():
    found = [f"{path.relative_to(ROOT)}: {what}" for floor in FLOORS for path in sorted((ROOT / floor).rglob("*.py"))
             for what in too_long(path.read_text())]
    assert not found, "split them: " + "; ".join(found)


def test_no_c_file_function_or_line_runs_too_long():
    c_files = [path for floor in FLOORS for suffix in ("*.c", "*.h") for path in sorted((ROOT / floor).rglob(suffix))]
    assert c_files
    found = [f"{path.relative_to(ROOT)}: {what}" for path in c_files for what in c_too_long(path.read_text())]
    assert not found, "split them: " + "; ".join(found)


def test_the_rules_read_every_package_folder():
    assert {"mlperf", "suts", "scenarios", "serving", "roofline", "reports", "training", "commands", "labs",
            "tests"} <= set(FLOORS)


def test_the_rules_see_what_breaks_them(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = '" + "a" * 130 + "'\n")
    proc = ruff(bad)
    assert proc.returncode == 1 and "E501" in proc.stdout and "F401" in proc.stdout
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert too_long("def f():\n" + body) == [f"f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert too_long("x = 1\n" * (MAX_FILE_LINES + 1))[0].startswith("the file")
    c_body = "".join(f"    x += {i};\n" for i in range(MAX_FUNCTION_LINES))
    assert c_too_long("int f(int x,\n      int y);\nint f(int x) {\n" + c_body + "}\n") == [
        f"f ({MAX_FUNCTION_LINES + 2} lines)"]
    assert c_too_long("int one(void) { return 1; }\nint two(void) {\n    return 2;\n}\n") == []
    assert c_too_long("/* " + "a" * MAX_LINE + " */\n") == [f"line 1 ({MAX_LINE + 6} characters)"]

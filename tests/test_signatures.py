"""A house rule of the fast path (issue 81): no function on it takes more than 5 positional parameters, so a call
names its modes (last_only=, tree=, lens=, ...) instead of lining them up by position."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The model, its cache and every module a SUT's step or cycle runs through. suts/fast/triton_kernels.py is left out:
# a Triton kernel is launched with its pointers, strides and block sizes by position.
FAST_PATH = ["mlperf/model.py", "mlperf/cache.py",
             *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "suts").rglob("*.py"))
               if p.name not in ("triton_kernels.py", "__init__.py"))]


def positional(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args if a.arg not in ("self", "cls")]


def test_no_function_on_the_fast_path_takes_more_than_five_positional_parameters():
    crowded = [f"{path}:{fn.lineno} {fn.name}({', '.join(positional(fn))})"
               for path in FAST_PATH for fn in ast.walk(ast.parse((ROOT / path).read_text()))
               if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(positional(fn)) > 5]
    assert not crowded, "name the rest (keyword-only, after *): " + "; ".join(crowded)


def test_the_rule_sees_a_crowded_function():
    fn = ast.parse("def f(self, a, b, c, d, e, g, *, h=1): pass").body[0]
    assert len(positional(fn)) == 6

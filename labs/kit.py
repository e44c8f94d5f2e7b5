"""The labs, their files, and the instructor's tools: starter code stripped from the reference solutions, a
student's working copy, and the student tree to hand out.

A reference solution marks each part the student writes between `# BEGIN SOLUTION [what it does]` and
`# END SOLUTION` (`<!-- BEGIN SOLUTION -->` ... `<!-- END SOLUTION -->` in Markdown). The starter replaces each
block with a stub: `raise NotImplementedError("TODO: what it does")` in Python, an answer placeholder in Markdown.
"""
import ast
import re
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABS_DIR = ROOT / "labs"
WORK = Path("mylabs")  # the student's working copies, relative to the repository root
BEGIN = re.compile(r"^(\s*)(?:#|<!--)\s*BEGIN SOLUTION\s*(.*?)\s*(?:-->)?\s*$")
END = re.compile(r"^\s*(?:#|<!--)\s*END SOLUTION\s*(?:-->)?\s*$")
# What the student tree leaves out: the reference solutions and the tests that grade them.
INSTRUCTOR_ONLY = ("labs/*/solution/*", "tests/labs/test_solutions.py", "tests/labs/test_classroom.py",
                   "tests/labs/test_class_bank.py")


@dataclass(frozen=True)
class Lab:
    number: int
    folder: str  # under labs/: README.md (the handout), solution/ (instructor only), starter/ (generated)
    # the files a student edits and hands in, the same names in solution/, starter/ and mylabs/: the code first, the
    # written answers last
    files: tuple[str, ...]
    title: str
    # the harness's modules and names that hold this lab's answers: its starter may neither import nor name them
    # (borrowed)
    answered_by: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return LABS_DIR / self.folder

    @property
    def module(self) -> str:
        """The Python file a student writes, without .py."""
        return self.files[0].removesuffix(".py")

    @property
    def answers(self) -> str:
        """The written answers' file a student fills in."""
        return self.files[-1]


LABS = {lab.number: lab for lab in (
    Lab(1, "01-speculative", ("lab1_speculative.py", "lab1_answers.md"), "Speculative decoding, greedy",
        ("suts.speculative", "suts.drafting")),
    Lab(2, "02-rejection", ("lab2_rejection.py", "lab2_answers.md"), "Rejection sampling",
        ("suts.speculative.accept", "suts.speculative.accept_tree", "suts.speculative.residual")),
    Lab(3, "03-roofline", ("lab3_roofline.py", "lab3_answers.md"), "Roofline",
        ("mlperf.cost", "roofline.analytic", "roofline.speculative")),
)}


def borrowed(lab: Lab, source: str) -> list[str]:
    """The names a lab's code imports or spells out (`a.b.c`) that are, or live in, the harness's code holding the
    lab's answer (`lab.answered_by`): a starter that borrows one hands the answer over."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a file that does not parse borrows nothing (its grade says why it earns nothing)
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.Attribute):
            names.append(ast.unparse(node))
    return sorted({n for n in names for answer in lab.answered_by if n == answer or n.startswith(answer + ".")})


def get(number) -> Lab:
    try:
        return LABS[int(number)]
    except (KeyError, ValueError):
        raise ValueError(f"no lab {number!r}; the labs are {', '.join(map(str, LABS))}") from None


def strip(text: str, markdown: bool = False) -> str:
    """The starter version of a reference file: every marked solution block replaced by a stub."""
    out, block = [], None
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if block is not None:
                raise ValueError(f"line {n}: BEGIN SOLUTION inside another solution block")
            block = begin
        elif end:
            if block is None:
                raise ValueError(f"line {n}: END SOLUTION without BEGIN SOLUTION")
            indent, what = block.groups()
            out.append(f"{indent}*Your answer here.*\n" if markdown else
                       f"{indent}raise NotImplementedError({('TODO: ' + what) if what else 'TODO'!r})\n")
            block = None
        elif block is None:
            out.append(line)
    if block is not None:
        raise ValueError("BEGIN SOLUTION without END SOLUTION")
    return "".join(out)


def solution_lines(text: str) -> set[str]:
    """The non-trivial lines inside a reference file's solution blocks (what must never reach a student)."""
    lines, inside = set(), False
    for line in text.splitlines():
        if BEGIN.match(line) or END.match(line):
            inside = bool(BEGIN.match(line))
        elif inside and len(line.strip()) > 12:
            lines.add(line.strip())
    return lines


def make_starters() -> list[Path]:
    """(Re)generate every lab's starter/ from its solution/; returns the files written."""
    written = []
    for lab in LABS.values():
        for name in lab.files:
            target = lab.path / "starter" / name
            target.parent.mkdir(exist_ok=True)
            target.write_text(strip((lab.path / "solution" / name).read_text(), name.endswith(".md")))
            written.append(target)
    return written


def start(lab: Lab, work: Path = WORK) -> list[str]:
    """Copy the lab's starter files into `work`; a file the student already has is never overwritten."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "__init__.py").touch()
    lines = []
    for name in lab.files:
        dest = work / name
        if dest.exists():
            lines.append(f"kept your {dest} (delete it to start over)")
        else:
            shutil.copyfile(lab.path / "starter" / name, dest)
            lines.append(f"wrote {dest}")
    return lines


def zip_files(out: Path, files: dict[str, Path], executable: tuple[str, ...] = ()) -> Path:
    """A zip of `files` (name in the zip -> file), the names in `executable` marked so, written whole or not at all."""
    if out.suffix != ".zip":
        raise ValueError(f"{out}: the file to write is a .zip")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, f in sorted(files.items()):
            info = zipfile.ZipInfo.from_file(f, name)
            if Path(name).name in executable:
                info.external_attr = 0o755 << 16
            z.writestr(info, f.read_bytes(), zipfile.ZIP_DEFLATED)
    tmp.replace(out)
    return out


def student_makefile(text: str) -> str:
    """The Makefile less every target whose recipe needs a file the student tree leaves out (`make class-bank`)."""
    left_out = [p for p in INSTRUCTOR_ONLY if "*" not in p]
    blocks = re.split(r"\n(?=[a-z][\w.-]*:)", text)
    dropped = {b.split(":", 1)[0] for b in blocks if any(p in b for p in left_out)}
    kept = "\n".join(b for b in blocks if b.split(":", 1)[0] not in dropped)
    return re.sub(r"^\.PHONY:.*$", lambda m: " ".join(w for w in m.group(0).split() if w not in dropped), kept,
                  flags=re.M)


def release(out: Path) -> int:
    """Write the student tree: every tracked file but the instructor-only ones, checked for leaked solutions."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty; give a new directory")
    try:
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                                 text=True).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        raise ValueError(f"{ROOT} is not a git checkout; the release copies its tracked files") from None
    files = [f for f in tracked if f and not any(Path(f).match(p) for p in INSTRUCTOR_ONLY)]
    secrets = set().union(*(solution_lines((lab.path / "solution" / name).read_text())
                            for lab in LABS.values() for name in lab.files))
    starters = {lab.path.relative_to(ROOT) / "starter" / lab.files[0]: lab for lab in LABS.values()}
    for f in files:
        src, dest = ROOT / f, out / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        if f == "Makefile":
            dest.write_text(student_makefile(dest.read_text()))
        leaked = [line.strip() for line in dest.read_text().splitlines() if line.strip() in secrets] \
            if f.startswith("labs/") and dest.suffix in (".py", ".md") else []
        lab = starters.get(Path(f))
        leaked += [f"the harness's answer {name}" for name in borrowed(lab, dest.read_text())] if lab else []
        if leaked:
            shutil.rmtree(out)
            raise ValueError(f"{f} contains solution code ({leaked[0]!r}); regenerate the starters "
                             f"(python -m labs starters) and commit them")
    return len(files)

"""Written answers: each lab's answers file (`## N. question` headings, the answer below each), checked as there
and the student's own, never marked: the grade file carries them for the instructor, who grades them by hand."""
import re
from pathlib import Path

from labs.grading import Check, Fail

PLACEHOLDER = "*Your answer here.*"
MIN_ANSWER = 200  # characters: a few sentences
NAME = "written answers (by hand)"  # the check's name, which the class summary flags


def answers_of(path: Path | None) -> dict[str, str]:
    """Each question of an answers file ("## N. ..." heading) with the answer below it, stripped."""
    text = re.sub(r"<!--.*?-->", "", path.read_text(), flags=re.S) if path and path.is_file() else ""
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    return {q.strip(): a.strip() for q, _, a in (section.partition("\n") for section in sections)}


def problem(text: str, question: str, handout: str) -> str | None:
    """Why an answer does not count as one (missing, too short, copied, no figure), else None."""
    flat = re.sub(r"\s+", " ", text)
    if not text or text == PLACEHOLDER:
        return "missing"
    if len(text) < MIN_ANSWER:
        return f"only {len(text)} characters (a few sentences: at least {MIN_ANSWER})"
    if any(flat[i:i + 80] in handout + " " + question for i in range(0, max(1, len(flat) - 80), 40)):
        return "the question or the handout copied"
    if not re.search(r"\d", text):
        return "no figure you measured (quote the numbers you cite)"
    return None


def written(answers: Path, starter: Path, handout: Path) -> str:
    """Every question of the starter's answers file answered in `answers`; a Fail naming the first that is not."""
    given, questions = answers_of(answers), answers_of(starter)
    text = re.sub(r"\s+", " ", handout.read_text())
    if not given:
        raise Fail(f"no written answers in {answers}: your instructor grades them")
    for question in questions:
        why = problem(given.get(question, ""), question, text)
        if why:
            raise Fail(f"{question.split('. ')[0]}. {why}: your instructor grades the answers; each must be "
                       f"yours, a few sentences citing your figures")
    return f"{len(questions)} answered ({answers.name}): your instructor grades them; they are in the grade file"


def written_check(answers: Path, starter: Path, handout: Path) -> Check:
    """The check every lab ends with: worth no points, needed for full marks."""
    return Check(NAME, 0, lambda: written(answers, starter, handout), f"fill in {answers.name}")

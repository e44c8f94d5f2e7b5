"""The command-line reference (docs/cli.md), written from the parsers themselves so that it cannot drift from them:
`make docs` writes it again, and a test fails when the page and the parsers differ."""
import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's commands by name, in the order `python -m mlperf --help` lists them."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each command's one-paragraph help, as `python -m mlperf --help` gives it."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: " ".join(a.help.split()) for a in sub._choices_actions}


def cell(text) -> str:
    """A Markdown table cell: one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def option_rows(parser: argparse.ArgumentParser) -> list[str]:
    """One table row per option or positional argument: its flags (or name), its default, its help."""
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flags = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.dest}` (positional)"
        if action.choices and not isinstance(action.choices, dict):
            flags += " {" + ",".join(map(str, action.choices)) + "}"
        text, stated = stated_default(cell(action.help or ""))
        shown = action.default not in (None, argparse.SUPPRESS, False) and action.option_strings
        default = f"`{relative(action.default)}`" if shown else stated or ("required" if action.required else "")
        rows.append(f"| {flags} | {default} | {text} |")
    return rows


def relative(value) -> str:
    """A default as a cell, a path inside the repository given from its root (the page reads alike in any clone)."""
    return cell(value).replace(f"{ROOT}/", "")


def stated_default(text: str) -> tuple[str, str]:
    """A help text's closing "(default ...)" apart from the rest: the defaults that come from RunConfig's settings,
    not argparse's, are stated there."""
    start = text.rfind("(default")
    if start < 0 or not text.endswith(")") or text[start:].count("(") != text[start:].count(")"):
        return text, ""
    return text[:start].rstrip(), text[start + 1:-1].removeprefix("default").lstrip(": ")


def page(parser: argparse.ArgumentParser) -> str:
    """docs/cli.md: every command, its help and a table of its options with their defaults."""
    lines = ["# Command-line reference", "", "[README](../README.md) · [index](index.md)", "",
             "Every command of `python -m mlperf` (`.venv/bin/python -m mlperf`, or `python` in the activated venv) "
             "with its options and their defaults, written from the parsers by `make docs`; a test fails when this "
             "page and the code differ. `python -m mlperf COMMAND --help` prints the same.", ""]
    for name, sub in commands(parser).items():
        rows = option_rows(sub)
        table = ["| option | default | what it is |", "|---|---|---|", *rows, ""] if rows else []
        lines += [f"## {name}", "", helps(parser)[name], "", *table]
    return "\n".join(lines)


if __name__ == "__main__":
    from commands.cli import parser as cli_parser
    PAGE.write_text(page(cli_parser()))
    print(f"wrote {PAGE}")

"""The command line's own help: every command's text renders (a stray % in a docstring breaks argparse)."""
import pytest

from commands.cli import main

COMMANDS = ["run", "accuracy", "bench", "smoke", "report", "sweep", "profile", "peaks", "generate"]


@pytest.mark.parametrize("argv", [[]] + [[c] for c in COMMANDS])
def test_every_help_renders(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0 and "usage: python -m mlperf" in capsys.readouterr().out

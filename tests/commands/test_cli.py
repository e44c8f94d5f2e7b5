"""The command line's own help: every command's text renders (a stray % in a docstring breaks argparse)."""
import pytest

from commands.cli import main

COMMANDS = ["run", "accuracy", "bench", "smoke", "report", "sweep", "profile", "peaks", "generate", "random-model"]


@pytest.mark.parametrize("argv", [[]] + [[c] for c in COMMANDS])
def test_every_help_renders(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0 and "usage: python -m mlperf" in capsys.readouterr().out


def test_random_model_writes_a_checkpoint_of_the_geometry(tmp_path, capsys):
    from mlperf.checkpoint import load_model
    from mlperf.model import GEOMETRIES
    assert main(["random-model", "draft", str(tmp_path / "d"), "--init-seed", "3"]) == 0
    assert load_model(tmp_path / "d").config == GEOMETRIES["draft"]
    assert "random weights (seed 3)" in capsys.readouterr().out
    assert main(["random-model", "gpt5", str(tmp_path / "x")]) == 2
    assert "unknown geometry 'gpt5'" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_no_fast_reaches_the_run_config(monkeypatch):
    seen = []

    def run(cfg, *args, **kwargs):
        seen.append(cfg.fast)
        raise KeyboardInterrupt
    monkeypatch.setattr("scenarios.run.run", run)
    main(["run", "--no-fast"])
    main(["run"])
    assert seen == [False, True]


def test_no_flag_is_declared_twice_in_the_commands():
    """Each flag has one declaration and one meaning: a run's settings come from RunConfig's fields, the rest from
    the one helper or line that declares them."""
    import re
    from collections import Counter
    from tests.helpers import ROOT
    declared = Counter(flag for path in sorted((ROOT / "commands").glob("*.py"))
                       for flag in re.findall(r"add_argument\(\s*f?\"(--[\w{}-]+)\"", path.read_text()))
    fields = {f"--{name.replace('_', '-')}" for name in __import__("scenarios.config", fromlist=["RunConfig"])
              .RunConfig.__dataclass_fields__}
    assert [f for f, n in declared.items() if n > 1] == []
    assert declared.keys() & fields == set()  # a command of several runs takes --sut, --scenario repeatable
    assert "def add_several(" in (ROOT / "commands" / "options.py").read_text()

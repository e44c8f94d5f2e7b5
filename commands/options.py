"""Command-line options in one place: every run flag made from a RunConfig field (its type, its default and its
help, scenarios/config.py), the RunConfig built back from parsed arguments, and the options bench and smoke share."""
import json
import re
from dataclasses import fields
from typing import get_args


def add_run_options(parser, names=None, settings=None, defaults=None) -> None:
    """A flag for each field of `settings` (a dataclass of scenarios.config.setting fields; default RunConfig), or
    each of `names`, typed as the field is; a flag left out is None, so that the field's default, or a --config
    file's value, stands, unless the command gives one of its own (`defaults`: name -> value, shown in the help)."""
    from scenarios.config import RunConfig
    from suts.registry import SUTS
    for f in fields(settings or RunConfig):
        if names is not None and f.name not in names:
            continue
        kind = next(t for t in get_args(f.type) or (f.type,) if t is not type(None))
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        default = (defaults or {}).get(f.name, f.default)
        options = {"dest": f.name, "help": help_text(f, SUTS, default)}
        if defaults and f.name in defaults:
            options["default"] = default
        if kind is bool:
            options.update(action="store_false" if f.default else "store_true", default=None)
        elif kind in (int, float):
            options["type"] = kind
        elif kind is not str:
            raise TypeError(f"RunConfig.{f.name}: no flag for a field of type {f.type}")
        parser.add_argument(flag, **options)
        if f.name == "endpoint":
            parser.add_argument("--api-key", help="with --endpoint: the server's key, sent as a Bearer token "
                                                  "(default: $MLPERF_API_KEY; never written to the results)")


def help_text(f, suts, default) -> str:
    """A flag's help: its setting's, the registered SUTs named for --sut, its default where the text names none."""
    text = f.metadata["help"] + (f"; registered: {', '.join(suts)}" if f.name == "sut" else "")
    if default != f.default:  # the command's own, in place of the setting's
        return f"{re.sub(r' [(]default[^)]*[)]$', '', text)} (this command's default: {default})"
    shown = default is not None and not isinstance(default, bool) and "default" not in text
    return text + (f" (default {default})" if shown else "")


def options_of(args, settings):
    """A settings dataclass (a server's Listen, say) from the parsed flags add_run_options made for it: the flags
    given, its defaults for the rest."""
    return settings(**{f.name: getattr(args, f.name) for f in fields(settings) if getattr(args, f.name) is not None})


def run_config(args, **overrides):
    """The RunConfig the arguments ask for: a --config file's settings, then the flags given, then `overrides`."""
    from scenarios.config import RunConfig
    given = {f.name: getattr(args, f.name) for f in fields(RunConfig) if getattr(args, f.name, None) is not None}
    base = config_file(args.config) if getattr(args, "config", None) else {}
    if (given.get("endpoint") or base.get("endpoint")) and "sut" not in given and "sut" not in base:
        overrides = {"sut": "http", **overrides}  # the results' name for a server that --sut did not name
    return RunConfig(**{**base, **given, **overrides})


def config_file(path) -> dict:
    """Run settings from a JSON file: a RunConfig's fields, or a run's metrics.json (its config is reused)."""
    from scenarios.config import RunConfig
    try:
        raw = json.loads(open(path, encoding="utf-8").read())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read run settings from {path}: {e}") from None
    raw = raw.get("config", raw) if isinstance(raw, dict) else raw
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of run settings, got a {type(raw).__name__}")
    unknown = sorted(raw.keys() - {f.name for f in fields(RunConfig)})
    if unknown:
        raise ValueError(f"{path}: unknown run settings {', '.join(unknown)}")
    return raw


COUNTS = ("samples", "max_new_tokens", "gamma")  # add_pair_options' counts
SYNTHETIC = ("synthetic_acceptance_rates", "synthetic_acceptance_length")  # suts/synthetic.py: as vLLM names them


def add_pair_options(parser, tokens: int, samples: int | None = None, draft: bool = True) -> None:
    """The options bench, smoke, profile and generate share, made from RunConfig's settings as every run flag is:
    the model pair and gamma, new tokens a prompt (this command's `tokens` by default) and how many held-out
    prompts (`samples` by default; no flag where it is None). run_defaults checks them (COUNTS) as `run` does."""
    from scenarios.config import RunConfig
    own = {"target": RunConfig.target, "max_new_tokens": tokens, **({"draft": RunConfig.draft,
                                                                     "gamma": RunConfig.gamma} if draft else {}),
           **({"samples": samples} if samples else {})}
    add_run_options(parser, tuple(own), defaults=own)


def run_defaults(args, names) -> None:
    """The flags add_run_options made for `names` on a command that reads them from args (bench, smoke, peaks,
    profile), RunConfig's defaults where they were left out, checked by its rules (one line each)."""
    from scenarios.config import RunConfig
    for name in names:
        if getattr(args, name) is None:
            setattr(args, name, getattr(RunConfig, name))
    RunConfig(**{name: getattr(args, name) for name in names}).validate()


def measurable(suts, target: str, paths: dict[str, str] | None = None) -> list[str]:
    """`suts` less those whose drafter's checkpoint (from `paths` by kind; default RunConfig's) the pair lacks or
    was made for another target (an EAGLE head's), each skipped in one line, so that a series over someone's own
    pair measures the rest."""
    from suts.registry import missing_part
    from scenarios.config import RunConfig
    kept = []
    for name in suts:
        if why := missing_part(name, target, paths or RunConfig(target=target).paths()):
            print(f"skipped {name}: {why}")
        else:
            kept.append(name)
    return kept


SEVERAL = {"sut": "a SUT to include, registered or package.module:Class", "scenario": "a scenario to include",
           "pair": "a model pair to include"}


def add_several(parser, setting: str, default: str | tuple[str, ...]) -> None:
    """A run setting that a command of several runs takes repeatable (--sut, --scenario): args.suts, args.scenarios.
    `default` is the command's own tuple (its help lists it) or a sentence."""
    listed_default = ", ".join(default) if isinstance(default, tuple) else default
    parser.add_argument(f"--{setting}", dest=f"{setting}s", action="append",
                        help=f"{SEVERAL[setting]} (repeatable; default {listed_default})")


def add_rounds(parser, default: int, text: str) -> None:
    """--rounds: how many turns the SUTs of a command that compares them take (smoke, whatif)."""
    parser.add_argument("--rounds", type=int, default=default, help=text)


def listed(text: str | None, kind, what: str, default: tuple) -> tuple:
    """A comma-separated option as a tuple of `kind`, or `default` when it was not given."""
    try:
        return tuple(kind(v) for v in text.split(",")) if text else default
    except ValueError:
        raise ValueError(f"{what} takes comma-separated {'integers' if kind is int else 'numbers'}, got {text!r}"
                         ) from None

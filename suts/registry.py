"""SUTs by name, plus `package.module:ClassName` plug-ins, and building one from checkpoint paths.

Every speculative name is a (drafter, shape) pair of the one Speculative SUT: one `register` line per drafter below
is all there is to spec-int8-tree or ngram-auto, and a new drafter's SUTs are one more. A drafter's family (its
Proposer class, suts/drafting.py) says what a draft step costs and what checkpoint it loads.
"""
import gc
import inspect

import torch

from mlperf import HEAD
from mlperf.devices import default_dtype
from mlperf.checkpoint import load_model
from suts.base import SUT
from suts.baseline import Baseline
from suts.drafting import DRAFT, DraftModel, Part
from suts.eagle import Head
from suts.ngram import host_drafter
from suts.plugins import plugin
from suts.fast.quantize import quantize_int8
from suts.fast.step import WEIGHTS
from suts.speculative import SHAPES, Speculative
from suts.synthetic import Synthetic

DRAFTERS: dict = {}  # a registered drafter's name -> what makes its Proposer from the run's drafter options
SPECULATIVE: dict[str, tuple[str, str]] = {}  # a speculative SUT's name -> (its drafter, its shape)
SUTS = ["baseline"]  # every registered name: the baseline, then the chains, the trees and the autos


def register(name: str, make, shapes: tuple[str, ...] = SHAPES) -> None:
    """A drafter's SUTs in one line: `name` drafting a chain, `name-tree` a token tree, `name-auto` a chain whose
    gamma a planner picks each cycle (those of `shapes`), each the one Speculative SUT over make(**options)."""
    DRAFTERS[name] = make
    for form in shapes:
        SPECULATIVE[name if form == "chain" else f"{name}-{form}"] = (name, form)
    SUTS[1:] = sorted(SPECULATIVE, key=lambda n: SHAPES.index(SPECULATIVE[n][1]))


register("spec", lambda **_: DraftModel())  # the draft model
register("spec-int8", lambda **_: DraftModel(int8=True), ("chain", "tree"))  # the draft model, int8 linear weights
register("spec-self-int8", lambda **_: DraftModel(self_int8=True), ("chain",))  # an int8 copy of the target
register("ngram", lambda drafter=None: host_drafter(drafter))  # prompt lookup, or the run's --drafter
register("eagle", lambda **_: Head())  # an EAGLE head on the target's features
DRAFTER_OPTIONS = ("drafter",)  # the ngram SUTs': a Drafter, or package.module:Class (--drafter)


def sut_class(name: str) -> type[SUT]:
    """The SUT class for a registered name or a `package.module:ClassName` plug-in."""
    if name == "baseline":
        return Baseline
    if name in SPECULATIVE:
        return Speculative
    if ":" not in name:
        raise ValueError(f"unknown SUT {name!r}; choose one of {', '.join(SUTS)} or give package.module:ClassName")
    cls = plugin(name, "SUT plug-in")
    if not (inspect.isclass(cls) and callable(getattr(cls, "generate", None))):
        raise ValueError(f"SUT plug-in {name!r} is not a class with a generate() method")
    return cls


def shape(name: str) -> str | None:
    """A registered speculative SUT's shape ("chain", "tree", "auto"); None for the baseline and plug-ins."""
    return SPECULATIVE[name][1] if name in SPECULATIVE else None


def drafts_by_lookup(name: str) -> bool:
    """The ngram SUTs (ngram, ngram-tree, ngram-auto): the ones a `--drafter` is for."""
    return name in SPECULATIVE and SPECULATIVE[name][0] == "ngram"


def part_of(name: str) -> Part | None:
    """The checkpoint a SUT drafts from beside its target (its drafter's part; a plug-in's with needs_draft, the
    draft), or None."""
    if name in SPECULATIVE:
        return DRAFTERS[SPECULATIVE[name][0]]().part
    return DRAFT if getattr(sut_class(name), "needs_draft", False) else None


def missing_part(name: str, target: str, paths: dict[str, str]) -> str | None:
    """Why the pair cannot run SUT `name` (its drafter's checkpoint, from `paths` by kind, missing or made for
    another target), else None: a series of SUTs skips it in one line and measures the rest."""
    part = part_of(name) if name in SPECULATIVE else None  # a plug-in, or a server's label, brings its own parts
    if part is None:
        return None
    if not paths.get(part.kind):
        return f"its drafter loads a {part.kind} checkpoint and none is given (--parts {part.kind}=DIR)"
    return part.check(paths[part.kind], target)


def make_sut(name: str, target, draft=None, eos_id: int | None = None, synthetic=None, **options) -> SUT:
    """A SUT from models in memory: a registered name (a speculative one from its drafter, the run's drafter
    options and its shape) or a plug-in class; the options each takes (gamma, adaptive, tree, ...) go to it.
    `synthetic`: (Acceptance, reference outputs by prompt) for a chain SUT's drafter (suts/synthetic.py)."""
    if synthetic is not None:
        check_synthetic(name)
    if name in SPECULATIVE:
        drafter, form = SPECULATIVE[name]
        given = {k: options.pop(k) for k in DRAFTER_OPTIONS if options.get(k) is not None}
        if given and not drafts_by_lookup(name):
            raise ValueError(f"SUT {name} drafts with its own model; {', '.join(given)}: options of the ngram SUTs "
                             "(ngram, ngram-tree, ngram-auto)")
        proposer = DRAFTERS[drafter](**given)
        if synthetic is not None:
            proposer = Synthetic(proposer, *synthetic)
        sut = build(Speculative, target, draft, eos_id, dict(options, drafter=proposer, shape=form), name)
        sut.name = labelled(name, synthetic[0] if synthetic is not None else None)
        return sut
    return build(sut_class(name), target, draft, eos_id, options, name)


def labelled(name: str, acceptance=None) -> str:
    """A SUT's name as runs show and file it: at synthetic acceptance, marked with its rates ("spec+synthetic-0.7")."""
    return f"{name}+{acceptance.tag()}" if acceptance is not None else name


def check_synthetic(name: str) -> None:
    """Synthetic acceptance sets a chain's drafts: a registered chain or -auto SUT, one line otherwise."""
    if shape(name) not in ("chain", "auto"):
        raise ValueError(f"synthetic acceptance sets the drafts of a speculative chain (spec, spec-auto, ngram, ...), "
                         f"not SUT {name}'s")


def build(cls, target, draft, eos_id, options: dict, name: str) -> SUT:
    """cls(target, draft, eos_id=..., **the options its constructor takes), any failure of a plug-in's one line."""
    accepted = inspect.signature(cls).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted and v is not None}
    try:
        return cls(target, draft, eos_id=eos_id, **kwargs)
    except ValueError:
        raise
    except Exception as e:  # a plug-in's constructor may raise anything: one line naming the SUT
        raise ValueError(f"SUT {name} could not be built: {type(e).__name__}: {e}") from None


def build_sut(name: str, target: str, draft: str | None = None, *, device: str = "cpu",
              dtype: torch.dtype | None = None, eos_id: int | None = None, fast: bool = True,
              head: str = str(HEAD), weights: str = WEIGHTS, parts: dict[str, str] | None = None, **options) -> SUT:
    """Load the checkpoint a SUT drafts from (its drafter's part: `draft`, `head`, or one of `parts` by kind) and
    construct it (make_sut). `fast` puts every SUT's models on the fast path alike (SUT.use_fast_path: the CPU's
    fused steps, or CUDA graphs on a GPU); `weights` is what the CPU's kernels stream (fp16 panels where a model's
    weights are fp16, or fp32), or "int8" for a target quantised to int8 weights (every SUT then verifies exactly
    against that int8 target)."""
    part = part_of(name)
    path = {"draft": draft, "head": head, **(parts or {})}.get(part.kind) if part else None
    dtype = dtype or default_dtype(device)
    target_model = load_model(target, device, dtype)
    if weights == "int8":  # weight-only int8 per output channel: not lossless against the checkpoint's weights
        target_model = quantize_int8(target_model)
    draft_model = part.load(path, target_model, device, dtype) if path else None
    sut = make_sut(name, target_model, draft_model, eos_id, **options)
    if isinstance(sut, SUT):  # after construction, so an int8 draft is quantised from the plain model
        sut.use_fast_path(weights, "auto" if fast else "modules")
    freeze_heap()
    return sut


def freeze_heap() -> None:
    """Collect, then put every object the process holds so far (modules, models, packed weights) beyond the garbage
    collector, which then scans only what a run allocates: a full collection over torch's heap takes tens of
    milliseconds and would fall into whichever timed call it happened to (a calibration call, a LoadGen query)."""
    gc.collect()
    gc.freeze()

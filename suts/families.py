"""The drafter families: the package's own (a draft model, the EAGLE head, lookups), listed here, and any other
registered with `register_family`; each asked, by the name a run recorded, what a draft step costs. Imported by what
reads records (the roofline, the reports), which load no SUT."""
from mlperf.cost import Cost
from mlperf.model import GPTConfig
from suts.drafting import DraftModel, Proposer
from suts.eagle import Head
from suts.ngram import HostDrafter

FAMILIES: dict[str, type[Proposer]] = {family.name: family for family in (DraftModel, Head, HostDrafter)}


def register_family(family: type[Proposer]) -> type[Proposer]:
    """A drafter family of your own, by its `name` (a class decorator): its runs' draft steps costed as it states."""
    FAMILIES[family.name] = family
    return family


def family_of(name: str) -> type[Proposer]:
    """The family a run recorded, or a one-line error naming those registered."""
    if name not in FAMILIES:
        raise ValueError(f"unknown drafter family {name!r}: registered {', '.join(FAMILIES)} "
                         "(suts.families.register_family adds one)")
    return FAMILIES[name]


def step_cost(family: str, draft: GPTConfig | None, context: int, tokens: float, *, batch: int = 1,
              act_bytes: int = 4, weight_bytes: float | None = None) -> Cost:
    """One draft step's cost as the family a run recorded (its name) states it."""
    return family_of(family).step_cost(draft, context, tokens, batch=batch, act_bytes=act_bytes,
                                       weight_bytes=weight_bytes)


def drafts_on_host(family: str) -> bool:
    """Whether the family drafts on the host from tokens alone (no draft geometry to cost)."""
    return family in FAMILIES and FAMILIES[family].host


def draft_forward(family: str) -> bool:
    """Whether the family's draft step is one forward of a GPT of the draft's geometry (a launch floor to count)."""
    return family in FAMILIES and FAMILIES[family].draft_forward

"""The drafter families the package ships (a draft model, the EAGLE head, lookups), each registered in
suts.drafting.FAMILIES as its Proposer class is defined, and a draft step's cost asked of a family by the name a
run recorded. Imported by what reads records (the roofline, the reports), which load no SUT."""
from mlperf.cost import Cost
from mlperf.model import GPTConfig
from suts.drafting import FAMILIES, DraftModel
from suts.eagle import Head
from suts.ngram import Tokens

SHIPPED = (DraftModel, Head, Tokens)


def step_cost(family: str, draft: GPTConfig | None, context: int, tokens: float, *, batch: int = 1,
              act_bytes: int = 4, weight_bytes: float | None = None) -> Cost:
    """One draft step's cost as the family a run recorded (its name) states it."""
    if family not in FAMILIES:
        raise ValueError(f"unknown drafter family {family!r}: registered {', '.join(FAMILIES)} (a family is "
                         "registered as its Proposer class is defined)")
    return FAMILIES[family].step_cost(draft, context, tokens, batch=batch, act_bytes=act_bytes,
                                      weight_bytes=weight_bytes)


def drafts_on_host(family: str) -> bool:
    """Whether the family drafts on the host from tokens alone (no draft geometry to cost)."""
    return family in FAMILIES and FAMILIES[family].host

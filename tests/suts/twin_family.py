"""A drafter family of a user's own, in one file: a draft model read from a checkpoint kind of its own (`twin`,
named by --parts twin=DIR) and costed by the roofline at two forwards a draft step. `python -m
tests.suts.twin_family run ...` is the harness's command line with the family registered."""
import sys

from mlperf.cost import forward_cost
from mlperf.checkpoint import load_model
from suts.drafting import DraftModel, Part
from suts.families import register_family
from suts.registry import register


@register_family
class Twin(DraftModel):
    """A draft model of the `twin` family: its cost stated here, its checkpoint kind its own."""
    name = "twin"
    part = Part("twin", lambda path, target, device, dtype: load_model(path, device, dtype))

    @staticmethod
    def step_cost(draft, context, tokens, *, batch, act_bytes, weight_bytes):
        return forward_cost(draft, context, tokens, batch=batch, act_bytes=act_bytes,
                            weight_bytes_per_param=weight_bytes) * 2


register("twin", lambda **_: Twin())  # twin, twin-tree, twin-auto

if __name__ == "__main__":
    from commands.cli import main
    sys.exit(main())

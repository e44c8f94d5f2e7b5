"""Analytic FLOPs and bytes of each decoding phase (prefill, decode, draft, verify, cycle), from the model configs
and one forward's costs (mlperf/cost.py)."""
from mlperf.cost import Cost, forward_cost
from mlperf.model import GPTConfig
from suts.families import step_cost
from suts.tree import widths


def phase_costs(target: GPTConfig, prompt_len: int, context: int, draft: GPTConfig | None = None,
                gamma: int = 4, act_bytes: int = 4, draft_weight_bytes: float | None = None,
                batch: int = 1, drafter: str | None = None, tree: list[int] | None = None,
                target_weight_bytes: float | None = None) -> dict[str, Cost]:
    """Prefill (one row), and of `batch` rows together: one decode step, and for a speculative SUT one draft step,
    one verify pass and one speculative cycle. `drafter` (default "model" when a draft is given): the drafter
    family the run recorded, whose Proposer states a draft step's cost (`step_cost`, suts/families.py) from `draft`.
    `tree` (children per depth): the verify pass reads every node and the root, and the draft's step is one level,
    as many tokens as the levels it reads (the root and every level but the deepest) average; gamma is its depth.
    `*_weight_bytes`: bytes per linear weight each model streams where it is not act_bytes (2: fp16 panels, 1: int8).
    """
    wb = target_weight_bytes
    phases = {
        "prefill": forward_cost(target, 0, prompt_len, logits_positions=1, act_bytes=act_bytes,
                                weight_bytes_per_param=wb),
        "decode": forward_cost(target, context, 1, batch=batch, act_bytes=act_bytes, weight_bytes_per_param=wb),
    }
    drafter = drafter or ("model" if draft is not None else None)
    if drafter is not None:
        verified, drafted = gamma + 1, 1
        if tree:
            levels = widths(tree)
            verified, drafted = 1 + sum(levels), (1 + sum(levels[:-1])) / len(tree)
        phases["draft"] = step_cost(drafter, draft, context, drafted, batch=batch, act_bytes=act_bytes,
                                    weight_bytes=draft_weight_bytes)
        phases["verify"] = forward_cost(target, context, verified, batch=batch, act_bytes=act_bytes,
                                        weight_bytes_per_param=wb)
        phases["cycle"] = phases["draft"] * drafts_per_cycle(gamma, tree) + phases["verify"]
    return phases


def drafts_per_cycle(gamma: int, tree: list[int] | None = None) -> int:
    """The draft steps of one speculative cycle: gamma, or a tree's depth."""
    return len(tree) if tree else gamma


# Kernels one forward launches on a GPU, counted with torch.profiler on an H100 for the shipped pair (torch 2.11,
# fp16; tests/roofline/test_analytic.py counts them again where a GPU is): (per forward, per layer), for one token
# a row and for more, in a CUDA graph (suts/fast/graphs.py: positions, mask and cache slots computed on the GPU) or
# launched one by one. cuBLAS splits some other widths' matmuls in two kernels (GPT-2 small: 7% more). In a graph
# a chunk of up to SPLIT_KEY_QUERIES tokens a row attends in the split-key kernel (two launches a layer) and builds no
# mask; a longer one (a prefill) takes PyTorch's kernel and its mask.
KERNELS = {(True, 1): (8, 13), (True, 2): (8, 15), (True, 3): (13, 14),
           (False, 1): (6, 12), (False, 2): (7, 17), (False, 3): (7, 17)}
SPLIT_KEY_QUERIES = 16  # suts/fast/triton_kernels.py's MAX_QUERIES


def kernels_per_forward(config: GPTConfig, tokens: int, graphs: bool) -> int:
    """The kernels of one forward of a chunk of `tokens` tokens a row, replayed from a CUDA graph or not."""
    base, per_layer = KERNELS[graphs, 1 if tokens == 1 else 2 if tokens <= SPLIT_KEY_QUERIES else 3]
    return base + per_layer * config.n_layer

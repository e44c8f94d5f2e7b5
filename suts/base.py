"""The small interface every SUT implements.

A SUT turns prompts (token ids) into generated token ids. The built-in strategies implement `step(seqs)` (one
decode step, or one speculative cycle, for every running row) and inherit `prefill(first, seqs, chunks)`
(chunks of prompts into rows of the KV cache pool, in one packed forward per model, returning the first token of
each prompt completed), and the one scheduler (suts/engine/scheduler.py) batches them. A plug-in may instead override
`generate` alone and decode one prompt at a time: it must call `on_first_token(token)` the moment the first token
exists (LoadGen's time to first token). Whatever a SUT returns is checked against `result_problem` before it
counts (scenarios/adapter.py).
"""
from numbers import Integral

import torch

from mlperf.cache import KVCache
from mlperf.chunk import Chunk
from mlperf.model import GPT
from mlperf.rules import positive_int
from suts.fast.runner import Runner
from suts.fast.step import WEIGHTS
from suts.engine.sampling import SamplingParams, sample
from suts.engine.scheduler import Result, Scheduler, Sequence
from suts.engine.stats import Stats

GREEDY = SamplingParams()


def result_problem(result, max_new_tokens: int, vocab_size: int, eos_id: int | None) -> str | None:
    """What is wrong with a SUT's answer to a request for `max_new_tokens`, or None. A Result holds 1 to
    max_new_tokens token ids in the vocabulary, fewer only when it ends at EOS, and nothing after an EOS."""
    tokens = getattr(result, "tokens", None)
    if not isinstance(getattr(result, "stats", None), Stats) or not isinstance(tokens, list):
        return f"{type(result).__name__} instead of a Result (token ids and Stats)"
    if not all(isinstance(t, Integral) and not isinstance(t, bool) for t in tokens):
        return "token ids that are not integers"
    if not tokens:
        return "no tokens"
    if len(tokens) > max_new_tokens:
        return f"{len(tokens)} tokens, more than max_new_tokens ({max_new_tokens})"
    bad = next((t for t in tokens if not 0 <= t < vocab_size), None)
    if bad is not None:
        return f"token id {bad}, outside the vocabulary (0..{vocab_size - 1})"
    if eos_id is not None and eos_id in tokens[:-1]:
        return f"tokens after EOS (EOS at position {tokens.index(eos_id)} of {len(tokens)})"
    if len(tokens) < max_new_tokens and tokens[-1] != eos_id:
        return f"{len(tokens)} tokens of {max_new_tokens}, not ending at EOS"
    return None


class SUT:
    """Base of every decoding strategy: holds the models and the target's KV cache pool, validates requests."""
    name = "sut"
    needs_draft = False  # True: the registry loads a draft checkpoint and passes it in

    def __init__(self, target: GPT, draft: GPT | None = None, eos_id: int | None = None):
        self.target = Runner(target)  # each model through its runner: the modules alone until use_fast_path
        self.draft = None if draft is None else Runner(draft)
        self.eos_id = eos_id
        p = target.transformer.wte.weight
        self.device, self.dtype = p.device, p.dtype
        self.cache: KVCache | None = None  # the pool: the target's cache, one row per running sequence

    @property
    def vocab_size(self) -> int:
        """The token ids an answer may hold: the target's vocabulary (what every result is checked against)."""
        return self.target.config.vocab_size

    def use_fast_path(self, weights: str = WEIGHTS, path: str = "auto", **packing) -> "SUT":
        """Run every model on its fast path (Runner.use_fast_path decides: by default the fused C step on a CPU, with
        fp16 panels for weights "fp16", and CUDA graphs on a GPU; `path` forces one). Every SUT's models get the
        same, in place."""
        for runner in self.runners():
            runner.use_fast_path(weights, path, **packing)
        return self

    def runners(self) -> list[Runner]:
        """The runners of its models: the target's, and the draft model's (or EAGLE head's) where it has one."""
        return [runner for runner in (self.target, self.draft) if runner is not None]

    def paths(self) -> dict[str, str]:
        """What runs each model's steps (Runner.kind), for the run record: "target" -> "fused C step"."""
        return {name: runner.kind for name, runner in (("target", self.target), ("draft", self.draft))
                if runner is not None}

    @property
    def batched(self) -> bool:
        """Served by the scheduler: implements step, and keeps the generate that runs it."""
        cls = type(self)
        return cls.step is not SUT.step and cls.generate is SUT.generate

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams = GREEDY,
                 on_first_token=None) -> Result:
        seq = Sequence(prompt, max_new_tokens, params, on_first_token)
        Scheduler(self, 1).run([seq])
        return seq.result

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int, params: list[SamplingParams],
                       max_batch: int | None = None, token_budget: int | None = None) -> list[Result]:
        """Every prompt, each with its own SamplingParams (and seed), at most `max_batch` decoding at once
        (default: all) under the scheduler's `token_budget`; a SUT that only implements `generate` decodes them
        one at a time."""
        if not self.batched:
            return [self.generate(p, max_new_tokens, ps) for p, ps in zip(prompts, params)]
        seqs = [Sequence(p, max_new_tokens, ps) for p, ps in zip(prompts, params)]
        Scheduler(self, max_batch or len(seqs), token_budget).run(seqs)
        return [s.result for s in seqs]

    # The scheduler's side: the pool, prefill chunks, one step of every running row.
    def reserve(self, rows: int) -> None:
        """Make the pool hold at least `rows` sequences; allocated once per SUT, not per request."""
        if self.cache is None or self.cache.batch_size < rows:
            self.cache = self.target.new_cache(rows)

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)

    def prefill(self, first: int, seqs: list[Sequence], chunks: list[int]) -> list[int | None]:
        """Each sequence's next chunks[j] prompt tokens (from seq.prefilled on) into row first + j; the first token
        of each sequence whose prompt they complete, None for the others."""
        logits = self.prefill_rows(first, [s.prompt[s.prefilled:s.prefilled + c] for s, c in zip(seqs, chunks)],
                                   [s.prefilled for s in seqs])
        return [int(sample(logits[j], s.params, s.generator)) if s.prefilled + c == len(s.prompt) else None
                for j, (s, c) in enumerate(zip(seqs, chunks))]

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        raise NotImplementedError

    def step_tokens(self, seqs: list[Sequence]) -> int:
        """The tokens one step feeds the target for these rows (what it takes of the scheduler's token budget)."""
        return len(seqs)

    def prefill_rows(self, first: int, chunks: list[list[int]], starts: list[int]) -> torch.Tensor:
        """The target's logits (rows, vocab) at the last token of each chunk, all rows in one packed forward:
        chunks[j] follows the first starts[j] tokens of row first + j (the row is rolled back to them)."""
        return self.read_chunks(first, chunks, starts).logits[:, -1]

    def read_chunks(self, first: int, chunks: list[list[int]], starts: list[int], features: bool = False):
        """prefill_rows' forward: the target's Output at each chunk's last token (every position's features too, if
        asked)."""
        view = self.cache.rows(first, first + len(chunks))
        view.restart(starts)
        chunk = Chunk(view, lens=[len(c) for c in chunks], last_only=True, features=features)
        return self.target(self.tensor([t for c in chunks for t in c]), chunk)

    def prefill_row(self, row: int, prompt: list[int]) -> torch.Tensor:
        """The target's last-position logits for `prompt`, written into row `row` of the pool (emptied first)."""
        return self.prefill_rows(row, [prompt], [0])[0]

    def check(self, prompt: list[int], max_new_tokens: int) -> None:
        config = self.target.config
        if not prompt:
            raise ValueError("empty prompt")
        positive_int("max_new_tokens", max_new_tokens)
        if len(prompt) + max_new_tokens > config.block_size:
            raise ValueError(f"prompt of {len(prompt)} tokens + {max_new_tokens} new tokens exceeds the model's "
                             f"context of {config.block_size}")
        if min(prompt) < 0 or max(prompt) >= config.vocab_size:
            raise ValueError(f"prompt has token ids outside the vocabulary (0..{config.vocab_size - 1})")

    def tensor(self, ids: list[int] | list[list[int]]) -> torch.Tensor:
        """A (1, T) tensor of one row's ids, or (B, T) of B rows'."""
        return torch.tensor(ids if ids and isinstance(ids[0], list) else [ids], device=self.device)

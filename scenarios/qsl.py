"""The query sample library: the prompt dataset, tokenised and checked against the model's context up front."""
import mlperf_loadgen as lg

from mlperf.data import Prompt


class QSL:
    """Holds every prompt's token ids; LoadGen's load/unload callbacks track which are "in RAM"."""

    def __init__(self, prompts: list[Prompt], tokenizer, context: int, max_new_tokens: int,
                 performance_sample_count: int | None = None):
        self.prompts = prompts
        self.tokens = []
        for p in prompts:
            try:
                self.tokens.append(tokenizer.encode(p.text))
            except ValueError as e:  # a character-level vocabulary lacks one of the prompt's characters
                raise ValueError(f"prompt {p.id} ({p.source}): {e}") from None
        for p, ids in zip(prompts, self.tokens):
            if not ids:
                raise ValueError(f"prompt {p.id} ({p.source}) is empty")
            if len(ids) + max_new_tokens > context:
                raise ValueError(f"prompt {p.id} ({p.source}) has {len(ids)} tokens; with {max_new_tokens} new "
                                 f"tokens it exceeds the model's context of {context}")
        count = performance_sample_count or len(prompts)
        if not 1 <= count <= len(prompts):
            raise ValueError(f"performance sample count must be 1..{len(prompts)}, got {count}")
        self.loaded: set[int] = set()
        self.handle = lg.ConstructQSL(len(prompts), count, self._load, self._unload)

    def _load(self, indices):
        self.loaded.update(indices)

    def _unload(self, indices):
        self.loaded.difference_update(indices)

    def destroy(self):
        lg.DestroyQSL(self.handle)

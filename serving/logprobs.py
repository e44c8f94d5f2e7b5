"""Log-probabilities of a completion's tokens as vLLM's /v1/completions returns them (`logprobs`, `echo`): one
forward of the target over the prompt and the completion, each token's log-probability under the target and the
`top` likeliest tokens at its position, so that lm-eval's log-likelihood tasks can score the engine."""
import torch

from mlperf.chunk import Chunk


def scored(model, tokenizer, prompt: list[int], tokens: list[int], top: int, echo: bool, as_ids: bool = False) -> dict:
    """The choice's `logprobs`: tokens, token_logprobs, top_logprobs and text_offset, over the completion's tokens, or
    the prompt's and the completion's with `echo` (the first prompt token has none: nothing precedes it). A token is
    named by its text, or with `as_ids` as "token_id:N" (two bytes that each decode to U+FFFD then stay apart)."""
    name = (lambda i: f"token_id:{i}") if as_ids else (lambda i: tokenizer.decode([i]))  # noqa: E731
    ids = prompt + tokens
    device = model.transformer.wte.weight.device
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=device), Chunk()).logits[0]  # (T, vocab): what follows token t
    lp = torch.log_softmax(logits.float(), dim=-1)
    first = 0 if echo else len(prompt)
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in range(first, len(ids)):
        out["tokens"].append(name(ids[t]))
        out["text_offset"].append(len(tokenizer.decode(ids[first:t])))
        if t == 0:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        row = lp[t - 1]
        values, best = row.topk(top) if top else (row[:0], row[:0].long())
        alternatives = {}
        for v, i in zip(values, best):  # likeliest first: a name two tokens share keeps the likelier's value
            alternatives.setdefault(name(int(i)), float(v))
        alternatives.setdefault(out["tokens"][-1], float(row[ids[t]]))  # the token's own, as vLLM adds it
        out["token_logprobs"].append(float(row[ids[t]]))
        out["top_logprobs"].append(alternatives)
    return out

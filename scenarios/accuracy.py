"""Accuracy checker and gate: decodes mlperf_log_accuracy.json and scores a run's outputs against the baseline's.

The reference is the baseline SUT's own outputs for the same prompts, length, dtype, device, sampling settings
(each sample with its own seed) and source of the C kernels, computed once and cached under results/reference/. The
gate, with limits fixed before the run is read:
- tokens per sample within 0.9x-1.1x of the reference's (MLPerf's band);
- greedy: every output equal to the reference's (exact match 1.0);
- sampled: exact match means nothing (a different sampler draws other tokens from the same distribution), so
  the outputs' mean log-likelihood under the target must lie within LL_SIGMAS standard errors of the
  reference's, the standard error taken from the reference's per-sample spread (x sqrt 2, for two samples).
"""
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mlperf.checkpoint import fingerprint, load_model
from mlperf.data import load_prompts
from mlperf.files import read_json, write_json, write_text
from mlperf.tokenizer import load_tokenizer
from scenarios.logs import response_tokens
from scenarios.config import DTYPES, RunConfig
from scenarios.records import RunRecord
from suts.fast import native
from suts.registry import build_sut

TOKENS_BAND = (0.9, 1.1)
LL_SIGMAS = 4.0


def read_outputs(run_dir) -> dict[int, list[int]]:
    """QSL index -> generated token ids, from LoadGen's accuracy log."""
    entries = json.loads((Path(run_dir) / "mlperf_log_accuracy.json").read_text())
    return {e["qsl_idx"]: response_tokens(e["data"]) for e in entries}


def reference_outputs(cfg: RunConfig, prompts: list[list[int]], cache_dir: Path) -> list[list[int]]:
    """The baseline SUT's outputs for these prompts at cfg's dtype, device and sampling settings (cached by a
    hash of everything they depend on, the kernels' source among it: every build sums alike, but another version
    of the kernels may not)."""
    params = cfg.sampling()
    h = hashlib.sha256(json.dumps([fingerprint(cfg.target), prompts, cfg.max_new_tokens, repr(params), cfg.dtype,
                                   cfg.device, native.source_text()]).encode())
    path = cache_dir / f"{h.hexdigest()[:16]}.json"
    cached = read_json(path, "computing the baseline's reference outputs again") if path.is_file() else None
    if (isinstance(cached, list) and len(cached) == len(prompts)
            and all(isinstance(out, list) and all(type(t) is int for t in out) for out in cached)):
        return cached
    baseline = build_sut("baseline", cfg.target, device=cfg.device, dtype=DTYPES.get(cfg.dtype),
                         eos_id=load_tokenizer(cfg.target, cfg.tokenizer).eos_id)
    outputs = [baseline.generate(p, cfg.max_new_tokens, params.for_sample(i)).tokens
               for i, p in enumerate(tqdm(prompts, desc="baseline reference", dynamic_ncols=True))]
    write_text(path, json.dumps(outputs))
    return outputs


def synthetic_reference(cfg: RunConfig, tokenizer) -> dict[tuple[int, ...], list[int]] | None:
    """What a run with synthetic acceptance drafts from (suts/synthetic.py): the baseline's reference outputs of
    its prompts, by prompt; None for a run without."""
    if cfg.acceptance() is None:
        return None
    prompts = [tokenizer.encode(p.text) for p in load_prompts(cfg.prompts)[:cfg.samples]]
    return reference_by_prompt(cfg, prompts, Path(cfg.results) / "reference")


def reference_by_prompt(cfg: RunConfig, prompts: list[list[int]], cache_dir: Path) -> dict[tuple[int, ...], list[int]]:
    """reference_outputs keyed by each prompt's tokens: what a synthetic drafter looks a row's next tokens up in."""
    return {tuple(p): out for p, out in zip(prompts, reference_outputs(cfg, prompts, cache_dir))}


@torch.inference_mode()
def log_likelihoods(model, prompts: list[list[int]], outputs: list[list[int]]) -> list[float]:
    """Mean log-probability per generated token under the model, in nats, for each sample."""
    means = []
    for prompt, out in zip(prompts, outputs):
        seq = torch.tensor([prompt + out])
        logp = torch.log_softmax(model(seq[:, :-1]).logits.float(), -1)[0, len(prompt) - 1:]
        means.append(logp.gather(-1, torch.tensor(out)[:, None]).mean().item())
    return means


def check(run_dir) -> dict:
    """Score the run and apply the gate; writes accuracy.json and accuracy.txt. result["passed"] is the verdict."""
    run_dir = Path(run_dir)
    cfg = RunRecord.load(run_dir).config
    tokenizer = load_tokenizer(cfg.target, cfg.tokenizer)
    prompts = [tokenizer.encode(p.text) for p in load_prompts(cfg.prompts)[:cfg.samples]]
    outputs = read_outputs(run_dir)
    missing = sorted(set(range(len(prompts))) - outputs.keys())
    if missing:
        raise ValueError(f"{run_dir}: the accuracy log lacks {len(missing)} samples (first: {missing[0]})")
    generated = [outputs[i] for i in range(len(prompts))]
    reference = reference_outputs(cfg, prompts, Path(cfg.results) / "reference")
    model = load_model(cfg.target)
    ll, ll_ref = log_likelihoods(model, prompts, generated), log_likelihoods(model, prompts, reference)
    tokens, tokens_ref = (sum(map(len, outs)) / len(prompts) for outs in (generated, reference))
    result = {
        "samples": len(prompts), "greedy": cfg.sampling().greedy,
        "exact_match": sum(g == r for g, r in zip(generated, reference)) / len(prompts),
        "mean_log_likelihood_nats_per_token": float(np.mean(ll)),
        "reference_mean_log_likelihood": float(np.mean(ll_ref)),
        "log_likelihood_tolerance": LL_SIGMAS * math.sqrt(2) * float(np.std(ll_ref, ddof=1) if len(ll_ref) > 1 else 0)
        / math.sqrt(len(ll_ref)),
        "tokens_per_sample": tokens, "reference_tokens_per_sample": tokens_ref,
        "sampling": {k: getattr(cfg, k) for k in ("temperature", "top_k", "top_p", "seed")},
    }
    failures = []
    if not TOKENS_BAND[0] * tokens_ref <= tokens <= TOKENS_BAND[1] * tokens_ref:
        failures.append(f"tokens per sample {tokens:.1f} outside {TOKENS_BAND[0]}-{TOKENS_BAND[1]}x of the "
                        f"baseline's {tokens_ref:.1f}")
    if result["greedy"] and result["exact_match"] < 1.0:
        differ = [i for i, (g, r) in enumerate(zip(generated, reference)) if g != r]
        failures.append(f"greedy outputs differ from the baseline's on {len(differ)} of {len(prompts)} samples "
                        f"(first: sample {differ[0]})")
    if not result["greedy"]:
        delta = result["mean_log_likelihood_nats_per_token"] - result["reference_mean_log_likelihood"]
        if abs(delta) > result["log_likelihood_tolerance"]:
            failures.append(f"mean log-likelihood {delta:+.4f} nats/token from the baseline's sampled outputs, beyond "
                            f"the tolerance of {result['log_likelihood_tolerance']:.4f} ({LL_SIGMAS:.0f} standard "
                            "errors)")
    result.update(passed=not failures, failures=failures)
    write_json(run_dir / "accuracy.json", result)
    lines = [f"samples: {result['samples']}",
             f"exact match vs baseline {'greedy' if result['greedy'] else 'sampled'}: {result['exact_match']:.4f}",
             f"mean log-likelihood under the target: {result['mean_log_likelihood_nats_per_token']:.4f} nats/token "
             f"(baseline {result['reference_mean_log_likelihood']:.4f})",
             f"tokens per sample: {tokens:.1f} (baseline {tokens_ref:.1f})",
             str({"exact_match": result["exact_match"], "tokens_per_sample": tokens}),  # as MLCommons' checker reads
             "ACCURACY " + ("PASS" if result["passed"] else "FAIL: " + "; ".join(failures))]
    write_text(run_dir / "accuracy.txt", "\n".join(lines) + "\n")
    return result

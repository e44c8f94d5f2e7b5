"""Accuracy checker: decodes mlperf_log_accuracy.json and scores a run's outputs.

Reports the exact-match rate against the baseline's greedy outputs (computed once per target, prompt set and
length, and cached under results/reference/), the mean log-likelihood of the outputs under the target
(nats/token), and tokens per sample; writes accuracy.txt and accuracy.json into the run directory.
"""
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mlperf.checkpoint import load_model
from mlperf.data import load_prompts
from mlperf.tokenizer import load_tokenizer
from suts.baseline import Baseline


def read_outputs(run_dir) -> dict[int, list[int]]:
    """QSL index -> generated token ids, from LoadGen's accuracy log."""
    entries = json.loads((Path(run_dir) / "mlperf_log_accuracy.json").read_text())
    return {e["qsl_idx"]: np.frombuffer(bytes.fromhex(e["data"]), dtype=np.int32).tolist() for e in entries}


def reference_outputs(cfg: dict, prompts: list[list[int]], cache_dir: Path) -> list[list[int]]:
    """The baseline's greedy outputs for these prompts (cached by a hash of everything they depend on)."""
    h = hashlib.sha256()
    for f in ("config.json", "model.safetensors", "pytorch_model.bin"):
        if (Path(cfg["target"]) / f).is_file():
            h.update((Path(cfg["target"]) / f).read_bytes())
    h.update(json.dumps([prompts, cfg["max_new_tokens"]]).encode())
    path = cache_dir / f"{h.hexdigest()[:16]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    baseline = Baseline(load_model(cfg["target"]), eos_id=load_tokenizer(cfg["target"]).eos_id)
    outputs = [baseline.generate(p, cfg["max_new_tokens"]).tokens
               for p in tqdm(prompts, desc="baseline reference", dynamic_ncols=True)]
    cache_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(outputs))
    return outputs


@torch.inference_mode()
def mean_log_likelihood(model, prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """Mean log-probability per generated token under the model, in nats."""
    total, count = 0.0, 0
    for prompt, out in zip(prompts, outputs):
        seq = torch.tensor([prompt + out])
        logp = torch.log_softmax(model(seq[:, :-1]).float(), -1)[0, len(prompt) - 1:]
        total += logp.gather(-1, torch.tensor(out)[:, None]).sum().item()
        count += len(out)
    return total / count


def check(run_dir) -> dict:
    run_dir = Path(run_dir)
    cfg = json.loads((run_dir / "metrics.json").read_text())["config"]
    tokenizer = load_tokenizer(cfg["target"])
    prompts = [tokenizer.encode(p.text) for p in load_prompts(cfg["prompts"])[:cfg["samples"]]]
    outputs = read_outputs(run_dir)
    missing = sorted(set(range(len(prompts))) - outputs.keys())
    if missing:
        raise ValueError(f"{run_dir}: the accuracy log lacks {len(missing)} samples (first: {missing[0]})")
    generated = [outputs[i] for i in range(len(prompts))]
    reference = reference_outputs(cfg, prompts, Path(cfg["results"]) / "reference")
    result = {
        "samples": len(prompts),
        "exact_match": sum(g == r for g, r in zip(generated, reference)) / len(prompts),
        "mean_log_likelihood_nats_per_token": mean_log_likelihood(load_model(cfg["target"]), prompts, generated),
        "tokens_per_sample": sum(map(len, generated)) / len(prompts),
        "sampling": {k: cfg[k] for k in ("temperature", "top_k", "top_p", "seed")},
    }
    (run_dir / "accuracy.json").write_text(json.dumps(result, indent=1) + "\n")
    (run_dir / "accuracy.txt").write_text(
        f"samples: {result['samples']}\n"
        f"exact match vs baseline greedy: {result['exact_match']:.4f}\n"
        f"mean log-likelihood under the target: {result['mean_log_likelihood_nats_per_token']:.4f} nats/token\n"
        f"tokens per sample: {result['tokens_per_sample']:.1f}\n")
    return result

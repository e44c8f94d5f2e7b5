"""Benchmark: every SUT on the same held-out prompts, in one process, greedy; prints figures, asserts nothing.

The SUTs take turns prompt by prompt, so a machine that slows down or speeds up mid-run skews no ratio.

    python -m mlperf bench [--prompts 24] [--tokens 128] [--gamma 4]
"""
import statistics
import time

import pandas as pd
import torch
from tqdm import tqdm

from mlperf import env
from mlperf.data import load_prompts
from mlperf.tokenizer import load_tokenizer
from roofline.speculative import expected_tokens_per_cycle, predicted_speedup
from suts.registry import build_sut

SUTS = ("baseline", "spec", "spec-int8", "spec-self-int8")


def run(target: str, draft: str, n_prompts: int = 24, max_new_tokens: int = 128, gamma: int = 4,
        suts=SUTS, device: str = "cpu") -> pd.DataFrame:
    tok = load_tokenizer(target)
    prompts = [tok.encode(p.text) for p in load_prompts()[:n_prompts]]
    built = {name: build_sut(name, target, draft, device=device, gamma=gamma) for name in suts}
    for sut in built.values():
        sut.generate(prompts[0], 16)  # warm-up: first-call allocations, oneDNN primitive creation
    results, wall = {name: [] for name in suts}, dict.fromkeys(suts, 0.0)
    for p in tqdm(prompts, desc="bench", dynamic_ncols=True):  # interleaved, so drift in machine speed hits every SUT alike
        for name, sut in built.items():
            t0 = time.perf_counter()
            results[name].append(sut.generate(p, max_new_tokens))
            wall[name] += time.perf_counter() - t0
    rows, reference = [], None
    for name, sut in built.items():
        tokens = [r.tokens for r in results[name]]
        reference = reference or tokens
        n = sum(len(t) for t in tokens)
        stats = [r.stats for r in results[name]]
        cycles, drafted, accepted = (sum(getattr(s, f) for s in stats) for f in ("cycles", "drafted", "accepted"))
        row = {"sut": name, "dtype": str(sut.dtype).removeprefix("torch."), "tokens": n,
               "tokens/s": n / wall[name], "identical": tokens == reference}
        if cycles:
            row.update({
                "acceptance": accepted / drafted,
                "per-prompt acc. min/med/max": "/".join(f"{q:.2f}" for q in _spread([s.acceptance_rate for s in stats])),
                "accepted/cycle": accepted / cycles,
                "tokens/cycle": (accepted + cycles) / cycles,
                "draft ms/token": 1e3 * sum(s.draft_s for s in stats) / drafted,
                "verify ms/cycle": 1e3 * sum(s.verify_s for s in stats) / cycles,
            })
        rows.append(row)
    df = pd.DataFrame(rows).set_index("sut")
    step_ms = 1e3 / df.loc["baseline", "tokens/s"] if "baseline" in df.index else float("nan")
    df["speedup"] = df["tokens/s"] / df.loc["baseline", "tokens/s"] if "baseline" in df.index else float("nan")
    if "acceptance" in df:
        df["c (draft/target)"] = df["draft ms/token"] / step_ms
        df["verify/step"] = df["verify ms/cycle"] / step_ms
        df["Leviathan predicted"] = [
            predicted_speedup(a, gamma, c, v) if a == a else float("nan")
            for a, c, v in zip(df["acceptance"], df["c (draft/target)"], df["verify/step"])]
        df["E[tokens/cycle]"] = [expected_tokens_per_cycle(a, gamma) if a == a else float("nan") for a in df["acceptance"]]
    return df


def _spread(values):
    return min(values), statistics.median(values), max(values)


def main(args) -> None:
    print(f"machine: {env.machine()}")
    print(f"versions: {', '.join(f'{k} {v}' for k, v in env.versions().items())}")
    print(f"setup: {args.prompts} held-out prompts x {args.tokens} new tokens, greedy, gamma {args.gamma}, "
          f"target {args.target}, draft {args.draft}")
    torch.manual_seed(0)
    df = run(args.target, args.draft, args.prompts, args.tokens, args.gamma, args.sut or SUTS, args.device)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.3f}".format):
        print(df.T.to_string())
    if not df["identical"].all():
        print("WARNING: outputs differ from the baseline's")

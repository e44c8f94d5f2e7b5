"""Train the shipped default pair (byte-level target and draft) on the standard library's sources, or a draft
for any target on the target's own nanoGPT dataset.

    python -m training.train target        # resumes from runs/train-target/state.pt if present
    python -m training.train target --init mlperf/assets/models/target --lr 4e-4 --steps 6000   # train it further
    python -m training.train target ... --steps 6000 --stop-at 2500   # export at step 2500 of that same schedule
    python -m training.train draft --like out-shakespeare-char --data data/shakespeare_char [--out DIR]
    python -m training.train draft --distill mlperf/assets/models/target --out runs/draft-distilled
    python -m training.train head --target mlperf/assets/models/target    # an EAGLE head (training/head.py)

Deterministic: the batch at step s depends only on (seed, s), so a resumed run sees the same data.
Writes a resumable state every `eval_every` steps and, at the end, an fp16 checkpoint plus MODEL_CARD.md.
"""
import argparse
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from mlperf import HEAD, MODELS, devices, env
from mlperf.checkpoint import fingerprint, load_model, read_config, read_meta, save_checkpoint
from mlperf.hf import write_tokenizer
from mlperf.model import GEOMETRIES, GPT, EagleHead, GPTConfig
from training.data import Data, nanogpt_data, stdlib_data
from training.evaluate import card_prompts, heldout_loss, section
from training.head import NOISE, head_geometry, head_losses, heldout_figures



@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch: int = 8
    seq: int = 512
    lr: float = 1.5e-3  # peak; linear warm-up, then cosine down to 10%
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1337
    eval_every: int = 100
    eval_windows: int = 32
    distill_weight: float = 0.5  # with a teacher: loss = (1 - w) data loss + w T^2 KL(teacher || student) at T
    distill_temperature: float = 2.0
    stop_at: int | None = None  # export at this step, still on the schedule of `steps` (an early stop that replays)


DEFAULTS = {"target": TrainConfig(steps=1500), "draft": TrainConfig(steps=3000, lr=2e-3),
            "head": TrainConfig(steps=2400, lr=1e-3, eval_windows=16)}


def draft_geometry(target: GPTConfig) -> GPTConfig:
    """A draft several times cheaper than `target`: a third of its layers (at least one) at half its width."""
    width = max(16, target.n_embd // 2)
    heads = max(1, width // 64)
    return GPTConfig(n_layer=max(1, target.n_layer // 3), n_head=heads, n_embd=width // heads * heads,
                     vocab_size=target.vocab_size, block_size=target.block_size, bias=target.bias)


def get_batch(data: np.ndarray, cfg: TrainConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(data) - cfg.seq - 1, cfg.batch)
    chunk = torch.from_numpy(np.stack([data[s:s + cfg.seq + 1] for s in starts]).astype(np.int64))
    return chunk[:, :-1], chunk[:, 1:]


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def distill_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) per position between the softened distributions, scaled by T^2 so that its gradients
    keep their size as T changes (Hinton et al. 2015). Training a draft on it raises acceptance (DistillSpec,
    Zhou et al. 2023): the draft learns the target's distribution, not the data's."""
    student = F.log_softmax(logits.flatten(0, 1).float() / temperature, -1)
    teacher = F.log_softmax(teacher_logits.flatten(0, 1).float() / temperature, -1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean") * temperature ** 2


@torch.enable_grad()  # whatever mode the caller is in
def optimise(name: str, model: torch.nn.Module, objective, evaluate, cfg: TrainConfig, workdir: Path,
             device: str = "cpu") -> list[dict]:
    """AdamW (weight decay on matrices only) on `objective(step) -> (loss to log, loss to minimise)` to step
    `cfg.stop_at or cfg.steps`, from workdir/state.pt when one exists; every `eval_every` steps `evaluate()`
    (a dict of held-out figures, "heldout_loss" first) joins the history, which is returned, and the state is
    saved (a resumed run sees the same batches)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    state_file = workdir / "state.pt"
    step, elapsed, history = 0, 0.0, []
    if state_file.exists():
        state = torch.load(state_file, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed, history = state["step"], state["elapsed"], state["history"]
        print(f"resuming {name} at step {step} ({elapsed / 60:.1f} min trained)")
    end = min(cfg.steps, cfg.stop_at or cfg.steps)
    if step > end:
        raise ValueError(f"{state_file} is at step {step}, past the requested end ({end})")
    workdir.mkdir(parents=True, exist_ok=True)

    def checkpoint():
        tmp = state_file.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                    "history": history, "config": asdict(cfg)}, tmp)
        os.replace(tmp, state_file)

    model.train()
    bar = tqdm(total=end, initial=step, desc=f"train {name}", dynamic_ncols=True)
    t0 = time.perf_counter()
    while step < end:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss, minimised = objective(step)
        opt.zero_grad(set_to_none=True)
        minimised.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % cfg.eval_every == 0 or step == end:
            elapsed += time.perf_counter() - t0
            model.eval()
            with torch.no_grad():
                figures = {k: round(v, 4) for k, v in evaluate().items()}
            model.train()
            history.append({"step": step, "train_loss": round(loss.item(), 4), **figures,
                            "minutes": round(elapsed / 60, 2)})
            bar.write(f"step {step}: train {history[-1]['train_loss']:.3f}  "
                      + "  ".join(f"{k} {v:.3f}" for k, v in figures.items()) + f"  ({elapsed / 60:.1f} min)")
            checkpoint()
            t0 = time.perf_counter()
    bar.close()
    model.eval()
    return history


def train(name: str, cfg: TrainConfig, workdir: Path, out: Path, geometry: GPTConfig, data: Data,
          command: str, init: Path | None = None, teacher: GPT | None = None, device: str = "cpu") -> None:
    """Train from scratch, or from the weights of checkpoint `init` (a fresh optimizer and schedule), on the
    data alone or distilled from `teacher`; a state.pt in `workdir` resumes any of them exactly, on any device
    (the batches are the same everywhere; the arithmetic is not bit for bit)."""
    if teacher is not None and (teacher.config.vocab_size != geometry.vocab_size
                                or teacher.config.block_size < cfg.seq):
        raise ValueError(f"--distill: the teacher (vocab {teacher.config.vocab_size}, context "
                         f"{teacher.config.block_size}) must share the {name}'s vocabulary ({geometry.vocab_size}) "
                         f"and see {cfg.seq}-token windows")
    torch.manual_seed(cfg.seed)
    model = GPT(geometry)
    prior_tokens = 0  # what the --init checkpoint had seen, for the card's tokens seen
    if init is not None:
        start = load_model(init)
        if start.config != geometry:
            raise ValueError(f"--init {init}: its geometry {start.config} is not the {name}'s {geometry}")
        model.load_state_dict(start.state_dict())
        prior_tokens = read_meta(init).get("tokens_seen", 0)
    model.to(device)
    if teacher is not None:
        teacher.to(device)

    def objective(step):
        x, y = (t.to(device) for t in get_batch(data.train, cfg, step))
        logits = model(x).logits
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())  # the data loss, the one logged
        if teacher is None:
            return loss, loss
        with torch.no_grad():
            teacher_logits = teacher(x).logits
        return loss, ((1 - cfg.distill_weight) * loss
                      + cfg.distill_weight * distill_loss(logits, teacher_logits, cfg.distill_temperature))

    history = optimise(name, model, objective,
                       lambda: {"heldout_loss": heldout_loss(model, data.heldout, cfg.eval_windows, cfg.seq,
                                                             cfg.batch)},
                       cfg, workdir, device)
    export(name, model.cpu(), cfg, history, data, out, command, teacher and teacher.cpu(), prior_tokens)


def train_head(cfg: TrainConfig, workdir: Path, out: Path, target_path: Path, data: Data, command: str,
               device: str = "cpu") -> None:
    """An EAGLE head for the target at `target_path`, on its data (training/head.py); resumable like the others."""
    target = load_model(target_path).to(device).requires_grad_(False)
    cfg = replace(cfg, seq=min(cfg.seq, target.config.block_size, len(data.heldout) - 1))
    torch.manual_seed(cfg.seed)
    head = EagleHead(head_geometry(target.config)).to(device)

    def objective(step):
        x, _ = get_batch(data.train, cfg, step)
        loss = head_losses(head, target, x.to(device), NOISE)["objective"]
        return loss, loss

    history = optimise("head", head, objective,
                       lambda: heldout_figures(head, target, data.heldout, cfg.eval_windows, cfg.seq, cfg.batch),
                       cfg, workdir, device)
    export_head(head.cpu(), target.cpu(), target_path, cfg, history, data, out, command)


def card_table(rows: dict[str, str]) -> str:
    """A model card's table of facts: one row each, a label and its value."""
    return "| | |\n|---|---|\n" + "".join(f"| {label} | {value} |\n" for label, value in rows.items())


def schedule(cfg: TrainConfig) -> str:
    """The optimiser and learning-rate schedule a model was trained on, as its card says it."""
    stopped = f" (stopped at step {cfg.stop_at})" if cfg.stop_at else ""
    return (f"AdamW (0.9, 0.95), peak lr {cfg.lr}, {cfg.warmup} warm-up steps, cosine to 10% over {cfg.steps} "
            f"steps{stopped}, weight decay {cfg.weight_decay}, clip {cfg.grad_clip}")


def export_head(head: EagleHead, target: GPT, target_path: Path, cfg: TrainConfig, history: list[dict], data: Data,
                out: Path, command: str) -> None:
    from suts.speculative import Speculative  # the card measures the head where it runs
    last = history[-1]
    meta = {"name": "eagle-head", "params": sum(p.numel() for p in head.parameters()),
            "tokens_seen": last["step"] * cfg.batch * cfg.seq, "target": str(target_path),
            "target_fingerprint": fingerprint(target_path), "wall_minutes": last["minutes"],
            "machine": f"{env.machine()}, torch {torch.__version__}", "corpus": data.description.split("; ")[0],
            "train_config": asdict(cfg), **{k: v for k, v in last.items() if k not in ("step", "minutes")}}
    save_checkpoint(head, out, meta=meta)
    n_new = min(128, target.config.block_size // 4)
    prompts = card_prompts(data, count=8, length=min(200, target.config.block_size // 2))
    results = [Speculative(target, head, gamma=4).generate(p, n_new) for p in prompts]
    acceptance = sum(r.stats.accepted for r in results) / max(1, sum(r.stats.drafted for r in results))
    g = head.config
    card = f"""# EAGLE draft head

One transformer block that drafts from the target's features, trained by `{command}` (see `training/head.py`).

""" + card_table({
        "target": f"`{target_path}` (fingerprint {meta['target_fingerprint']}); the head uses its embedding and LM "
                  "head",
        "geometry": f"1 block, {g.n_head} heads, {g.n_embd} wide, an input layer from 2 x {g.n_embd}, context "
                    f"{g.block_size}",
        "parameters": f"{meta['params']:,} (besides the target's)",
        "tokens seen": f"{meta['tokens_seen']:,} ({last['step']} steps of {cfg.batch} x {cfg.seq} {data.unit}s)",
        "wall time": f"{meta['wall_minutes']:.1f} min on {meta['machine']}",
        "held-out objective": f"{last['heldout_loss']:.3f} (feature smooth L1 {last['feature_loss']:.3f}, token "
                              f"cross-entropy {last['token_loss']:.3f}; {cfg.eval_windows} fixed windows)",
        "first / second draft = target's argmax": f"{last['top1']:.3f} / {last['top1_second']:.3f} of held-out "
                                                  "positions",
        "greedy acceptance, gamma 4": f"{acceptance:.3f} (accepted / drafted, {len(prompts)} held-out prompts x "
                                      f"{n_new} new {data.unit}s)",
        "corpus": meta["corpus"],
        "schedule": f"{schedule(cfg)}; feature noise uniform +-{NOISE}; seed {cfg.seed}",
        "stored as": "float16 safetensors"}) + """
## Loss history

| step | train | held-out | first draft | second draft | minutes |
|---|---|---|---|---|---|
""" + "".join(f"| {h['step']} | {h['train_loss']:.3f} | {h['heldout_loss']:.3f} | {h['top1']:.3f} | "
              f"{h['top1_second']:.3f} | {h['minutes']:.1f} |\n" for h in history)
    (out / "MODEL_CARD.md").write_text(card)
    print(f"wrote {out} (greedy acceptance {acceptance:.3f} on {len(prompts)} held-out prompts)")


def export(name, model, cfg, history, data: Data, out: Path, command: str, teacher: GPT | None = None,
           prior_tokens: int = 0) -> None:
    last, unit = history[-1], data.unit
    meta = {
        "name": name, "params": model.num_params(), "tokens_seen": prior_tokens + last["step"] * cfg.batch * cfg.seq,
        "train_loss": last["train_loss"], "heldout_loss": last["heldout_loss"],
        "wall_minutes": last["minutes"], "machine": f"{env.machine()}, torch {torch.__version__}",
        "corpus": data.description.split("; ")[0], "train_config": asdict(cfg),
        "distilled": teacher is not None,
    }
    save_checkpoint(model, out, meta=meta)
    g = model.config
    if unit == "byte":  # a Hugging Face folder whole: transformers and the benchmark clients read its tokenizer
        write_tokenizer(out, g.block_size)
    objective = (f"{1 - cfg.distill_weight:g} x next-token cross-entropy + {cfg.distill_weight:g} x KL(teacher || "
                 f"{name}) at temperature {cfg.distill_temperature:g}, distilled from the `--distill` checkpoint"
                 if teacher is not None else "next-token cross-entropy on the data")
    earlier = f", after the --init checkpoint's {prior_tokens:,}" if prior_tokens else ""
    card = f"""# {name} model

GPT-2-architecture model trained by `{command}` (see `training/train.py`).

""" + card_table({
        "geometry": f"{g.n_layer} layers, {g.n_head} heads, {g.n_embd} wide, vocab {g.vocab_size}, context "
                    f"{g.block_size}{'' if g.bias else ', no biases'}",
        "parameters": f"{meta['params']:,}",
        "tokens seen": f"{meta['tokens_seen']:,} ({last['step']} steps of {cfg.batch} x {cfg.seq} {unit}s{earlier})",
        "wall time": f"{meta['wall_minutes']:.1f} min on {meta['machine']}",
        "train loss (last batch)": f"{meta['train_loss']:.3f} nats/{unit}",
        "held-out loss": f"{meta['heldout_loss']:.3f} nats/{unit} ({cfg.eval_windows} fixed windows of the held-out "
                         "data)",
        "corpus": meta["corpus"],
        "seed": f"{cfg.seed}",
        "schedule": schedule(cfg),
        "objective": objective,
        "stored as": "float16 safetensors, also a Hugging Face GPT-2 folder"}) + f"""
Training data: {data.description}.

{section({name: model}, {name: meta}, data, name)}

## Loss history

| step | train | held-out | minutes |
|---|---|---|---|
""" + "".join(f"| {h['step']} | {h['train_loss']:.3f} | {h['heldout_loss']:.3f} | {h['minutes']:.1f} |\n"
              for h in history)
    (out / "MODEL_CARD.md").write_text(card)
    print(f"wrote {out} (held-out {last['heldout_loss']:.3f} nats/byte)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(DEFAULTS))
    p.add_argument("--steps", type=int, help="the schedule's length (the cosine decays over it)")
    p.add_argument("--stop-at", type=int, metavar="STEP", help="export at this step, keeping the schedule of --steps")
    p.add_argument("--lr", type=float, help="peak learning rate (continuing a trained model wants a lower one)")
    p.add_argument("--like", type=Path, help="train a draft for this target (any checkpoint we load), on --data")
    p.add_argument("--target", type=Path, help="head: the target to train an EAGLE head for (with --data unless it "
                   "is the shipped one)")
    p.add_argument("--data", type=Path, help="the target's nanoGPT dataset directory (train.bin, val.bin, meta.pkl)")
    p.add_argument("--tokenizer", type=Path, help="for GPT-2 BPE data: a directory with GPT-2's tokenizer files")
    p.add_argument("--init", type=Path, help="start from this checkpoint's weights (the shipped pair only)")
    p.add_argument("--distill", type=Path, metavar="TARGET", help="train on this checkpoint's output distribution "
                   "(KL at a softened temperature, mixed with the data loss) as well as the data")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where to train (the same batches either way)")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    cfg = replace(DEFAULTS[args.name], **{k: v for k, v in (("steps", args.steps), ("lr", args.lr),
                                                             ("stop_at", args.stop_at)) if v is not None})
    command = "python -m training.train " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        if cfg.steps < 1 or not 1 <= (cfg.stop_at or 1) <= cfg.steps:
            raise ValueError(f"--steps must be positive and --stop-at between 1 and --steps ({cfg.steps})")
        devices.check(args.device)
        teacher = load_model(args.distill).eval() if args.distill else None
        if args.name == "head":
            if args.target is None:
                raise ValueError("head: name the target it drafts for, --target DIR")
            shipped = args.target.resolve() == (MODELS / "target").resolve()
            if args.data is None and not shipped:
                raise ValueError("head: --data DIR (the target's nanoGPT dataset) for any target but the shipped one")
            data = stdlib_data() if args.data is None else nanogpt_data(args.data, args.tokenizer)
            target_dir = args.target.resolve() if args.target.is_dir() else args.target.resolve().parent
            train_head(cfg, args.workdir or Path("runs") / f"train-head-{target_dir.name}",
                       args.out or (HEAD if shipped else target_dir.with_name(f"{target_dir.name}-eagle-head")),
                       args.target, data, command, args.device)
            return 0
        if args.like is None:
            if args.data is not None:
                raise ValueError("--data goes with --like: the shipped pair trains on the standard library")
            train(args.name, cfg, args.workdir or Path("runs") / f"train-{args.name}", args.out or MODELS / args.name,
                  GEOMETRIES[args.name], stdlib_data(), command, args.init, teacher, args.device)
            return 0
        if args.name != "draft" or args.data is None:
            raise ValueError("--like trains a draft: python -m training.train draft --like TARGET --data DIR")
        target = read_config(args.like)[0]
        data = nanogpt_data(args.data, args.tokenizer)
        cfg = replace(cfg, seq=min(cfg.seq, target.block_size, len(data.heldout) - 1))
        target_dir = args.like.resolve() if args.like.is_dir() else args.like.resolve().parent
        tag = f"draft-like-{target_dir.name}"
        train(tag, cfg, args.workdir or Path("runs") / f"train-{tag}",
              args.out or target_dir.with_name(f"{target_dir.name}-draft"), draft_geometry(target), data, command,
              teacher=teacher, device=args.device)
    except (ValueError, OSError) as e:  # CheckpointError included
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

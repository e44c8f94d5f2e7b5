"""Checkpoints: our own format (config.json + model.safetensors, which is also a Hugging Face GPT-2 folder), local
Hugging Face GPT-2 directories, and nanoGPT's `ckpt.pt` (a file, or a directory holding one, as nanoGPT's train.py
writes it).

Every way a checkpoint can be wrong (missing, corrupt, mis-shaped, not matching its config, weights or logits
that are not finite) raises `CheckpointError` with a one-line message naming the file and the problem. Our
weights file also records the geometry it was saved with, so a config.json edited afterwards (a head count
changes no tensor's shape) is caught; Hugging Face and nanoGPT checkpoints hold their geometry in one place
only. Nothing is ever downloaded.
"""
import functools
import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from mlperf.files import atomic, write_text
from mlperf.model import GEOMETRIES, GPT, EagleHead, GPTConfig

FORMAT = "mlperf-gpt/2"  # config.json is also GPT2LMHeadModel's config; the weights in its names and layout
FORMAT_V1 = "mlperf-gpt/1"  # the weights in our names and nn.Linear's layout; still read
HEAD_FORMAT = "mlperf-eagle-head/1"
GEOMETRY_KEY = "mlperf-gpt-geometry"  # the weights file's header entry holding the config it was saved with
LAYER = re.compile(r"transformer\.h\.(\d+)\.")
CONFIG, WEIGHTS = "config.json", "model.safetensors"
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # Conv1D
HF_GEOMETRY = ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")  # a GPT2Config's keys that shape the model
HF_IGNORED = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of older checkpoints
NANOGPT = "ckpt.pt"
NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias")
COMPILED = "_orig_mod."  # the prefix torch.compile leaves on every state-dict key


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message is one line."""


def save_checkpoint(model: GPT | EagleHead, path, dtype=torch.float16, meta: dict | None = None) -> None:
    """Write config.json and model.safetensors into directory `path`, each atomically (temp file, then rename). A
    model's folder is also a Hugging Face GPT-2 one (`transformers` loads it); an EAGLE head is saved in our names,
    without the target's embedding and LM head, which it borrows."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    head = isinstance(model, EagleHead)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}
    config = {"format": HEAD_FORMAT if head else FORMAT, "dtype": str(dtype).removeprefix("torch."),
              "model": vars(model.config).copy(), "meta": meta or {}}
    if not head:
        tensors = _to_hf(tensors)
        config |= hf_config(model.config, dtype)
    header = {"format": "pt", GEOMETRY_KEY: json.dumps(asdict(model.config))}
    atomic(path / WEIGHTS, lambda tmp: Path(tmp).write_bytes(_sorted_header(save(tensors, metadata=header))))
    write_text(path / CONFIG, json.dumps(config, indent=2) + "\n")


def random_checkpoint(geometry: str, path, seed: int = 0, device: str = "cpu") -> GPT:
    """A checkpoint of a named geometry (mlperf.model.GEOMETRIES) with GPT-2's init, seeded: real sizes for timing,
    whose random weights say nothing of what a trained draft's acceptance would be."""
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r}; choose one of {', '.join(GEOMETRIES)}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(GEOMETRIES[geometry])
    save_checkpoint(model, path, meta={"weights": f"random, GPT-2's init, seed {seed}"})
    return model


def hf_config(c: GPTConfig, dtype=torch.float16) -> dict:
    """GPT2LMHeadModel's config of geometry `c`: GPT-2's tanh GELU, tied embeddings, no dropout, no special tokens."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": c.n_layer, "n_head": c.n_head,
            "n_embd": c.n_embd, "vocab_size": c.vocab_size, "n_positions": c.block_size, "n_ctx": c.block_size,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
            "bos_token_id": None, "eos_token_id": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "torch_dtype": str(dtype).removeprefix("torch.")}


def _sorted_header(blob: bytes) -> bytes:
    """A safetensors file with its metadata's keys sorted: the library writes them in a random order, and equal
    models must give equal files (the checkpoint's fingerprint)."""
    n = int.from_bytes(blob[:8], "little")  # the header's length; the JSON header, padded with spaces, follows
    header = json.loads(blob[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return blob[:8] + text.ljust(n) + blob[8 + n:]


def read_config(path) -> tuple[GPTConfig, str]:
    """The model geometry of a checkpoint and its kind: "mlperf", "hf" or "nanogpt"."""
    path = Path(path)
    if nanogpt_file(path):
        return _nanogpt_config(nanogpt_file(path)), "nanogpt"
    if not path.is_dir():
        raise CheckpointError(f"checkpoint not found: {path} is not a directory or a nanoGPT {NANOGPT}; a Hugging "
                              f"Face model is read from a local folder, which `huggingface-cli download "
                              f"openai-community/{path.name} --local-dir {path.name}` makes on a machine online "
                              "(docs/models.md, \"Your own pair\")")
    raw = _read_json(path / CONFIG)
    ours = raw.get("format") in (FORMAT, FORMAT_V1)
    try:
        if ours:
            config = GPTConfig(**raw["model"])
        elif raw.get("model_type") == "gpt2":
            return GPTConfig(n_layer=raw["n_layer"], n_head=raw["n_head"], n_embd=raw["n_embd"],
                             vocab_size=raw["vocab_size"], block_size=raw["n_positions"]), "hf"
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path / CONFIG}: bad model config ({e})") from None
    if ours:
        return (_checked_against_hf(path, config, raw) if raw["format"] == FORMAT else config), "mlperf"
    raise CheckpointError(f"{path / CONFIG}: neither an {FORMAT} checkpoint nor a Hugging Face GPT-2 config")


def _checked_against_hf(path: Path, config: GPTConfig, raw: dict) -> GPTConfig:
    """Our geometry, once config.json's Hugging Face copy of it (what `transformers` builds) is seen to agree."""
    hf = hf_config(config)
    differ = [f"{k} {raw.get(k)!r} (the model's {hf[k]!r})" for k in HF_GEOMETRY if raw.get(k) != hf[k]]
    if differ:
        raise CheckpointError(f"{path / CONFIG}: its Hugging Face keys disagree with its model: {', '.join(differ)}")
    return config


def read_meta(path) -> dict:
    """The `meta` our trainer writes into a checkpoint's config.json (tokens seen, losses, ...); {} if it has none."""
    return _read_json(Path(path) / CONFIG).get("meta", {})


def nanogpt_file(path: Path) -> Path | None:
    """The nanoGPT checkpoint file `path` names: a `.pt` file, or a directory with ckpt.pt and no config.json."""
    if path.is_file() and path.suffix == ".pt":
        return path
    if path.is_dir() and (path / NANOGPT).is_file() and not (path / CONFIG).is_file():
        return path / NANOGPT
    return None


def _read_nanogpt(file: Path) -> dict:
    """nanoGPT's checkpoint dict, loaded with weights_only (nothing in the file is executed) and memory-mapped."""
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # unpickling and zip errors come in many types; all mean the same here
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{file}: not a loadable nanoGPT checkpoint ({reason})") from None
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("model_args"), dict)
            and isinstance(ckpt.get("model"), dict)):
        raise CheckpointError(f"{file}: not a nanoGPT checkpoint (expected a dict with model_args and model)")
    return ckpt


def _nanogpt_config(file: Path) -> GPTConfig:
    args = _read_nanogpt(file)["model_args"]
    missing = [k for k in NANOGPT_ARGS if k not in args]
    if missing:
        raise CheckpointError(f"{file}: model_args lacks {', '.join(missing)}")
    try:
        return GPTConfig(**{k: args[k] for k in NANOGPT_ARGS})
    except ValueError as e:
        raise CheckpointError(f"{file}: bad model_args ({e})") from None


@functools.lru_cache(maxsize=64)
def file_digest(path: str, mtime_ns: int, size: int) -> bytes:
    """A file's sha256, read once per version of it (its time and size key it): a run names its pair in several
    places, and a large model's weights take seconds to hash."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").digest()


def fingerprint(path) -> str:
    """A short hash of the files `load_model` reads (config and weights, or nanoGPT's ckpt.pt): it tells two models
    at the same path apart, such as the default target before and after a retrain."""
    path = Path(path)
    kind = "mlperf" if is_head(path) else read_config(path)[1]
    files = [nanogpt_file(path)] if kind == "nanogpt" else [path / CONFIG, _weights_file(path, kind)]
    h = hashlib.sha256()
    for f in files:
        stat = Path(f).stat()
        h.update(file_digest(str(Path(f).resolve()), stat.st_mtime_ns, stat.st_size))
    return h.hexdigest()[:16]


def pair_key(target, draft) -> str:
    """A model pair's name in results/: its checkpoints' names and a hash of both, so that two pairs (or a pair
    before and after a retrain) never share a `latest`; a draft that cannot be read is left out of it."""
    names, h = [Path(target).stem], hashlib.sha256(fingerprint(target).encode())
    try:
        h.update(fingerprint(draft).encode())
        names.append(Path(draft).stem)
    except (CheckpointError, OSError):
        pass
    return f"{'+'.join(names)}-{h.hexdigest()[:8]}"


def _read_json(file: Path) -> dict:
    if not file.is_file():
        raise CheckpointError(f"checkpoint has no {file.name}: {file} not found")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return raw


def load_model(path, device="cpu", dtype=torch.float32) -> GPT:
    """Build the model a checkpoint directory describes and load its weights, validating every tensor, the
    geometry the weights were saved with (where recorded) and that a short forward gives finite logits."""
    path = Path(path)
    config, kind = read_config(path)
    tensors, saved = _read_weights(path, kind)
    given = asdict(config)
    if saved is not None and saved != given:
        differ = ", ".join(f"{k} {given.get(k)!r} (saved with {v!r})" for k, v in saved.items() if given.get(k) != v)
        raise CheckpointError(f"{path}: {CONFIG} does not match the geometry its weights were saved with: {differ}")
    if kind == "hf" or kind == "mlperf" and _read_json(path / CONFIG)["format"] == FORMAT:
        tensors = _from_hf(tensors)
    layers = {int(m.group(1)) for name in tensors if (m := LAYER.match(name))}
    if layers != set(range(config.n_layer)):  # before building: a config of millions of layers would never load
        raise CheckpointError(f"{path}: config has n_layer {config.n_layer}, the weights hold {len(layers)} layers")
    with torch.device("meta"):
        model = GPT(config)
    _check_tensors(path, {k: v.shape for k, v in model.state_dict().items() if k != "lm_head.weight"}, tensors)
    model.load_state_dict(_placed(tensors, device, dtype), strict=False, assign=True)
    model.lm_head.weight = model.transformer.wte.weight  # re-tie: the embedding's meta tensor was replaced
    model.eval()
    with torch.inference_mode():
        probe = torch.arange(min(16, config.block_size), device=device)[None] % config.vocab_size
        if not torch.isfinite(model(probe).logits).all():
            raise CheckpointError(f"{path}: the model's logits are not finite in {str(dtype).removeprefix('torch.')}")
    return model


def is_head(path) -> bool:
    """Whether `path` is an EAGLE head's checkpoint directory (which `load_head` reads, not `load_model`)."""
    path = Path(path)
    return (path / CONFIG).is_file() and _read_json(path / CONFIG).get("format") == HEAD_FORMAT


def load_head(path, target: GPT, device="cpu", dtype=torch.float32) -> EagleHead:
    """An EAGLE head's checkpoint, validated as `load_model` validates a model, and checked against the target
    whose features it reads (width, vocabulary, context)."""
    path = Path(path)
    if not (path / CONFIG).is_file():
        raise CheckpointError(f"EAGLE head not found: {path} (`python -m training.train head --target DIR` trains one)")
    raw = _read_json(path / CONFIG)
    if raw.get("format") != HEAD_FORMAT:
        raise CheckpointError(f"{path}: not an EAGLE head ({HEAD_FORMAT}); `python -m training.train head` makes one")
    try:
        config = GPTConfig(**raw["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path / CONFIG}: bad model config ({e})") from None
    tensors, saved = _read_weights(path, "mlperf")
    if saved is not None and saved != asdict(config):
        raise CheckpointError(f"{path}: {CONFIG} does not match the geometry its weights were saved with")
    t = target.config
    if (config.n_embd, config.vocab_size, config.block_size) != (t.n_embd, t.vocab_size, t.block_size):
        raise CheckpointError(f"{path}: the head was made for a target {config.n_embd} wide with vocab "
                              f"{config.vocab_size} and context {config.block_size}, not this one ({t.n_embd}, "
                              f"{t.vocab_size}, {t.block_size})")
    with torch.device("meta"):
        head = EagleHead(config)
    _check_tensors(path, {k: v.shape for k, v in head.state_dict().items()}, tensors)
    head.load_state_dict(_placed(tensors, device, dtype), assign=True)
    return head.eval()


def _placed(tensors: dict[str, torch.Tensor], device, dtype) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors on the device, in the dtype and contiguous, to take the places of a model's meta
    tensors (load_state_dict's assign): allocating the model with to_empty first imports torch.fx's shape
    machinery, more than half a second of every command's start."""
    return {k: v.to(device=device, dtype=dtype).contiguous() for k, v in tensors.items()}


def _check_tensors(path: Path, expected: dict[str, torch.Size], tensors: dict[str, torch.Tensor]) -> None:
    """Every expected tensor present, nothing else, each of its shape and finite."""
    missing = sorted(expected.keys() - tensors.keys())
    unexpected = sorted(tensors.keys() - expected.keys())
    if missing:
        raise CheckpointError(f"{path}: missing tensors: {_few(missing)}")
    if unexpected:
        raise CheckpointError(f"{path}: unexpected tensors: {_few(unexpected)}")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise CheckpointError(f"{path}: config does not match weights: {name} has shape "
                                  f"{tuple(tensors[name].shape)}, config implies {tuple(shape)}")
        if not torch.isfinite(tensors[name]).all():
            raise CheckpointError(f"{path}: {name} holds NaN or infinite values")


def _read_weights(path: Path, kind: str) -> tuple[dict[str, torch.Tensor], dict | None]:
    """The checkpoint's tensors, and the geometry our weights file records (None where it records none)."""
    if kind == "nanogpt":  # the head is tied to wte; `.attn.bias` is the causal mask of nanoGPT's slow path
        return {k.removeprefix(COMPILED): v for k, v in _read_nanogpt(nanogpt_file(path))["model"].items()
                if not k.endswith(("lm_head.weight", ".attn.bias"))}, None
    file = _weights_file(path, kind)
    try:
        if file.suffix == ".bin":
            return torch.load(file, map_location="cpu", weights_only=True), None
        with safe_open(file, "pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        saved = json.loads(header[GEOMETRY_KEY]) if GEOMETRY_KEY in header else None
        return tensors, saved
    except (SafetensorError, RuntimeError, OSError, EOFError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{file}: corrupt or truncated weights file ({reason})") from None


def _weights_file(path: Path, kind: str) -> Path:
    names = (WEIGHTS,) if kind == "mlperf" else HF_WEIGHTS
    file = next((path / n for n in names if (path / n).is_file()), None)
    if file is None:
        raise CheckpointError(f"{path}: no weights file ({' or '.join(names)})")
    return file


def _from_hf(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename Hugging Face GPT-2 tensors to ours and transpose its Conv1D weights."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(HF_IGNORED) or name == "lm_head.weight":  # the head is tied to wte
            continue
        name = name if name.startswith("transformer.") else "transformer." + name
        out[name] = t.t() if name.endswith(HF_TRANSPOSED) else t
    return out


def _to_hf(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensors in Hugging Face GPT-2's names (no `transformer.` prefix, as its own files) and Conv1D layout."""
    return {k.removeprefix("transformer."): (v.t() if k.endswith(HF_TRANSPOSED) else v).contiguous()
            for k, v in tensors.items()}


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")

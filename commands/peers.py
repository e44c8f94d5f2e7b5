"""llama.cpp beside us: `make peers` builds it once from the pinned llama-cpp-python source distribution and
checks it (commands/peer_build.py; never in `make test`); bench converts the run's target and draft to GGUF (F32,
F16, Q8_0) and adds llama.cpp's plain and speculative decoding of the same prompts, checked against our baseline;
`--engine llama-server` starts its server on the same GGUF files for a LoadGen run through `--endpoint`.

The byte vocabulary goes into GGUF as GPT-2's byte-level BPE with 256 tokens and no merge that text can use:
llama.cpp turns a prompt's text into exactly our token ids (byte b is token b), and its output bytes are our ids
again. Timings are llama.cpp's own (its prompt and decode phases), not the process's start or the model's load.
"""
import ctypes
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mlperf.checkpoint import fingerprint, load_model, read_config
from mlperf.env import default_threads
from scenarios.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.3.36"  # llama-cpp-python, whose source distribution vendors the llama.cpp this was measured with
HOME = ROOT / ".peers"  # the download, the build and the converted models (ignored by git)
SOURCE = HOME / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
BUILD = HOME / "build"
PLAIN, SPECULATIVE = BUILD / "bin" / "llama-completion", BUILD / "bin" / "llama-speculative-simple"
SERVER = BUILD / "bin" / "llama-server"
PRECISIONS = ("F32", "F16", "Q8_0")
QUANTISED = "Q8_0"  # the precision whose target is not the baseline's weights: its tokens may differ
AS_GGUF = {"fp32": "F32", "fp16": "F16", "int8": "Q8_0"}  # a run's --weights as llama.cpp's precisions
SERVER_START_S = 120.0  # for llama-server to load its models and answer /health
RUN_TIMEOUT_S = 300.0  # for one llama.cpp generation before it counts as hung
MISSING = "llama.cpp's rows are left out: `make peers` builds it (once, about 10 minutes on 2 cores)"


def available() -> bool:
    return PLAIN.is_file() and SPECULATIVE.is_file() and SERVER.is_file()


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-in for each byte (its byte-level BPE's alphabet), in byte order: token b is byte b."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def convert(checkpoint: str, precision: str) -> Path:
    """The checkpoint as a GGUF file of llama.cpp's gpt2 architecture (cached by the checkpoint's fingerprint):
    linear and embedding weights in `precision`, norms, biases and positions in F32."""
    out = HOME / "gguf" / f"{Path(checkpoint).name}-{fingerprint(checkpoint)}-{precision}.gguf"
    if out.is_file():
        return out
    model = load_model(checkpoint)
    c = model.config
    if c.vocab_size != 256:
        raise ValueError(f"{checkpoint}: llama.cpp's rows take the byte vocabulary (256), not {c.vocab_size}")
    if not (SOURCE / "gguf-py").is_dir():
        raise ValueError(MISSING)
    sys.path.insert(0, str(SOURCE / "gguf-py"))
    import gguf
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out) + ".partial", "gpt2")
    writer.add_name(Path(checkpoint).name)
    writer.add_context_length(c.block_size)
    writer.add_embedding_length(c.n_embd)
    writer.add_feed_forward_length(4 * c.n_embd)
    writer.add_block_count(c.n_layer)
    writer.add_head_count(c.n_head)
    writer.add_layer_norm_eps(1e-5)
    writer.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                          "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[precision])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(byte_tokens())
    writer.add_token_types([gguf.TokenType.NORMAL] * 256)
    writer.add_token_merges(["ÿ ÿ"])  # llama.cpp wants a merge; byte 0xFF twice never occurs in UTF-8 text
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)  # the byte vocabulary has no EOS; NUL never occurs in the prompts, and --ignore-eos
    writer.add_add_bos_token(False)
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied to the token embedding: llama.cpp's gpt2 reads it from there
            continue
        key = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
               "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias"}.get(name)
        if key is None:
            m = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)\.(weight|bias)", name)
            key = f"blk.{m[1]}.{names[m[2]]}.{m[3]}"
        data = tensor.float().numpy()
        if data.ndim == 2 and key != "position_embd.weight" and precision != "F32":
            kind = gguf.GGMLQuantizationType[precision]
            data = gguf.quants.quantize(data, kind) if precision == "Q8_0" else data.astype(np.float16)
            writer.add_tensor(key, data, raw_dtype=kind)
        else:
            writer.add_tensor(key, data.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    Path(str(out) + ".partial").rename(out)
    return out


@dataclass
class Output:
    """One generation by llama.cpp, with its own timings."""
    tokens: list[int]
    seconds: float  # its prompt phase and its decode phase
    decode_s: float
    decoded: int  # tokens its decode phase timed
    drafted: int = 0
    accepted: int = 0


class PeerFailed(ValueError):
    """A peer engine's run crashed, hung or printed no result: bench and engines report it in the peer's row and go
    on. `signal`: the one it died of (SIGILL: an instruction this CPU refuses), else None."""

    def __init__(self, message: str, signal: str | None = None):
        super().__init__(message)
        self.signal = signal


def generate(model: Path, prompt: list[int], n: int, threads: int, draft: Path | None = None,
             gamma: int = 6, tries: int = 3) -> Output:
    """llama.cpp's greedy continuation of `prompt` (token ids: bytes), n tokens: plain (llama-completion) or
    speculative with `draft` proposing up to gamma tokens a cycle (llama-speculative-simple, its defaults otherwise).
    llama.cpp writes its log from a thread of its own, which now and then loses the last lines (its timings) as the
    process exits: such a run is made again, up to `tries` times. PeerFailed, in one line, where the tool dies of a
    signal (an instruction this CPU refuses: SIGILL), exits with an error, hangs past RUN_TIMEOUT_S or never prints
    its timings."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(bytes(prompt) + b"\n")  # llama.cpp drops a prompt file's last newline
        f.flush()
        common = ["-m", str(model), "-f", f.name, "--no-escape", "-n", str(n), "-t", str(threads), "-c", "0",
                  "--temp", "0", "--seed", "0"]
        cmd = [str(SPECULATIVE), *common, "--spec-type", "draft-simple", "-md", str(draft), "--spec-draft-n-max",
               str(gamma), "-td", str(threads)] if draft \
            else [str(PLAIN), *common, "--no-warmup", "-no-cnv", "--no-display-prompt", "--simple-io", "--ignore-eos"]
        tool = Path(cmd[0]).name
        for attempt in range(tries):
            try:
                done = subprocess.run(cmd, capture_output=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise PeerFailed(f"{tool} hung (no answer in {RUN_TIMEOUT_S:.0f} s)") from None
            if done.returncode < 0:
                died = signal.Signals(-done.returncode).name
                raise PeerFailed(f"{died} in {tool}", died)
            try:
                return read_output(done, prompt, n, draft is not None)
            except LookupError:
                if attempt == tries - 1 or done.returncode:
                    said = done.stderr.decode(errors="replace").strip()[-300:] or "no output"
                    raise PeerFailed(f"llama.cpp failed ({tool}, exit {done.returncode}): {said}") from None


def read_output(done: subprocess.CompletedProcess, prompt: list[int], n: int, speculative: bool) -> Output:
    """The tokens and timings of one llama.cpp run; LookupError where its log lacks them."""
    log = done.stderr.decode(errors="replace")

    def read(pattern: str) -> tuple[str, ...]:
        found = re.search(pattern, log)
        if done.returncode or not found:
            raise LookupError(pattern)
        return found.groups()
    out = done.stdout
    if speculative:  # speculative-simple prints the prompt before its output
        out = out.split(bytes(prompt), 1)[-1]
        enc_s, = read(r"encoded +\d+ tokens in +([\d.]+) seconds")
        decoded, dec_s = read(r"decoded +(\d+) tokens in +([\d.]+) seconds")
        (drafted,), (accepted,) = read(r"n_drafted += (\d+)"), read(r"n_accept += (\d+)")
        return Output(list(out)[:n], float(enc_s) + float(dec_s), float(dec_s), int(decoded), int(drafted),
                      int(accepted))
    prompt_ms, = read(r"prompt eval time = +([\d.]+) ms")
    eval_ms, runs = read(r" eval time = +([\d.]+) ms / +(\d+) runs")
    return Output(list(out)[:n], (float(prompt_ms) + float(eval_ms)) / 1e3, float(eval_ms) / 1e3, int(runs))


def generators(target: str, draft: str, gamma: int, n: int) -> dict:
    """bench's llama.cpp rows, plain and speculative at each precision, on bench's torch threads; {} where llama.cpp
    is not built."""
    if not available():
        return {}
    import torch
    threads, rows = torch.get_num_threads(), {}
    for precision in PRECISIONS:
        t, d = convert(target, precision), convert(draft, precision)
        rows[f"llama.cpp {precision}"] = lambda p, t=t: generate(t, p, n, threads)
        rows[f"llama.cpp speculative {precision} (draft max {gamma})"] = \
            lambda p, t=t, d=d: generate(t, p, n, threads, d, gamma)
    return rows


@contextmanager
def llama_server(cfg: RunConfig):
    """For the block, llama.cpp's server of the run's target at its --weights (F32, F16, Q8_0), speculative with its
    draft and gamma for `--sut spec`, on a free loopback port with the run's threads and a slot per row of
    max_batch: its URL. Stopped after, whatever ended the block (and with this process, should it be killed)."""
    if not SERVER.is_file():
        raise ValueError("--engine llama-server needs llama.cpp's server: `make peers` builds it (once, about 15 "
                         "minutes on 2 cores)")
    precision, config = AS_GGUF[cfg.weights], read_config(cfg.target)[0]
    slots = cfg.scenario.rows(cfg.max_batch)
    threads = str(cfg.threads or default_threads())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(SERVER), "-m", str(convert(cfg.target, precision)), "--host", "127.0.0.1", "--port", str(port),
           "-t", threads, "-tb", threads, "-np", str(slots), "-c", str(config.block_size * slots), "--metrics",
           "--no-webui", "--alias", f"llama-server-{cfg.sut}", "--no-cache-prompt",
           "--threads-http", str(slots + 2)]  # an HTTP thread for every slot's stream (its default: the cores)
    if cfg.sut == "spec":
        cmd += ["--spec-type", "draft-simple", "-md", str(convert(cfg.draft, precision)), "--spec-draft-n-max",
                str(cfg.gamma), "-td", threads]
    log = HOME / "llama-server.log"
    drafting = f", speculative, draft max {cfg.gamma}" if cfg.sut == "spec" else ""
    print(f"starting llama-server ({precision}{drafting}, {slots} slots, {threads} threads; its log: {log}) ...",
          flush=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=dies_with_parent)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def dies_with_parent() -> None:
    """In the child before exec: the kernel sends it SIGTERM when the run's process dies, however it dies (Linux)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if proc.returncode < 0:
                died = signal.Signals(-proc.returncode).name
                raise PeerFailed(f"{died} in llama-server before it answered (its log: {log})", died)
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise PeerFailed(f"llama-server exited ({proc.returncode}) before answering: {tail[0]}")
        with suppress(OSError):
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        time.sleep(0.2)
    raise PeerFailed(f"llama-server did not answer {url}/health within {SERVER_START_S:.0f} s (its log: {log})")


@contextmanager
def engine(cfg: RunConfig):
    """The run's settings with the peer engine it names started for the block (its URL as the endpoint, the SUT
    named after it), or as they are: no --engine, or a run whose engine a parent already started."""
    if not cfg.engine or cfg.endpoint:
        yield cfg
        return
    cfg.validate()
    with llama_server(cfg) as url:
        yield replace(cfg, endpoint=url, sut=f"{cfg.engine}-{cfg.sut}")

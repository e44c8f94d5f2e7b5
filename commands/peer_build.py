"""`make peers`: build llama.cpp once from the pinned source, then check what was built.

Each tool decodes a few tokens at every precision bench and `--engine llama-server` ask for (F32, F16, Q8_0), on a
prompt long enough for ggml's batched paths. A native build (`-march=native`, with whatever the CPU advertises) can
die of an instruction this machine refuses (AMX tiles on some cloud VMs: SIGILL in Q8_0); a tool that dies of a
signal has the whole build made again once, portable (each x86 extension the CPU lists, AMX off). What was built,
with which flags, and what still fails are kept beside the build (`record_path`); bench's and engines' peer rows
and `--engine` run records carry `describe()`'s line.
"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from commands import peers
from commands.peers import PeerFailed

NATIVE = ["-DGGML_NATIVE=ON"]
X86 = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C", "bmi2": "GGML_BMI2",
       "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512", "avx512vbmi": "GGML_AVX512_VBMI",
       "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16"}  # /proc/cpuinfo's flag: ggml's option
NO_AMX = ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
CHECK_BYTES = 160  # the check's prompt: more tokens than ggml takes one by one
CHECK_TOKENS = 4


def record_path() -> Path:
    return peers.BUILD / "mlperf-build.json"


def read_record() -> dict | None:
    """What `make peers` built and found (flags, native, rebuilt, failed), None before it has checked a build."""
    path = record_path()
    return json.loads(path.read_text()) if path.is_file() else None


def describe() -> str:
    """The build in one line, for a peer's row and run record: its flags, why it was rebuilt, what fails."""
    record = read_record()
    if record is None:
        return "unchecked build (run `make peers`)"
    line = " ".join(record["flags"])
    if record["rebuilt"]:
        line += f" (rebuilt: {record['rebuilt']})"
    if record["failed"]:
        line += "; fails: " + ", ".join(f"{what} ({why})" for what, why in record["failed"].items())
    return line


def note_in_record(run_dir: Path) -> None:
    """An `--engine llama-server` run's record, with the build that served it (its endpoint's `build`)."""
    from scenarios.records import RunRecord
    record = RunRecord.load(run_dir)
    record.endpoint = {**(record.endpoint or {}), "build": describe()}
    record.save(run_dir)


def cpu_flags() -> set[str]:
    """The instruction-set flags the kernel lists for this CPU (none where /proc/cpuinfo is not Linux's x86 one)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def portable_flags(flags: set[str]) -> list[str]:
    """A build for this CPU without -march=native: each x86 extension it lists on, the others and AMX off."""
    return ["-DGGML_NATIVE=OFF", *(f"-D{option}={'ON' if flag in flags else 'OFF'}" for flag, option in X86.items()),
            *NO_AMX]


def fetch() -> None:
    """The pinned source distribution, downloaded and unpacked once."""
    peers.HOME.mkdir(exist_ok=True)
    sdist = peers.HOME / f"llama_cpp_python-{peers.VERSION}.tar.gz"
    if not sdist.is_file():
        step([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={peers.VERSION}", "-d", str(peers.HOME)])
    if not peers.SOURCE.is_dir():
        print(f"unpacking {sdist.name} ...", flush=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(peers.HOME, filter="data")


def step(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode:
        raise ValueError(f"building llama.cpp failed at: {' '.join(cmd[:3])} ... (output above)")


def compile_tools(flags: list[str]) -> None:
    """llama.cpp's three tools, configured afresh with `flags` (cmake's progress shown)."""
    shutil.rmtree(peers.BUILD, ignore_errors=True)
    step(["cmake", "-S", str(peers.SOURCE), "-B", str(peers.BUILD), "-DCMAKE_BUILD_TYPE=Release", *flags,
          "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=ON"])
    step(["cmake", "--build", str(peers.BUILD), "-j", str(len(os.sched_getaffinity(0))), "--target",
          peers.PLAIN.name, peers.SPECULATIVE.name, peers.SERVER.name])


def check(target: str, draft: str) -> dict[str, PeerFailed]:
    """Every tool at every precision on a prompt from the shipped set: what failed, and how."""
    from mlperf.data import load_prompts
    from scenarios.config import RunConfig
    text = load_prompts()[0].text.encode()[:CHECK_BYTES].decode(errors="ignore")  # whole characters: the server's
    prompt = list(text.encode())
    failed = {}
    for weights, precision in peers.AS_GGUF.items():
        t, d = peers.convert(target, precision), peers.convert(draft, precision)
        server = RunConfig(sut="baseline", target=target, draft=draft, weights=weights, threads=2)
        for tool, run in ((peers.PLAIN, lambda: peers.generate(t, prompt, CHECK_TOKENS, 2)),
                          (peers.SPECULATIVE, lambda: peers.generate(t, prompt, CHECK_TOKENS, 2, d, 3)),
                          (peers.SERVER, lambda: complete_once(server, text))):
            try:
                out = run()
                if out is not None and len(out.tokens) != CHECK_TOKENS:
                    raise PeerFailed(f"{tool.name} answered {len(out.tokens)} tokens, not {CHECK_TOKENS}")
            except PeerFailed as e:
                failed[f"{tool.name} {precision}"] = e
    return failed


def complete_once(cfg, prompt: str) -> None:
    """llama-server started on cfg's target, healthy, and answering one completion."""
    with peers.llama_server(cfg) as url:
        body = json.dumps({"prompt": prompt, "n_predict": CHECK_TOKENS, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=peers.RUN_TIMEOUT_S) as response:
                answer = json.loads(response.read())
        except (OSError, ValueError) as e:  # refused, reset or timed out as it died; or not JSON
            raise PeerFailed(f"{peers.SERVER.name} gave no completion ({type(e).__name__}: {e})") from None
        if not isinstance(answer.get("content"), str):
            raise PeerFailed(f"{peers.SERVER.name} answered without a completion: {str(answer)[:100]}")


def build(target: str, draft: str) -> dict:
    """Build (native) and check; rebuild once, portable, if a tool died of a signal; check again. The record."""
    if peers.available() and (record := read_record()) is not None:
        return record
    fetch()
    flags = NATIVE  # a build from before these checks was a native one too
    if not peers.available():
        compile_tools(flags)
    failed, rebuilt = check(target, draft), None
    died = [f"{e} ({what.split()[-1]})" for what, e in failed.items() if e.signal]
    if died and flags == NATIVE:
        rebuilt = died[0]
        flags = portable_flags(cpu_flags())
        print(f"llama.cpp: {rebuilt} with the native build; rebuilding once without native flags or AMX ...",
              flush=True)
        compile_tools(flags)
        failed = check(target, draft)
    record = {"flags": flags, "native": flags == NATIVE, "rebuilt": rebuilt,
              "failed": {what: str(e) for what, e in failed.items()}}
    record_path().write_text(json.dumps(record, indent=1) + "\n")
    return record


def main() -> None:
    from scenarios.config import RunConfig
    record = build(RunConfig.target, RunConfig.draft)
    print(f"llama.cpp from llama-cpp-python {peers.VERSION}: {peers.BUILD}, {describe()}")
    if record["failed"]:
        raise ValueError(f"llama.cpp cannot run {', '.join(record['failed'])} on this machine; bench and engines "
                         "show those rows as failed")
    print("`make bench` now adds llama.cpp's rows, and `--engine llama-server` runs its server under LoadGen (the "
          "shipped pair converted to GGUF on first use, in .peers/gguf)")

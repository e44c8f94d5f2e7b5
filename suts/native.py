"""Builds and loads suts/kernels.c, the C kernels of the CPU fast path (suts/fastpath.py).

Compiled once per machine with the system's C compiler ($CC, else cc) for the CPU it runs on, in well under a
second, and cached under ~/.cache/mlperf-spec by source, compiler, CPU and flags; OpenMP where the compiler has it
(the library then shares torch's own OpenMP runtime and threads). Without a compiler, or with MLPERF_ROWS_KERNEL=0,
`rows_kernel()` is None, one line says so, and every forward runs through the modules (large linears on oneDNN).
The structs the kernels take (`call`, `model`, `layer`) are declared to ctypes from their C definitions
(`c_struct`), never repeated here.
"""
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("kernels.c")
FLAG_SETS = (["-march=native", "-fopenmp"], ["-march=native"], [])  # tried in turn, best first
BASE_FLAGS = ["-O3", "-ffp-contract=off", "-fPIC", "-shared"]


C_TYPES = {"int": ctypes.c_int, "long": ctypes.c_long}  # a struct field's C type -> ctypes' (any pointer: c_void_p)


def c_struct(name: str, source: str | None = None) -> type[ctypes.Structure]:
    """kernels.c's `struct <name>` (or one in `source`) as a ctypes Structure, its fields read from the C definition
    in order: a pointer of any type as c_void_p, an int or a long as itself; anything else a TypeError."""
    text = re.sub(r"/\*.*?\*/", "", SOURCE.read_text() if source is None else source, flags=re.S)
    body = re.search(rf"\bstruct {name} \{{(.*?)\}};", text, re.S)
    if body is None:
        raise TypeError(f"no struct {name} in {SOURCE.name}")
    fields = []
    for declaration in filter(None, (d.strip() for d in body.group(1).split(";"))):
        kind, names = re.fullmatch(r"((?:const |unsigned |struct )*\w+)\s+(.+)", declaration, re.S).groups()
        for each in (n.strip() for n in names.split(",")):
            pointer, field = each.startswith("*"), each.lstrip("* ")
            if not pointer and kind.split()[-1] not in C_TYPES:
                raise TypeError(f"struct {name}: no ctypes type for {kind} {field}")
            fields.append((field, ctypes.c_void_p if pointer else C_TYPES[kind.split()[-1]]))
    return type(name.capitalize(), (ctypes.Structure,), {"_fields_": fields})


LAYER, MODEL, CALL = (c_struct(name) for name in ("layer", "model", "call"))


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlperf-spec"


def cpu_id() -> str:
    """What -march=native compiles for: the CPU's model and flags (Linux), else what platform says."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        return "".join(line for line in info.splitlines(True) if line.startswith(("model name", "flags")))[:4096]
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def build(cc: str, out_dir: Path) -> Path:
    """The compiled library for this source, compiler, CPU and flags: from the cache, or compiled into it."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    flags = str((BASE_FLAGS, FLAG_SETS))
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, cpu_id(), flags]).encode()).hexdigest()
    lib = out_dir / f"rows-{key[:16]}.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    errors = ""
    for flags in FLAG_SETS:
        with tempfile.NamedTemporaryFile(dir=out_dir, suffix=".so", delete=False) as tmp:
            pass
        done = subprocess.run([cc, *BASE_FLAGS, *flags, str(SOURCE), "-o", tmp.name, "-lm"], capture_output=True,
                              text=True, timeout=120)
        if done.returncode == 0:
            os.replace(tmp.name, lib)  # atomic: a process beside this one never loads a half-written library
            return lib
        os.unlink(tmp.name)
        errors = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    raise RuntimeError(f"{cc} could not compile {SOURCE.name}: {errors[0]}")


@cache
def rows_kernel():
    """The loaded library (its `linear`, `forward`, `chain`, `max_rows`), or None with one line to stderr saying why."""
    if os.environ.get("MLPERF_ROWS_KERNEL", "1") == "0":
        reason = "MLPERF_ROWS_KERNEL=0"
    elif not (cc := shutil.which(os.environ.get("CC") or "cc")):
        reason = "no C compiler (cc, or $CC) on this machine"
    else:
        try:
            lib = ctypes.CDLL(str(build(cc, cache_dir())))
            lib.linear.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5
            lib.linear.restype = None
            for entry in (lib.forward, lib.chain):
                entry.argtypes, entry.restype = [ctypes.POINTER(CALL)], ctypes.c_int
            return lib
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            reason = str(e).splitlines()[0]
    print(f"fast path: its C kernels are off ({reason}); every forward runs through the modules, large linears on "
          "oneDNN", file=sys.stderr)
    return None

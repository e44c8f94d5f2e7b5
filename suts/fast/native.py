"""Builds and loads suts/fast/kernels/, the C kernels of the CPU fast path (suts/fast/fused.py), as one library.

Compiled once per machine with the system's C compiler ($CC, else cc; gcc or clang) for the CPU it runs on, in
seconds, and cached under ~/.cache/mlperf-spec by source, compiler, CPU and flags. The flags are tried best first
(`flag_sets`): the CPU's own instructions (or, with MLPERF_MARCH, a named level's) with OpenMP (the library then
shares torch's OpenMP runtime and threads), without OpenMP (Apple's clang has none), then a plain build, which every
compiler takes and which sums exactly as the others do; a build short of the best says so in one line. Without a
compiler, or with MLPERF_ROWS_KERNEL=0, `rows_kernel()` is None, one line says so, and every forward runs through
the modules (large linears on oneDNN).
The structs the kernels take (`call`, `model`, `layer`) are declared to ctypes from their C definitions in
kernels.h (`c_struct`), never repeated here.
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

KERNELS = Path(__file__).with_name("kernels")
HEADER = KERNELS / "kernels.h"  # the structs and the functions the library exports
SOURCES = tuple(KERNELS / f"{name}.c" for name in ("linear", "attention", "forward"))
# psabi: 32-byte vectors passed without AVX (a generic build), between static functions alone
BASE_FLAGS = ["-O3", "-ffp-contract=off", "-fPIC", "-shared", "-Wno-psabi"]
SUFFIX = {"Darwin": ".dylib", "Windows": ".dll"}.get(platform.system(), ".so")  # a shared library's, here


def flag_sets(machine: str = platform.machine(), system: str = platform.system(),
              march: str | None = None) -> tuple[list[str], ...]:
    """The flags tried in turn, best first: the CPU's own instructions (-march=native; -mcpu=native on ARM), or the
    instruction level `march` names ($MLPERF_MARCH, e.g. x86-64-v3: AVX2 kernels on an AVX-512 machine), with
    OpenMP, without it, then neither. No OpenMP on macOS: a compiler there that has it links its own runtime
    beside the one torch ships, and two in one process abort it."""
    native = "-mcpu=native" if machine.lower() in ("arm64", "aarch64") else "-march=native"
    arch = [f"-march={march}"] if march else [native]
    return tuple(([arch + ["-fopenmp"]] if system != "Darwin" else []) + [arch, []])


FLAG_SETS = flag_sets(march=os.environ.get("MLPERF_MARCH"))


C_TYPES = {"int": ctypes.c_int, "long": ctypes.c_long}  # a struct field's C type -> ctypes' (any pointer: c_void_p)


def c_struct(name: str, source: str | None = None) -> type[ctypes.Structure]:
    """kernels.h's `struct <name>` (or one in `source`) as a ctypes Structure, its fields read from the C definition
    in order: a pointer of any type as c_void_p, an int or a long as itself; anything else a TypeError."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text() if source is None else source, flags=re.S)
    body = re.search(rf"\bstruct {name} \{{(.*?)\}};", text, re.S)
    if body is None:
        raise TypeError(f"no struct {name} in {HEADER.name}")
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


@cache
def cache_levels() -> dict[int, int]:
    """Bytes of each level of CPU 0's data caches, as Linux lists them ({1: ..., 2: ..., 3: ...}); {} where it lists
    none. suts/fast/fused.py's `resident` reads L2's and the last level's."""
    levels = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level, size = int((index / "level").read_text()), (index / "size").read_text().strip()
            levels[level] = int(size.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(size[-1], 0)
        except (OSError, ValueError):
            continue
    return levels


def source_text() -> str:
    """Every file of the kernels' source, end to end: what a build is cached under."""
    return "\0".join(path.read_text() for path in sorted(KERNELS.iterdir()) if path.suffix in (".c", ".h"))


def build(cc: str, version: str, out_dir: Path) -> tuple[Path, list[str]]:
    """The compiled library for this source, compiler (`version`: what its --version prints), CPU and flags, and
    the flag set it was built with: from the cache (its name ends in that set's place in FLAG_SETS), or compiled
    into it."""
    tried = str((BASE_FLAGS, FLAG_SETS))
    key = hashlib.sha256("\0".join([source_text(), version, cpu_id(), tried]).encode()).hexdigest()[:16]
    libs = [out_dir / f"rows-{key}-{i}{SUFFIX}" for i in range(len(FLAG_SETS))]
    for lib, flags in zip(libs, FLAG_SETS):
        if lib.is_file():
            return lib, flags
    out_dir.mkdir(parents=True, exist_ok=True)
    errors = ""
    for lib, flags in zip(libs, FLAG_SETS):
        with tempfile.NamedTemporaryFile(dir=out_dir, suffix=SUFFIX, delete=False) as tmp:
            pass
        done = subprocess.run([cc, *BASE_FLAGS, *flags, *map(str, SOURCES), "-o", tmp.name, "-lm"], capture_output=True,
                              text=True, timeout=300)
        if done.returncode == 0:
            os.replace(tmp.name, lib)  # atomic: a process beside this one never loads a half-written library
            return lib, flags
        os.unlink(tmp.name)
        errors = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    raise RuntimeError(f"{cc} could not compile {KERNELS.name}/: {errors[0]}")


def load(path: Path) -> ctypes.CDLL:
    """A build of the kernels loaded, its `linear`, `forward` and `chain` typed for ctypes."""
    lib = ctypes.CDLL(str(path))
    lib.linear.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 6
    lib.linear.restype = None
    for entry in (lib.forward, lib.chain):
        entry.argtypes, entry.restype = [ctypes.POINTER(CALL)], ctypes.c_int
    return lib


def kernel_setting() -> str:
    """MLPERF_ROWS_KERNEL, read here alone: "0" no kernels (the modules everywhere), "1" the fused step taken untimed
    (suts/fast/choice.py), "" (unset) the fused step where it times faster than the modules."""
    return os.environ.get("MLPERF_ROWS_KERNEL", "")


@cache
def rows_kernel():
    """The loaded library (its `linear`, `forward`, `chain`, `max_rows`), or None with one line to stderr saying why."""
    if kernel_setting() == "0":
        reason = "MLPERF_ROWS_KERNEL=0"
    elif not (cc := shutil.which(os.environ.get("CC") or "cc")):
        reason = "no C compiler (cc, or $CC) on this machine"
    else:
        try:
            version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
            path, flags = build(cc, version, cache_dir())
            lib = load(path)
            named = version.partition("\n")[0].strip() or cc  # the compiler as its --version's first line names it
            lib.built = f"{named}, {' '.join(flags) or 'no -march, no OpenMP'}"
            if flags != FLAG_SETS[0]:
                refused = " ".join(f for f in FLAG_SETS[0] if f not in flags)
                print(f"fast path: {cc} refused {refused}; the kernels built with {' '.join(flags) or 'neither'}",
                      file=sys.stderr)
            return lib
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            reason = str(e).splitlines()[0]
    print(f"fast path: its C kernels are off ({reason}); every forward runs through the modules, large linears on "
          "oneDNN", file=sys.stderr)
    return None


def kernels_build() -> str:
    """Which build of the kernels this process runs (compiler and flags), or that it runs none."""
    lib = rows_kernel()
    return "kernels off" if lib is None else f"kernels by {lib.built}"

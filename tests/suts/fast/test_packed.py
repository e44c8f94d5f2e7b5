import hashlib
import os
import platform
import shutil
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from mlperf.chunk import Chunk
from suts.fast import native
from suts.baseline import Baseline
from suts.fast.native import rows_kernel
from suts.fast.packed import PackedLinear, pack_linears, pack_panels, pad_to
from tests.helpers import FP32_ATOL, SMALL, fast_runner, peaky_model

needs_kernel = pytest.mark.skipif(rows_kernel() is None, reason="the small-row kernel does not build here")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("features", [(64, 96), (40, 37)])  # 37 outputs: a last panel of the kernel's part-empty
@pytest.mark.parametrize("gelu", [None, nn.GELU(approximate="tanh"), nn.GELU()])
def test_packed_linear_matches_linear(bias, features, gelu):
    torch.manual_seed(0)
    linear = nn.Linear(*features, bias=bias)
    packed, plain = PackedLinear(linear, gelu), nn.Sequential(linear, gelu or nn.Identity())
    k, n = features
    for shape in [(1, 1, k), (k,), (2, 1, k), (1, 5, k), (3, 4, k), (1, 13, k), (3, 7, k),  # small rows
                  (1, 100, k), (3, 30, k)]:  # oneDNN's, the GELU fused
        x = torch.randn(shape)
        y = packed(x)
        assert y.shape == (*shape[:-1], n) and torch.allclose(y, plain(x), atol=FP32_ATOL)


# Weights of 80 KB count as cached (one row takes 4 adjacent panels a pass, 2 or 3 rows 2; 13 panels, so one is left
# for the groups of rows, split evenly), of 1.2 MB (fp32) or 614 KB (fp16) as streamed (one row takes 2 panels (fp32)
# or 3 (fp16) from as many parts of the layer, 2 to 4 rows 2; more rows two panels a pass half the layer apart where
# the weights are fp16 or the rows more than a group, the first group a full one; 25 panels, so some are left over).
WEIGHTS = [(96, 200), (768, 400)]


@needs_kernel
@pytest.mark.parametrize("features", WEIGHTS)
@pytest.mark.parametrize("half", [False, True])
def test_a_row_gets_the_same_result_whatever_rows_come_with_it(features, half):
    """What makes a verify pass's logits those of decode steps, bit for bit, as far as the linears go."""
    torch.manual_seed(0)
    packed = PackedLinear(nn.Linear(*features), half=half)
    x = torch.randn(packed.max_rows, features[0])
    alone = torch.cat([packed(x[i:i + 1]) for i in range(len(x))])
    for rows in range(2, packed.max_rows + 1):
        assert torch.equal(packed(x[:rows]), alone[:rows]), rows


@needs_kernel
@pytest.mark.parametrize("features", WEIGHTS)
def test_the_kernel_splits_its_work_between_threads_without_changing_it(features):
    torch.manual_seed(0)
    packed, x = PackedLinear(nn.Linear(*features)), torch.randn(5, features[0])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [packed(x[:1]), packed(x)]  # one row takes several panels a pass, five rows a group
        torch.set_num_threads(2)
        assert torch.equal(packed(x[:1]), one[0]) and torch.equal(packed(x), one[1])
    finally:
        torch.set_num_threads(threads)


def test_only_large_layers_are_packed():
    model = peaky_model(SMALL, 0)
    pack_linears(model, min_weights=32 * 96)  # c_attn (96x32) and the MLP (128x32) qualify; c_proj (32x32) not
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if name.startswith("transformer.h.0.")}
    assert kinds["transformer.h.0.attn.c_attn"] == "PackedLinear"
    assert kinds["transformer.h.0.mlp.c_fc"] == "PackedLinear"
    assert kinds["transformer.h.0.attn.c_proj"] == "Linear"
    assert kinds["transformer.h.0.mlp.gelu"] == "Identity"  # taken over by c_fc
    assert model.transformer.h[0].mlp.c_fc.gelu.approximate == "tanh"


def test_packed_model_decodes_the_same_tokens():
    plain, packed = peaky_model(SMALL, 0), pack_linears(peaky_model(SMALL, 0), min_weights=0)
    assert not any(type(m) is nn.Linear for m in packed.modules())
    for prompt in ([1, 2, 3], list(range(30)), [t % 32 for t in range(90)]):  # the last prefilled by oneDNN
        assert Baseline(packed).generate(prompt, 30).tokens == Baseline(plain).generate(prompt, 30).tokens


def test_half_precision_models_are_left_alone():
    model = peaky_model(SMALL, 0).half()
    pack_linears(model, min_weights=0)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


X86 = platform.machine().lower() in ("x86_64", "amd64")
BUILDS = {  # other builds of the C kernels than the one loaded (gcc, -march=native -fopenmp): compiler, flags
    "avx2": ("cc", ["-march=native", "-mno-avx512f"]),  # 16 registers: groups of 6 rows over one panel
    "x86-64": ("cc", ["-march=x86-64"]),  # SSE2 alone, no OpenMP: a generic build, its multiply-adds fmaf's
    "clang": ("clang", ["-march=native"]),
    "clang-x86-64": ("clang", ["-march=x86-64"]),
}


def built(cc: str, flags: list[str], out: Path, program: Path | None = None, *tail: str) -> Path:
    """The kernels' library (or `program`, which includes linear.c) built by `cc` with these flags, warning-free
    (-Werror); kept in the kernels' cache under the source, compiler, CPU and command it came from (a build takes
    10-30 s), and copied to `out`."""
    if shutil.which(cc) is None:
        pytest.skip(f"no {cc} here")
    base = [f for f in native.BASE_FLAGS if program is None or f not in ("-fPIC", "-shared")]
    sources = native.SOURCES if program is None else (program,)
    command = [cc, *base, "-Wall", "-Wextra", "-Werror", *flags, f"-I{native.KERNELS}", *map(str, sources)]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([native.source_text(), *(p.read_text() for p in sources), version, native.cpu_id(),
                                     *command, *tail]).encode()).hexdigest()[:16]
    kept = native.cache_dir() / "test-builds" / f"{out.name}-{key}"
    if not kept.is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([*command, "-o", str(out), *tail, "-lm"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        shutil.copy(out, f"{kept}.{os.getpid()}")
        os.replace(f"{kept}.{os.getpid()}", kept)  # atomic: a test beside this one never reads half a build
    shutil.copy(kept, out)
    return out


def cases():
    """What the builds are compared on: x, panels, bias, scales, N and half for fp32, fp16 and int8 panels of three
    weights (the last with subnormal halves), 1 to 9, 13 and 64 rows; the same every time."""
    torch.manual_seed(0)
    for k, n in [*WEIGHTS, (96, 40)]:
        weight, bias, scales = torch.randn(n, k).half().float(), torch.randn(n), torch.rand(n) / 64
        if n == 40:  # down to fp16's subnormals and back up, with zeros of both signs: a build without F16C
            weight = (weight * torch.logspace(-9, 3, k)).half().float()  # widens halves in its own scalar code
            weight[0, :4] = torch.tensor([0.0, -0.0, 6e-8, -3e-5]).half().float()
        for kind in ("fp32", "fp16", "int8"):
            w = (weight * 16).clamp(-127, 127).to(torch.int8) if kind == "int8" else weight
            panels, panel_bias = pack_panels(w, bias, kind == "fp16")
            for rows in [*range(1, 10), 13, 64]:
                yield torch.randn(rows, k), panels, panel_bias, pad_to(scales, n) if kind == "int8" else None, n, \
                    kind == "fp16"


def sums(kernel, resident: int = 0) -> list[torch.Tensor]:
    """Every case's outputs from a loaded build's `linear` (`resident`: the weights asked for ahead)."""
    ys = []
    for x, p, b, s, n, half in cases():
        y = torch.empty(len(x), n)
        kernel.linear(x.data_ptr(), p.data_ptr(), b.data_ptr(), None if s is None else s.data_ptr(), y.data_ptr(),
                      len(x), x.shape[1], n, 1, int(half), resident)
        ys.append(y)
    return ys


def program_sums(command: list[str]) -> list[torch.Tensor]:
    """Every case's outputs from tests/suts/fast/linear_driver.c built as a program (run by `command`)."""
    request, shapes = bytearray(), []
    for x, p, b, s, n, half in cases():
        request += struct.pack("<5i", len(x), x.shape[1], n, int(half), s is not None)
        for t in (x, p, b) if s is None else (x, p, b, s):
            raw = t.contiguous().view(torch.uint8).numpy().tobytes()
            request += struct.pack("<q", len(raw)) + raw
        shapes.append((len(x), n))
    out = subprocess.run(command, input=bytes(request), capture_output=True, check=True, timeout=600).stdout
    ys = torch.frombuffer(bytearray(out), dtype=torch.float32).split([m * n for m, n in shapes])
    return [y.view(m, n) for y, (m, n) in zip(ys, shapes)]


def forwards(kernel) -> list[torch.Tensor]:
    """Every logit of a prefill of 70 tokens, a decode step and a verify pass of 5 by the fused step of a model whose
    rows (200 wide) and heads (50 wide) end in parts of a vector, its calls on `kernel`."""
    config = replace(SMALL, n_embd=200, n_head=4, vocab_size=64)
    runner = fast_runner(peaky_model(config, 0), min_weights=0)
    runner.fast_step.kernel = kernel
    ids = torch.randint(0, config.vocab_size, (1, 76), generator=torch.Generator().manual_seed(0))
    cache = runner.new_cache(1)
    with torch.inference_mode():
        return [runner(ids[:, a:b], Chunk(cache)).logits for a, b in ((0, 70), (70, 71), (71, 76))]


@needs_kernel
@pytest.mark.skipif(not X86, reason="x86-64 builds")
@pytest.mark.parametrize("build", BUILDS)
def test_every_build_sums_as_the_loaded_one(tmp_path, build):
    """the C kernels built for AVX2 alone, for any x86-64 (SSE2, no OpenMP), and by clang, each warning-free, gives the
    loaded build's sums bit for bit: the linears' (fp32, fp16 and int8 panels, 1 to 64 rows) and a whole forward's
    logits (norms, attention's softmax, GELU). Every multiply-add is fused on every build and nothing else is, halves
    widen exactly without F16C too (subnormals, signed zeros), and a sum across lanes goes 8 lanes at a time. A build
    whose multiply-adds were not fused, or a layer norm summing as many lanes as AVX-512 has, would fail it."""
    if build == "avx2" and "avx512f" not in native.cpu_id().split():
        pytest.skip("no AVX-512 here: the loaded build is this CPU's AVX2 build")
    cc, flags = BUILDS[build]
    other = native.load(built(cc, flags, tmp_path / f"{build}.so"))
    for case, (a, b) in enumerate(zip(sums(rows_kernel()), sums(other))):
        assert torch.equal(a, b), (build, case)
    for step, (a, b) in enumerate(zip(forwards(rows_kernel()), forwards(other))):
        assert torch.equal(a, b), (build, "forward", step)


@needs_kernel
def test_one_row_over_resident_weights_asks_for_them_ahead_and_sums_alike():
    """`linear`'s passes over weights resident in the last-level cache (one row's prefetching them) give the sums
    of its others, every case: fp32, fp16 and int8 panels, cached and streamed, 1 to 64 rows."""
    for case, (a, b) in enumerate(zip(sums(rows_kernel()), sums(rows_kernel(), resident=1))):
        assert torch.equal(a, b), case


@needs_kernel
@pytest.mark.skipif(not (X86 and shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
                    reason="needs gcc-aarch64-linux-gnu and qemu-user (make check-arm says how)")
def test_an_aarch64_build_sums_as_the_loaded_one_under_emulation(tmp_path):
    """the C kernels cross-compiled for aarch64 (NEON: its fused multiply-adds vectorised by the compiler) and run under
    qemu's user-mode emulation gives the x86 build's sums bit for bit, fp32, fp16 and int8 panels, 1 to 64 rows."""
    driver = built("aarch64-linux-gnu-gcc", ["-static"], tmp_path / "driver", Path(__file__).with_name(
        "linear_driver.c"))
    for case, (a, b) in enumerate(zip(sums(rows_kernel()), program_sums(["qemu-aarch64", str(driver)]))):
        assert torch.equal(a, b), case

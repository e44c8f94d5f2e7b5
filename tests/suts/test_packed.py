import pytest
import torch
import torch.nn as nn

from suts import native
from suts.baseline import Baseline
from suts.native import rows_kernel
from suts.packed import PackedLinear, pack_linears, pack_panels, pad_to
from tests.helpers import FP32_ATOL, SMALL, peaky_model

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


def test_fp16_panels_widen_exactly_where_the_cpu_has_no_conversion_instruction(tmp_path):
    """kernels.c built without -march (no AVX, no F16C) widens fp16 panels by its own scalar conversion: normal,
    subnormal, zero and negative numbers give the fp32 panels' sums bit for bit."""
    import ctypes
    import shutil
    import subprocess
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = tmp_path / "plain.so"
    subprocess.run([cc, *native.BASE_FLAGS, str(native.SOURCE), "-o", str(lib), "-lm"], check=True, capture_output=True)
    kernel = ctypes.CDLL(str(lib))
    kernel.linear.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5
    torch.manual_seed(0)
    k, n = 96, 40
    weight = torch.randn(n, k) * torch.logspace(-9, 3, k)  # down to fp16's subnormals, and back up
    weight[0, :4] = torch.tensor([0.0, -0.0, 6e-8, -3e-5])
    weight = weight.half().float()
    bias = torch.randn(n)
    x = torch.randn(3, k)
    ys = []
    for half in (False, True):
        panels, panel_bias = pack_panels(weight, bias, half)
        y = torch.empty(3, n)
        kernel.linear(x.data_ptr(), panels.data_ptr(), panel_bias.data_ptr(), None, y.data_ptr(), 3, k, n, 1, int(half))
        ys.append(y)
    assert torch.equal(ys[0], ys[1]) and torch.allclose(ys[0], x @ weight.T + bias, rtol=1e-4, atol=1e-3)


@needs_kernel
def test_an_avx2_build_gives_the_native_builds_sums(tmp_path):
    """kernels.c built for AVX2 alone (16 registers: groups of 6 rows over one panel) sums as the native build does
    (on a CPU with AVX-512: groups of 8 over two panels), bit for bit: fp32, fp16 and int8 panels, 1 to 64 rows."""
    import ctypes
    import shutil
    import subprocess
    lib = tmp_path / "avx2.so"
    subprocess.run([shutil.which("cc"), *native.BASE_FLAGS, "-march=native", "-mno-avx512f", str(native.SOURCE), "-o",
                    str(lib), "-lm"], check=True, capture_output=True)
    kernels = [rows_kernel(), ctypes.CDLL(str(lib))]
    kernels[1].linear.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5
    torch.manual_seed(0)
    for k, n in WEIGHTS:
        weight, bias, scales = torch.randn(n, k).half().float(), torch.randn(n), torch.rand(n) / 64
        for kind in ("fp32", "fp16", "int8"):
            w = (weight * 16).clamp(-127, 127).to(torch.int8) if kind == "int8" else weight
            panels, panel_bias = pack_panels(w, bias, kind == "fp16")
            padded = pad_to(scales, n)  # int8 panels' scales, kept alive while the kernels read them
            s = padded.data_ptr() if kind == "int8" else None
            for rows in [*range(1, 10), 13, 64]:
                x, ys = torch.randn(rows, k), []
                for kernel in kernels:
                    y = torch.empty(rows, n)
                    kernel.linear(x.data_ptr(), panels.data_ptr(), panel_bias.data_ptr(), s, y.data_ptr(), rows, k,
                                  n, 1, int(kind == "fp16"))
                    ys.append(y)
                assert torch.equal(*ys), (k, n, kind, rows)

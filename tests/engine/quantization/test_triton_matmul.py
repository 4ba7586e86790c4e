"""The Triton dequantize-and-multiply kernel, run by Triton's interpreter on CPU tensors.

Compared with the torch reference path (dequantize, then matmul in float32) over both
schemes, three dtypes, group sizes 64 and 128, and row/column counts that leave partial
tiles. Tolerances: float32 1e-5 (summation order); float16 and bfloat16 one rounding of
the output (2^-10 and 2^-7 relative) on the largest output.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.quantization import WeightQuantization, dequantize, quantize

pytestmark = [
    pytest.mark.kernels,  # tests/gpu_run.sh selects these with -m "gpu or kernels"
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None,
        reason="Triton is not installed (pip install 'kvgov[triton]', or a GPU build of torch)",
    ),
]

_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2**-10, torch.bfloat16: 2**-7}


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch):
    from engine.quantization.triton_kernel import dequant_matmul_kernel

    # The kernel is decorated at first use, so the interpreter is chosen here and the
    # interpreted kernel is dropped afterwards (a GPU run later compiles its own).
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dequant_matmul_kernel.cache_clear()
    yield
    dequant_matmul_kernel.cache_clear()


@pytest.mark.parametrize("scheme", list(WeightQuantization))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("rows", "out", "group"), [(5, 80, 128), (17, 64, 64)])
def test_kernel_matches_the_torch_reference(interpreted, scheme, dtype, rows, out, group) -> None:
    from engine.quantization.triton_matmul import dequant_matmul

    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out, 256, generator=generator)
    x = torch.randn(rows, 256, generator=generator).to(dtype)
    q = quantize(weight, scheme, group_size=group, scale_dtype=dtype)
    w = dequantize(q.qweight, q.scales, scheme, group_size=group, dtype=torch.float32)
    want = x.float() @ w.T
    got = dequant_matmul(x, q.qweight, q.scales, scheme, group)
    assert got.dtype == dtype and got.shape == (rows, out)
    error = (got.float() - want).abs().max() / want.abs().max()
    assert error <= _TOLERANCE[dtype], f"relative error {error:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", list(WeightQuantization))
def test_a_quantized_layer_on_a_gpu_runs_the_kernel(scheme, monkeypatch) -> None:
    from engine.quantization import QuantizedLinear, triton_matmul
    from engine.quantization.triton_probe import choose_matmul_kernel

    layer = QuantizedLinear(4096, 1024, bias=False, scheme=scheme, dtype=torch.bfloat16)
    layer = layer.to("cuda")
    generator = torch.Generator().manual_seed(0)
    layer.rows().copy_(torch.randn(1024, 4096, generator=generator) * 0.02)
    assert choose_matmul_kernel(layer, device=layer.qweight.device)  # the startup probe

    calls = []
    launch = triton_matmul.dequant_matmul
    monkeypatch.setattr(
        triton_matmul, "dequant_matmul", lambda *a, **k: calls.append(1) or launch(*a, **k)
    )
    x = torch.randn(8, 4096, generator=generator).to("cuda", torch.bfloat16)
    want = x.float() @ layer.dequantized_weight(torch.float32).T
    got = layer(x)
    assert calls == [1]  # the Triton kernel, not the torch reference
    error = (got.float() - want).abs().max() / want.abs().max()
    assert error <= _TOLERANCE[torch.bfloat16], f"relative error {error:.2e}"


@pytest.mark.gpu
def test_a_prefill_past_the_kernel_s_rows_dequantizes_once_and_uses_the_library(
    monkeypatch,
) -> None:
    from engine.quantization import QuantizedLinear, triton_matmul
    from engine.quantization.linear import TRITON_MAX_ROWS

    scheme = WeightQuantization.INT4
    layer = QuantizedLinear(4096, 1024, bias=False, scheme=scheme, dtype=torch.bfloat16)
    layer = layer.to("cuda")
    generator = torch.Generator().manual_seed(0)
    layer.rows().copy_(torch.randn(1024, 4096, generator=generator) * 0.02)
    layer.use_triton = True
    calls = []
    launch = triton_matmul.dequant_matmul
    monkeypatch.setattr(
        triton_matmul, "dequant_matmul", lambda *a, **k: calls.append(1) or launch(*a, **k)
    )
    for rows, kernel_calls in ((TRITON_MAX_ROWS, [1]), (TRITON_MAX_ROWS + 1, [1])):
        x = torch.randn(rows, 4096, generator=generator).to("cuda", torch.bfloat16)
        want = x.float() @ layer.dequantized_weight(torch.float32).T
        got = layer(x)
        assert calls == kernel_calls  # the kernel up to TRITON_MAX_ROWS rows, not past it
        error = (got.float() - want).abs().max() / want.abs().max()
        assert error <= _TOLERANCE[torch.bfloat16], f"{rows} rows: relative error {error:.2e}"


@pytest.mark.parametrize(
    "target",
    [("cuda", 90, 32), ("hip", "gfx1201", 32), ("hip", "gfx942", 64)],
    ids=["cuda-sm90", "rocm-rdna4", "rocm-cdna3"],
)
@pytest.mark.parametrize("scheme", list(WeightQuantization))
def test_kernel_compiles_for_cuda_and_rocm(target, scheme, monkeypatch, tmp_path) -> None:
    """Ahead-of-time compilation to each target's machine code, without a GPU: what the
    interpreter cannot check (Triton's compiler accepts the kernel and lowers it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.quantization.triton_kernel import dequant_matmul_kernel

    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # compiled now, not found cached
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    dequant_matmul_kernel.cache_clear()
    codes = "*u8" if scheme is WeightQuantization.INT4 else "*i8"
    signature = {
        "x_ptr": "*bf16",
        "q_ptr": codes,
        "s_ptr": "*bf16",
        "y_ptr": "*bf16",
        **dict.fromkeys(("M", "N", "K", "stride_xm", "stride_qn", "stride_sn", "stride_ym"), "i32"),
        **dict.fromkeys(
            ("GROUP", "INT4", "BLOCK_M", "BLOCK_N", "BLOCK_K", "DOT_FP32"), "constexpr"
        ),
    }
    constants = {"GROUP": 128, "INT4": scheme is WeightQuantization.INT4, "BLOCK_M": 16}
    constants |= {"BLOCK_N": 64, "BLOCK_K": 64, "DOT_FP32": False}
    try:
        source = ASTSource(fn=dequant_matmul_kernel(), signature=signature, constexprs=constants)
        compiled = triton.compile(source, target=GPUTarget(*target))
    finally:
        dequant_matmul_kernel.cache_clear()
    binary = "cubin" if target[0] == "cuda" else "hsaco"
    assert compiled.asm[binary]

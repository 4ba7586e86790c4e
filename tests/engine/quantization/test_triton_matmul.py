"""The Triton dequantize-and-multiply kernel, run by Triton's interpreter on CPU tensors.

Compared with the torch reference path (dequantize, then matmul in float32) over both
schemes, three dtypes, group sizes 64 and 128, and row/column counts that leave partial
tiles; unsplit (a CPU's default) and with K split into ranges (a target of programs
passed in, as a GPU's multiprocessors would set it). Tolerances: float32 1e-5
(summation order); float16 and bfloat16 one rounding of the output (2^-10 and 2^-7
relative) on the largest output.
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
def test_kernel_matches_the_torch_reference(
    interpreted, matmul_grids, scheme, dtype, rows, out, group
) -> None:
    from engine.quantization.triton_matmul import dequant_matmul

    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out, 256, generator=generator)
    x = torch.randn(rows, 256, generator=generator).to(dtype)
    q = quantize(weight, scheme, group_size=group, scale_dtype=dtype)
    w = dequantize(q.qweight, q.scales, scheme, group_size=group, dtype=torch.float32)
    want = x.float() @ w.T
    got = dequant_matmul(x, q.qweight, q.scales, scheme, group)
    assert [grid[2] for grid in matmul_grids] == [1]  # a CPU never splits K
    assert got.dtype == dtype and got.shape == (rows, out)
    error = (got.float() - want).abs().max() / want.abs().max()
    assert error <= _TOLERANCE[dtype], f"relative error {error:.2e}"


@pytest.mark.parametrize("scheme", list(WeightQuantization))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_split_k_matches_the_torch_reference(interpreted, matmul_grids, scheme, dtype, rows):
    """K of 5 groups in 3 ranges (2 + 2 + 1 groups: not a multiple of the split), for 2
    output tiles and a target of 6 programs."""
    from engine.quantization.triton_matmul import dequant_matmul

    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(80, 320, generator=generator)
    x = torch.randn(rows, 320, generator=generator).to(dtype)
    q = quantize(weight, scheme, group_size=64, scale_dtype=dtype)
    w = dequantize(q.qweight, q.scales, scheme, group_size=64, dtype=torch.float32)
    want = x.float() @ w.T
    got = dequant_matmul(x, q.qweight, q.scales, scheme, 64, target_programs=6)
    assert matmul_grids == [(1, 2, 3)]  # one tile of rows, two of columns, three ranges
    assert got.dtype == dtype and got.shape == (rows, 80)
    error = (got.float() - want).abs().max() / want.abs().max()
    assert error <= _TOLERANCE[dtype], f"relative error {error:.2e}"


def test_tiles_that_meet_the_target_run_unsplit(interpreted, matmul_grids) -> None:
    from engine.quantization.triton_matmul import dequant_matmul

    scheme = WeightQuantization.INT4
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(80, 320, generator=generator)
    q = quantize(weight, scheme, group_size=64, scale_dtype=torch.float32)
    x = torch.randn(17, 320, generator=generator)  # 2 x 2 tiles
    unsplit = dequant_matmul(x, q.qweight, q.scales, scheme, 64, target_programs=1)
    at_target = dequant_matmul(x, q.qweight, q.scales, scheme, 64, target_programs=4)
    assert matmul_grids == [(2, 2, 1), (2, 2, 1)]
    assert torch.equal(at_target, unsplit)


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
@pytest.mark.parametrize("scheme", list(WeightQuantization))
def test_a_decode_on_a_gpu_splits_k(scheme, matmul_grids) -> None:
    """8 rows x 4,096 -> 4,096, an 8B model's o_proj at a decode of 8: one tile of rows,
    64 of columns, under the 2 programs per multiprocessor of any card with more than 32
    (an H100 has 132), so K is split."""
    from engine.quantization import QuantizedLinear
    from engine.quantization.triton_matmul import split_k
    from engine.quantization.triton_probe import choose_matmul_kernel, triton_matmul_runs_on

    triton_matmul_runs_on.cache_clear()  # probed here, not answered from an earlier test
    device = torch.device("cuda")
    multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
    if 2 * multiprocessors <= 64:
        pytest.skip(f"{multiprocessors} multiprocessors: 64 programs fill this card unsplit")
    layer = QuantizedLinear(4096, 4096, bias=False, scheme=scheme, dtype=torch.bfloat16)
    layer = layer.to(device)
    generator = torch.Generator().manual_seed(0)
    layer.rows().copy_(torch.randn(4096, 4096, generator=generator) * 0.02)
    assert choose_matmul_kernel(layer, device=device)  # the startup probe, split and not
    assert {grid[2] for grid in matmul_grids} == {1, 4096 // layer.group_size}
    matmul_grids.clear()

    x = torch.randn(8, 4096, generator=generator).to(device, torch.bfloat16)
    want = x.float() @ layer.dequantized_weight(torch.float32).T
    got = layer(x)
    splits = split_k(
        num_programs=64, k_groups=4096 // layer.group_size, target_programs=2 * multiprocessors
    )
    assert splits > 1 and matmul_grids == [(1, 64, splits)]
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
@pytest.mark.parametrize("out", ["*bf16", "*fp32"], ids=["unsplit", "split"])
def test_kernel_compiles_for_cuda_and_rocm(target, scheme, out, monkeypatch, tmp_path) -> None:
    """Ahead-of-time compilation to each target's machine code, without a GPU: what the
    interpreter cannot check (Triton's compiler accepts the kernel and lowers it).
    Unsplit, it writes the model's dtype; split, float32 partial sums."""
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
        "y_ptr": out,
        **dict.fromkeys(
            ("M", "N", "K", "k_per_split", "stride_xm", "stride_qn", "stride_sn", "stride_ym"),
            "i32",
        ),
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

"""The Triton kernels compile for NVIDIA and AMD GPUs, on this CPU, within their limits.

Triton compiles to a GPU binary without a GPU (cubin for sm80/sm90 with its bundled
ptxas, hsaco for gfx942/gfx1201 with its bundled LLVM), so what the interpreter cannot
see is checked here: the kernels lower for both vendors with the launch's exact
constexprs and options, a block's shared memory fits the card, and no register spills
to scratch (read from the AMD assembly's metadata and from ``cuobjdump -res-usage``).
A compile takes 2-12 s here; triton caches it (``~/.triton/cache``) for the next run.
The default run compiles decode and prefill at head_dim 128 for sm90 and gfx1201 (the
RX 9070 XT); ``slow`` adds head_dim 256, sm80, gfx942 and the merge kernel.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

triton = pytest.importorskip(
    "triton", reason="triton is not installed: pip install 'kvgov[triton]'"
)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine.attention.triton_attention import KernelShape, launch_options  # noqa: E402
from tests.engine.triton_interpreter import Where, kernel_device  # noqa: E402

if kernel_device() is Where.HERE:  # kernels interpreted in this process: nothing to compile
    pytest.skip("TRITON_INTERPRET=1: the kernels are interpreted here", allow_module_level=True)

from engine.attention import triton_kernels  # noqa: E402

KIB = 1 << 10
# (target, shared memory a block may use)
TARGETS = {
    "sm90": (GPUTarget("cuda", 90, 32), 227 * KIB),
    "sm80": (GPUTarget("cuda", 80, 32), 163 * KIB),
    "gfx1201": (GPUTarget("hip", "gfx1201", 32), 64 * KIB),  # RDNA4, wave32
    "gfx942": (GPUTarget("hip", "gfx942", 64), 64 * KIB),  # CDNA3, wave64
}
COMMON = {
    "q_ptr": "*bf16",
    "k_cache_ptr": "*bf16",
    "v_cache_ptr": "*bf16",
    "block_tables_ptr": "*i32",
    "out_ptr": "*bf16",
    "scale_log2": "fp32",
    **{
        name: "i32"
        for name in (
            "stride_q_tok",
            "stride_q_head",
            "stride_c_block",
            "stride_c_tok",
            "stride_c_head",
            "stride_bt_seq",
            "stride_o_tok",
            "stride_o_head",
        )
    },
}
DECODE = {
    **COMMON,
    "seq_lens_ptr": "*i32",
    "rows_ptr": "*i32",
    "seqs_ptr": "*i32",
    "part_out_ptr": "*fp32",
    "part_lse_ptr": "*fp32",
    "partition_tokens": "i32",
}
PREFILL = {**COMMON, "tiles_ptr": "*i32"}
MERGE = {
    "part_out_ptr": "*fp32",
    "part_lse_ptr": "*fp32",
    "rows_ptr": "*i32",
    "out_ptr": "*bf16",
    "num_splits": "i32",
    "stride_o_tok": "i32",
    "stride_o_head": "i32",
}


def _compile(kernel_name: str, target_name: str, head_dim: int):
    target, _ = TARGETS[target_name]
    # A 9B model's heads (32 over 8: GQA 4) in 16-token blocks, as TritonAttention launches.
    shape = KernelShape(num_heads=32, kv_heads=8, head_dim=head_dim, block_size=16, upcast=False)
    constexprs = shape.constexprs()
    fn, types = {
        "decode": (triton_kernels.decode_partition, DECODE),
        "prefill": (triton_kernels.prefill, PREFILL),
        "merge": (triton_kernels.decode_merge, MERGE),
    }[kernel_name]
    if kernel_name == "decode":
        constexprs |= {"GROUP": 4, "GROUP_PAD": 16, "TILE_N": shape.tile_n, "NUM_SPLITS": 16}
    elif kernel_name == "prefill":
        constexprs |= {"GROUP": 4, "BLOCK_M": shape.block_m, "TILE_N": shape.tile_n}
    else:
        constexprs = {k: constexprs[k] for k in ("HEAD_DIM", "DIM_PAD")} | {"NUM_SPLITS": 16}
    signature = {name: "constexpr" if name in constexprs else types[name] for name in fn.arg_names}
    options = launch_options(hip=target.backend == "hip")
    return triton.compile(ASTSource(fn, signature, constexprs), target=target, options=options)


def _spilled_registers(compiled, backend: str, workdir: Path) -> int:
    if backend == "hip":
        spills = re.findall(r"\.vgpr_spill_count:\s*(\d+)", compiled.asm["amdgcn"])
        return sum(int(n) for n in spills)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        pytest.skip(f"{tool} is not in this triton build: cannot read register use")
    cubin = workdir / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run(
        [str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    return sum(int(n) for n in re.findall(r"LOCAL:(\d+)", usage))


CASES = [
    pytest.param("decode", "sm90", 128),
    pytest.param("prefill", "sm90", 128),
    pytest.param("decode", "gfx1201", 128),
    pytest.param("prefill", "gfx1201", 128),
    *(
        pytest.param(kernel, target, head_dim, marks=pytest.mark.slow)
        for kernel in ("decode", "prefill")
        for target, head_dim in (("sm90", 256), ("gfx1201", 256), ("sm80", 128), ("gfx942", 128))
    ),
    pytest.param("merge", "sm90", 128, marks=pytest.mark.slow),
    pytest.param("merge", "gfx1201", 128, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("kernel", "target", "head_dim"), CASES)
def test_the_kernels_compile_within_the_card(
    kernel: str, target: str, head_dim: int, tmp_path: Path
) -> None:
    compiled = _compile(kernel, target, head_dim)
    backend = TARGETS[target][0].backend
    assert compiled.asm["hsaco" if backend == "hip" else "cubin"]  # a loadable binary
    assert compiled.metadata.shared <= TARGETS[target][1]
    assert _spilled_registers(compiled, backend, tmp_path) == 0

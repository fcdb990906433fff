"""Triton kernels compile for an H100 / H200 (sm_90) on a machine without a GPU: Triton's
own compiler and the ptxas its wheel carries turn them into a cubin, so a kernel change
that only the GPU's compile would reject fails here, in CI, rather than on the first lease.
(What the kernels compute is checked under Triton's interpreter: tests/attention,
tests/ops/test_fused.py.) The variants are the ones a Qwen3 / Gemma 3 decode step runs,
the FP8 row quantizer of a W8A8 prefill's experts, and the swapped W8A8 expert GEMMs of
FP8 decodes, which must reach Hopper's FP8 tensor cores (wgmma on e4m3) with no widening."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from cadence.attention.triton_write_kv import write_kv_kernel  # noqa: E402
from cadence.ops.fp8_rows import _quant_rows_kernel, launch_config  # noqa: E402
from cadence.ops.gemv import _gemv_kernel  # noqa: E402
from cadence.ops.moe_w8a8 import _w8a8_gemm_kernel  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)


def compile_for_hopper(
    fn, constexprs: dict, floats=(), int64_ptrs=(), num_warps: int = 4, ptr_types=None
):
    """fn's cubin for sm_90: pointers bf16 (int64 for `int64_ptrs`, or as `ptr_types` names
    them), `floats` fp32 and every other argument i32; `constexprs` by name."""
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in (ptr_types or {}):
            signature[name] = ptr_types[name]
        elif name.endswith("_ptr"):
            signature[name] = "*i64" if name in int64_ptrs else "*bf16"
        else:
            signature[name] = "fp32" if name in floats else "i32"
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    try:
        return triton.compile(source, target=HOPPER, options={"num_warps": num_warps})
    except RuntimeError as e:
        if "ptxas" in str(e) and "not found" in str(e).lower():
            pytest.skip(f"this triton has no ptxas: {e}")
        raise


KERNEL_A = dict(BLOCK_SIZE=16, BLOCK_H=4, BLOCK_HQ=8, SCALED=False, EXACT_ROUND=False, PDL=True)


@pytest.mark.parametrize(
    "variant",
    [
        dict(HALF=64, HALF_PAD=64, ROTARY=True, NORM=True, GEMMA_NORM=False),  # Qwen3
        dict(HALF=48, HALF_PAD=64, ROTARY=False, NORM=True, GEMMA_NORM=True),  # Gemma's, 96
        dict(HALF=64, HALF_PAD=64, ROTARY=True, NORM=False, GEMMA_NORM=False),  # Llama
    ],
    ids=["qwen3", "gemma-d96-no-rotary", "llama"],
)
def test_kernel_a_compiles_for_hopper(variant):
    floats = ("k_inv_scale", "v_inv_scale", "norm_eps")
    compiled = compile_for_hopper(
        write_kv_kernel, {**KERNEL_A, **variant}, floats, int64_ptrs=("slot_ptr",)
    )
    assert compiled.asm["cubin"]


@pytest.mark.parametrize("prologue, keep_normed", [(1, True), (1, False), (2, False)])
def test_the_batch1_gemv_compiles_for_hopper(prologue, keep_normed):
    constexprs = dict(
        PROLOGUE=prologue,
        HAS_RESIDUAL=prologue == 1,
        HAS_BIAS=False,
        KEEP_NORMED=keep_normed,
        BLOCK_N=16,
        BLOCK_K=1024,
        PDL=True,
    )
    compiled = compile_for_hopper(_gemv_kernel, constexprs, ("eps",), num_warps=8)
    assert compiled.asm["cubin"]


@pytest.mark.parametrize(
    "gated, k", [(False, 2048), (True, 768), (True, 14336)], ids=["rows", "silu-mul", "wide"]
)
def test_the_fp8_row_quantizer_compiles_for_hopper(gated, k):
    types = {"q_ptr": "*fp8e4nv", "s_ptr": "*fp32"}
    config = launch_config(k, gated)
    warps = config.pop("num_warps")
    constexprs = dict(GATED=gated, **config)
    compiled = compile_for_hopper(_quant_rows_kernel, constexprs, ptr_types=types, num_warps=warps)
    assert compiled.asm["cubin"]


@pytest.mark.parametrize(
    "gated, block_m, block_n", [(True, 16, 64), (False, 16, 64), (True, 64, 128)]
)
def test_the_w8a8_expert_gemms_use_fp8_tensor_cores(gated, block_m, block_n):
    types = {
        "a_ptr": "*fp8e4nv",
        "w_ptr": "*fp8e4nv",
        "a_scale_ptr": "*fp32",
        "w_scale_ptr": "*fp32",
        "sorted_pairs_ptr": "*i64",
        "block_expert_ptr": "*i64",
    }
    constexprs = dict(
        GATED=gated, ROUTE_SCALE=not gated, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=128,
        PDL=True,
    )  # fmt: skip
    compiled = compile_for_hopper(_w8a8_gemm_kernel, constexprs, ptr_types=types)
    ptx = compiled.asm["ptx"]
    assert re.search(rf"wgmma\.mma_async\S*\.m64n{block_m}k32\.f32\.e4m3\.e4m3", ptx)
    assert not re.search(r"cvt\.\S*e4m3", ptx)  # (no e4m3 widened on the way)

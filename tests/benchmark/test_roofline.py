"""The roofline of a compiled program's kernels (bert_jax/benchmark/roofline.py): bytes, FLOPs and rows
read from HLO text, on a hand-written GPU program and on what XLA compiles here."""

import json

import jax
import jax.numpy as jnp
import pytest

from bert_jax.benchmark import roofline
from bert_jax.model import flash

# A GPU program as XLA prints it, cut down: a GEMM fusion (bf16 [64,32] x [32,16]), an elementwise
# fusion under the dropout scope, a transpose, cuDNN's fused attention (q, k [2, 8, 4, 16]) and the
# instructions that move nothing (parameters, tuples, get-tuple-element, bitcast). Written wrapped;
# XLA prints an instruction on one line.
GPU_HLO_WRAPPED = """HloModule jit_step

%gemm_fusion_dot.1_computation (parameter_0: bf16[64,32], parameter_1: bf16[32,16]) -> bf16[64,16] {
  %parameter_0 = bf16[64,32]{1,0} parameter(0)
  %parameter_1 = bf16[32,16]{1,0} parameter(1)
  ROOT %dot.0 = bf16[64,16]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_select (param_0: bf16[64,16], param_1: pred[64,16]) -> bf16[64,16] {
  %param_0 = bf16[64,16]{1,0} parameter(0)
  %param_1 = pred[64,16]{1,0} parameter(1)
  %zero = bf16[64,16]{1,0} broadcast(bf16[] constant(0)), dimensions={}
  ROOT %select.1 = bf16[64,16]{1,0} select(%param_1, %param_0, %zero)
}

ENTRY %main (a: bf16[64,32], b: bf16[32,16], m: pred[64,16], q: bf16[2,8,4,16]) -> (bf16[64,16], bf16[16,64]) {
  %a = bf16[64,32]{1,0} parameter(0)
  %b = bf16[32,16]{1,0} parameter(1)
  %m = pred[64,16]{1,0} parameter(2)
  %q = bf16[2,8,4,16]{3,2,1,0} parameter(3)
  %gemm_fusion_dot.1 = bf16[64,16]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_fusion_dot.1_computation,
    metadata={op_name="jit(step)/jvp(ffn)/dot_general"}
  %loop_select_fusion = bf16[64,16]{1,0} fusion(%gemm_fusion_dot.1, %m), kind=kLoop, calls=%fused_select,
    metadata={op_name="jit(step)/jvp(dropout)/select_n"}
  %transpose.2 = bf16[16,64]{1,0} transpose(%loop_select_fusion), dimensions={1,0}, metadata={op_name="jit(s)/t"}
  %fmha = (bf16[2,4,8,16]{3,1,2,0}, f32[2,4,8]{2,1,0}, u8[0]{0}) custom-call(%q, %q, %q),
    custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(step)/jvp(attention)/dot_product_attention_fwd"}
  %gte = bf16[2,4,8,16]{3,1,2,0} get-tuple-element(%fmha), index=0
  %bc = bf16[16,64]{1,0} bitcast(%transpose.2)
  ROOT %tuple = (bf16[64,16]{1,0}, bf16[16,64]{1,0}) tuple(%loop_select_fusion, %bc)
}
"""
GPU_HLO = GPU_HLO_WRAPPED.replace(",\n    ", ", ")


def test_each_kernel_moves_its_operands_and_results_and_does_its_products():
    ks = {k.name: k for k in roofline.kernels(GPU_HLO)}
    assert set(ks) == {"gemm_fusion_dot.1", "loop_select_fusion", "transpose.2", "fmha"}
    gemm, select, transpose, fmha = (ks[n] for n in ("gemm_fusion_dot.1", "loop_select_fusion", "transpose.2", "fmha"))
    assert (gemm.bytes, gemm.flops) == (2 * (64 * 32 + 32 * 16 + 64 * 16), 2 * 64 * 16 * 32)
    assert gemm.row == "matrix products"
    assert (select.bytes, select.flops, select.row) == (2 * 64 * 16 * 2 + 64 * 16, 0, "dropout")
    assert (transpose.bytes, transpose.row) == (2 * 2 * 64 * 16, "copies/transposes")
    q = 2 * 8 * 4 * 16 * 2  # bytes of q (read three times: q, k, v)
    assert fmha.bytes == 3 * q + q + 2 * 4 * 8 * 4 and fmha.row == "attention"
    assert fmha.flops == roofline.FMHA_FLOPS["forward"] * 2 * 4 * 8 * 8 * 16  # B·N·T·S·H
    assert gemm.what == "jvp(ffn)/dot_general"


FLASH_HLO_WRAPPED = """HloModule jit_step

ENTRY %main (s: u32[2], r: s32[2], h: s32[4], q: bf16[2,256,4,16], i: s32[2,256]) -> bf16[2,256,4,16] {
  %s = u32[2]{0} parameter(0)
  %r = s32[2]{0} parameter(1)
  %h = s32[4]{0} parameter(2)
  %q = bf16[2,256,4,16]{3,2,1,0} parameter(3)
  %i = s32[2,256]{1,0} parameter(4)
  %fwd = bf16[2,256,4,16]{3,2,1,0} custom-call(%s, %r, %h, %q, %q, %q, %i),
    custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/jvp(attention)/flash_forward/pallas_call"}
  %local = bf16[2,256,4,16]{3,2,1,0} custom-call(%s, %r, %h, %fwd, %q, %q, %i),
    custom_call_target="__gpu$xla.gpu.triton",
    metadata={op_name="jit(step)/jvp(attention)/flash_forward_window32/pallas_call"}
  %wide = bf16[2,256,4,16]{3,2,1,0} custom-call(%s, %r, %h, %local, %q, %q, %i),
    custom_call_target="__gpu$xla.gpu.triton",
    metadata={op_name="jit(step)/jvp(attention)/flash_forward_window32_block128/pallas_call"}
  ROOT %bwd = bf16[2,256,4,16]{3,2,1,0} custom-call(%wide, %q, %q, %i),
    custom_call_target="__gpu$xla.gpu.triton",
    metadata={op_name="jit(step)/transpose(jvp(attention))/flash_backward/pallas_call"}
}
"""
FLASH_HLO = FLASH_HLO_WRAPPED.replace(",\n    ", ", ")


def test_the_flash_kernels_products_are_the_blocks_their_window_visits():
    """The model's Pallas flash attention (a Triton custom call named by its pallas_call): 2 products
    forward, 7 backward, for each (query block, key block) pair its window reaches."""
    ks = {k.name: k for k in roofline.kernels(FLASH_HLO)}
    pair = 2 * 4 * 16 * 64 * 64  # B·N·H·block²
    assert flash.block_pairs(256, 0) == 16 and flash.block_pairs(256, 32) == 10  # 4 + 3 + 3 + 2 of 16 blocks
    assert (ks["fwd"].flops, ks["local"].flops, ks["bwd"].flops) == (4 * pair * 16, 4 * pair * 10, 14 * pair * 16)
    assert flash.block_pairs(256, 32, 128) == 4 and ks["wide"].flops == 4 * (pair * 4) * 4  # blocks of 128: 4 pairs
    assert {k.row for k in ks.values()} == {"attention"}


def cublas_call(name: str, result: str, operands: str, contracting: str, batch: list[str]) -> str:
    """A GEMM XLA hands to cuBLAS, as XLA prints it: its result with a workspace, its dimensions in
    the backend config (JSON without spaces)."""
    numbers = {"lhs_contracting_dimensions": [contracting], "lhs_batch_dimensions": batch}
    config = json.dumps({"gemm_backend_config": {"dot_dimension_numbers": numbers}}, separators=(",", ":"))
    return (f"  %{name} = ({result}, s8[4194304]{{0}}) custom-call({operands}), "
            f'custom_call_target="__cublas$lt$matmul", backend_config={config}\n')


CUBLAS_HLO = ("HloModule jit_step\n\nENTRY %main (x: bf16[8,128,64], a: bf16[1024,768], w: bf16[768,3072], "
              "b: bf16[3072]) -> bf16[1024,3072] {\n  %x = bf16[8,128,64]{2,1,0} parameter(0)\n"
              "  %a = bf16[1024,768]{1,0} parameter(1)\n  %w = bf16[768,3072]{1,0} parameter(2)\n"
              "  %b = bf16[3072]{0} parameter(3)\n"
              + cublas_call("batched", "bf16[8,128,128]{2,1,0}", "%x, %x", "2", ["0"])
              + cublas_call("biased", "bf16[1024,3072]{1,0}", "%a, %w, %b", "1", [])  # a bias epilogue
              + "  %norm = (bf16[1024,768,1,1]{3,2,1,0}, f32[1024,1,1,1]{3,2,1,0}, u8[4096]{0}) custom-call(%a), "
              'custom_call_target="__cudnn$norm"\n'
              + "  ROOT %out = bf16[1024,3072]{1,0} get-tuple-element(%biased), index=0\n}\n")


def test_cublas_calls_are_products_and_move_no_workspace():
    """A GEMM XLA hands to cuBLAS (a custom call, no dot inside): 2·M·N·K from its result and its
    contracting dimensions, its bytes without the workspace it is given; cuDNN's norm likewise."""
    ks = {k.name: k for k in roofline.kernels(CUBLAS_HLO)}
    assert ks["batched"].flops == 2 * 8 * 128 * 128 * 64 and ks["biased"].flops == 2 * 1024 * 3072 * 768
    assert ks["batched"].bytes == 2 * (8 * 128 * 128 + 2 * 8 * 128 * 64)
    assert ks["biased"].bytes == 2 * (1024 * 3072 + 1024 * 768 + 768 * 3072 + 3072)
    assert {ks[n].row for n in ("batched", "biased")} == {"matrix products"}
    # cuDNN's layer norm (--xla_gpu_enable_cudnn_layer_norm): no products, not attention, no workspace moved
    assert (ks["norm"].row, ks["norm"].flops, ks["norm"].bytes) == ("other fusions", 0, 2 * 2 * 1024 * 768 + 4 * 1024)


def test_the_table_is_the_sum_of_each_kernels_least_time():
    ks = roofline.kernels(GPU_HLO)
    peak, bandwidth = 1e6, 1e9  # a device on which the products are compute-bound, the rest memory-bound
    t = roofline.table(ks, peak, bandwidth)
    want = sum(max(k.bytes / bandwidth, k.flops / peak) for k in ks) * 1e3
    assert t["ms"] == pytest.approx(want) and t["bytes"] == sum(k.bytes for k in ks)
    rows = {r["row"]: r for r in t["rows"]}
    assert rows["matrix products"]["ms"] == pytest.approx(2 * 64 * 16 * 32 / peak * 1e3)  # compute-bound
    assert rows["dropout"]["top"] == [("jvp(dropout)/select_n", pytest.approx(rows["dropout"]["ms"]))]
    assert "| the step |" in roofline.markdown(t)


def test_the_kernels_furthest_over_their_least_time_come_first():
    """Measured times a step (a profile's {instruction: (ms, runs)}) against each kernel's least time
    times its runs: the largest excess first; a name the program lacks (a memset) is left out."""
    ks = {k.name: k for k in roofline.kernels(GPU_HLO)}
    peak, bandwidth = 1e6, 1e9
    least = {n: max(k.bytes / bandwidth, k.flops / peak) * 1e3 for n, k in ks.items()}  # ms a run
    measured = {"loop_select_fusion": (least["loop_select_fusion"] * 12 * 4, 12),  # 4x over, 12 runs
                "gemm_fusion_dot.1": (least["gemm_fusion_dot.1"], 1), "transpose.2": (least["transpose.2"] * 2, 1),
                "Memset": (1.0, 3)}
    rows = roofline.furthest(measured, list(ks.values()), peak, bandwidth, top=2)
    assert [r["name"] for r in rows] == ["loop_select_fusion", "transpose.2"]
    assert rows[0]["least_ms"] == pytest.approx(12 * least["loop_select_fusion"]) and rows[0]["row"] == "dropout"
    assert "| loop_select_fusion | jvp(dropout)/select_n | dropout | 12 |" in roofline.furthest_markdown(rows)
    assert "| 4.0x |" in roofline.furthest_markdown(rows)


def test_a_loop_is_refused_rather_than_counted_once():
    looped = GPU_HLO.replace("%transpose.2 = bf16[16,64]{1,0} transpose(%loop_select_fusion), dimensions={1,0}",
                             "%transpose.2 = bf16[16,64]{1,0} while(%loop_select_fusion), condition=%c, body=%b")
    with pytest.raises(ValueError, match="while .*unrolled layers"):
        roofline.kernels(looped)


# A [1024, 2304] product read by three fusions, as XLA leaves ModernBERT's merged q/k/v products: one
# reads its third through a bitcast and a slice, one through a dynamic-slice, one through a slice and
# also whole (a reduction over all of it).
SLICED_HLO = """HloModule jit_step

%rotary (p0: bf16[1024,2304]) -> bf16[1024,768] {
  %p0 = bf16[1024,2304]{1,0} parameter(0)
  %flat = bf16[1024,2304]{1,0} bitcast(%p0)
  %q = bf16[1024,768]{1,0} slice(%flat), slice={[0:1024], [0:768]}
  ROOT %neg = bf16[1024,768]{1,0} negate(%q)
}

%take (p0.1: bf16[1024,2304], p1.1: s32[]) -> bf16[1024,768] {
  %p0.1 = bf16[1024,2304]{1,0} parameter(0)
  %p1.1 = s32[] parameter(1)
  %zero.1 = s32[] constant(0)
  ROOT %v.1 = bf16[1024,768]{1,0} dynamic-slice(%p0.1, %zero.1, %p1.1), dynamic_slice_sizes={1024,768}
}

%mixed (p0.2: bf16[1024,2304]) -> (bf16[1024,768], bf16[1024]) {
  %p0.2 = bf16[1024,2304]{1,0} parameter(0)
  %k = bf16[1024,768]{1,0} slice(%p0.2), slice={[0:1024], [768:1536]}
  %zero.2 = bf16[] constant(0)
  %sum = bf16[1024]{0} reduce(%p0.2, %zero.2), dimensions={1}, to_apply=%add
  ROOT %t = (bf16[1024,768]{1,0}, bf16[1024]{0}) tuple(%k, %sum)
}

ENTRY %main (qkv: bf16[1024,2304], i: s32[]) -> bf16[1024,768] {
  %qkv = bf16[1024,2304]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %r = bf16[1024,768]{1,0} fusion(%qkv), kind=kLoop, calls=%rotary
  %v = bf16[1024,768]{1,0} fusion(%qkv, %i), kind=kLoop, calls=%take
  %m = (bf16[1024,768]{1,0}, bf16[1024]{0}) fusion(%qkv), kind=kInput, calls=%mixed
  ROOT %out = bf16[1024,768]{1,0} add(%r, %v)
}
"""


def test_an_operand_read_only_through_slices_moves_only_their_bytes():
    ks = {k.name: k for k in roofline.kernels(SLICED_HLO)}
    third, whole = 2 * 1024 * 768, 2 * 1024 * 2304
    assert ks["r"].bytes == third + third  # its slice (through a bitcast) and its result
    assert ks["v"].bytes == third + 4 + third  # the dynamic slice, the index (whole: 4 bytes), the result
    assert ks["m"].bytes == whole + third + 2 * 1024  # read whole by the reduction: all of it
    assert ks["out"].bytes == 3 * third  # no fusion: its operands whole


def test_a_slice_in_a_program_xla_compiled_here_moves_only_its_bytes():
    x = jax.ShapeDtypeStruct((64, 48), jnp.float32)
    text = jax.jit(lambda x: jnp.sin(x[:, 16:32]) * 2).lower(x).compile().as_text()
    assert sum(k.bytes for k in roofline.kernels(text)) == 4 * 64 * 16 * 2  # the slice read, the result written


def test_the_products_of_a_program_xla_compiled_here():
    """The FLOPs read from a real compiled program (this machine's) are 2·M·N·K per product."""
    x = jax.ShapeDtypeStruct((64, 48), jnp.float32)
    w = jax.ShapeDtypeStruct((48, 80), jnp.float32)
    v = jax.ShapeDtypeStruct((80, 8), jnp.float32)
    text = jax.jit(lambda x, w, v: jnp.tanh(x @ w) @ v).lower(x, w, v).compile().as_text()
    ks = roofline.kernels(text)
    assert sum(k.flops for k in ks) == 2 * 64 * 80 * 48 + 2 * 64 * 8 * 80
    assert sum(k.bytes for k in ks) >= 4 * (64 * 48 + 48 * 80 + 80 * 8 + 64 * 8)  # at least the inputs and output

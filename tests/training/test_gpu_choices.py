"""What a GPU runs, on the CPU: the model resolved for "gpu" (bfloat16, cuDNN attention routed to XLA
by tests/fixtures/attention_paths.py, unrolled over the stacked parameters, jax.random dropout, GELU
through erf) gives the CPU's float32 loss and gradients within bfloat16's tolerance, for BERT (the
paper's dropout: explicit attention; without attention dropout: cuDNN) and ModernBERT (cuDNN's global
layers, XLA's local ones). The same comparison with a real GPU: tests/gpu/test_gpu_numerics.py."""

import jax
import pytest

from tests.fixtures.step_numerics import (
    batch,
    initial_params,
    loss_and_grads,
    objective,
    reference,
    relative_error,
    resolved,
    worst_leaves,
)

# bfloat16 compute against float32: the loss within 1%, the gradients within 4% (‖Δg‖ / ‖g‖ over all
# parameters; measured 1.8-2.0% for BERT-mini, 0.8% for ModernBERT-mini on the CPU: docs/records.md,
# "The GPU computes what the CPU computes").
LOSS_TOLERANCE, GRAD_TOLERANCE = 1e-2, 4e-2


@pytest.mark.parametrize("family,fields,calls", [
    # ~18 s; attention dropout 0.1: the explicit path, no fused kernel (the CPU's own step tests run it)
    pytest.param("bert", {}, set(), marks=pytest.mark.slow),
    ("bert", {"attention_dropout_prob": 0.0}, {"cudnn"}),
    # ~10 s; ModernBERT's encoder on the routed cuDNN path: tests/model/test_cudnn_path.py
    pytest.param("modernbert", {}, {"cudnn", "xla"}, marks=pytest.mark.slow)])
def test_gpu_resolved_step_matches_the_cpu_float32_step(family, fields, calls, cudnn_routed_to_xla):
    gpu = resolved(family, "gpu", **fields)
    assert (gpu.dtype, gpu.attention_impl, gpu.scan_layers, gpu.stacked_params, gpu.dropout_impl, gpu.gelu_impl) == \
        ("bfloat16", "cudnn", False, True, "jax", "erf")
    ref, task, rows, cpu = reference(family, gpu, **fields), objective(family), batch(), jax.devices("cpu")[0]
    params = initial_params(ref, task)
    loss_ref, grads_ref = loss_and_grads(ref, task, params, rows, cpu)
    cudnn_routed_to_xla.clear()
    loss_gpu, grads_gpu = loss_and_grads(gpu, task, params, rows, cpu)
    assert {impl for impl, _ in cudnn_routed_to_xla} == calls
    assert abs(loss_gpu - loss_ref) <= LOSS_TOLERANCE * loss_ref, (loss_gpu, loss_ref)
    err = relative_error(grads_gpu, grads_ref)
    assert err <= GRAD_TOLERANCE, (err, worst_leaves(grads_gpu, grads_ref))


@pytest.mark.slow  # ~40 s: the step twice with both kernels in Pallas' interpreter
def test_the_gpu_kernels_step_in_bfloat16_matches_the_cpu_float32_step():
    """The CPU half of tests/gpu's step with the GPU's Pallas kernels (flash attention, the fused
    residual-dropout-LayerNorm): the model resolved for the GPU with both, in bfloat16 but with the
    kernels interpreted on the CPU, against the float32 step with the same kernels: the same dropout
    masks (drawn inside the kernels from the same keys), so only bfloat16's arithmetic differs."""
    kernels = {"attention_impl": "flash_interpret", "norm_impl": "fused_interpret"}
    gpu = resolved("bert", "gpu", **kernels)
    ref, task, rows, cpu = reference("bert", gpu, **kernels), objective("bert"), batch(), jax.devices("cpu")[0]
    params = initial_params(ref, task)
    loss_ref, grads_ref = loss_and_grads(ref, task, params, rows, cpu)
    loss_gpu, grads_gpu = loss_and_grads(gpu, task, params, rows, cpu)
    assert abs(loss_gpu - loss_ref) <= LOSS_TOLERANCE * loss_ref, (loss_gpu, loss_ref)
    err = relative_error(grads_gpu, grads_ref)
    assert err <= GRAD_TOLERANCE, (err, worst_leaves(grads_gpu, grads_ref))

"""The GPU computes what the CPU computes (run on a machine with an NVIDIA GPU:
``BERT_JAX_GPU_TESTS=1 pytest tests/gpu``; skipped elsewhere, and by ``make test``, which hides
accelerators). Their CPU halves run in CI: tests/training/test_gpu_choices.py and
tests/model/test_cudnn_path.py, with cuDNN's call routed to XLA.

* One pre-training loss and its gradients from the model resolved for the GPU (bfloat16, cuDNN
  attention, unrolled, GELU through erf), run on the GPU, against the CPU's float32 ones on the same
  batch and parameters; the same with the Pallas flash attention (interpreted on the CPU: the same
  dropout masks).
* cuDNN's attention and the Pallas flash kernel against XLA's on the GPU, through the encoder and its
  gradients: BERT on padded rows, ModernBERT on padded rows longer than its local window; scanned and
  unrolled. The flash kernel against its XLA reference with dropout (the same mask), float32 and bfloat16;
  the fused residual-dropout-LayerNorm kernel likewise, and the step with both kernels.
* The GPU's step run twice gives the same numbers.
* The GPU's grouped global norm (the gradient clip's) against ``optax.tree.norm``, in a few kernels.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import create
from tests.fixtures.attention_paths import encoder_config, rows
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


def gpus() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


pytestmark = pytest.mark.skipif(not gpus(), reason="needs an NVIDIA GPU (BERT_JAX_GPU_TESTS=1 on a GPU machine)")

# As the CPU half (tests/training/test_gpu_choices.py): bfloat16 against float32.
LOSS_TOLERANCE, GRAD_TOLERANCE = 1e-2, 4e-2
# cuDNN's bfloat16 error against float32 (‖Δ‖ / ‖x‖ over real tokens, and over the gradients) within
# BF16_FACTOR times XLA's bfloat16 error plus PATH_TOLERANCE.
BF16_FACTOR, PATH_TOLERANCE = 3.0, 2e-2
KERNEL_CALL = {"cudnn": "__cudnn$fmha", "flash": "__gpu$xla.gpu.triton"}  # custom call targets in the compiled HLO


@pytest.mark.parametrize("family,fields", [("bert", {}), ("bert", {"attention_dropout_prob": 0.0}),
                                           ("modernbert", {})], ids=["bert", "bert-no-attention-dropout",
                                                                      "modernbert"])
def test_gpu_step_matches_the_cpu_float32_step(family, fields, record_property):
    gpu_cfg = resolved(family, "gpu", **fields)
    assert (gpu_cfg.dtype, gpu_cfg.attention_impl, gpu_cfg.gelu_impl) == ("bfloat16", "cudnn", "erf")
    ref, task, data = reference(family, gpu_cfg, **fields), objective(family), batch()
    params = initial_params(ref, task)
    loss_ref, grads_ref = loss_and_grads(ref, task, params, data, jax.devices("cpu")[0])
    loss_gpu, grads_gpu = loss_and_grads(gpu_cfg, task, params, data, gpus()[0])
    err = relative_error(grads_gpu, grads_ref)
    record_property("loss", [loss_gpu, loss_ref])
    record_property("grad_relative_error", err)
    print(f"{family} {fields}: loss {loss_gpu:.5f} (GPU) vs {loss_ref:.5f} (CPU float32); gradients "
          f"{err:.4f} relative; worst {worst_leaves(grads_gpu, grads_ref)}")
    assert abs(loss_gpu - loss_ref) <= LOSS_TOLERANCE * loss_ref, (loss_gpu, loss_ref)
    assert err <= GRAD_TOLERANCE, (err, worst_leaves(grads_gpu, grads_ref))


@pytest.mark.parametrize("family,norm", [("bert", "xla"), ("modernbert", "xla"), ("bert", "fused")],
                         ids=["bert", "modernbert", "bert-fused-norm"])
def test_gpu_flash_step_matches_the_cpu_float32_step(family, norm, record_property):
    """The step with the Pallas flash attention (and the fused residual-dropout-LayerNorm kernel:
    ``norm`` "fused"), bfloat16, Triton, against the CPU's float32 step with the same kernels in
    Pallas' interpreter: the same dropout masks (drawn inside the kernels from the same keys), so only
    the arithmetic differs, within the tolerances of the cuDNN step's test."""
    gpu_cfg = resolved(family, "gpu", attention_impl="flash", norm_impl=norm)
    ref = reference(family, gpu_cfg, attention_impl="flash_interpret",
                    norm_impl="fused_interpret" if norm == "fused" else norm)
    task, data = objective(family), batch()
    params = initial_params(ref, task)
    loss_ref, grads_ref = loss_and_grads(ref, task, params, data, jax.devices("cpu")[0])
    loss_gpu, grads_gpu = loss_and_grads(gpu_cfg, task, params, data, gpus()[0])
    err = relative_error(grads_gpu, grads_ref)
    record_property("loss", [loss_gpu, loss_ref])
    print(f"{family} flash, {norm} norm: loss {loss_gpu:.5f} (GPU) vs {loss_ref:.5f} (CPU float32, interpreted); "
          f"gradients {err:.4f} relative; worst {worst_leaves(grads_gpu, grads_ref)}")
    assert abs(loss_gpu - loss_ref) <= LOSS_TOLERANCE * loss_ref, (loss_gpu, loss_ref)
    assert err <= GRAD_TOLERANCE, (err, worst_leaves(grads_gpu, grads_ref))


def test_the_gpu_step_gives_the_same_numbers_twice():
    """Same config + seed, same numbers, on the GPU too: the step resolved for it, run twice on the
    same batch, parameters and dropout keys, agrees bit for bit. (XLA's scatter-adds on a GPU are
    atomic adds, whose order can change a float32 sum: the embedding tables' gradients.)"""
    gpu_cfg, task, data = resolved("bert", "gpu"), objective("bert"), batch()
    params = initial_params(reference("bert", gpu_cfg), task)
    (loss_a, grads_a), (loss_b, grads_b) = (loss_and_grads(gpu_cfg, task, params, data, gpus()[0]) for _ in range(2))
    flat_a, flat_b = (jax.tree_util.tree_flatten_with_path(g)[0] for g in (grads_a, grads_b))
    differ = [jax.tree_util.keystr(k) for (k, a), (_, b) in zip(flat_a, flat_b, strict=True)
              if not np.array_equal(a, b)]
    print(f"bert twice: loss {loss_a!r} and {loss_b!r}; {len(differ)} of {len(flat_a)} gradients differ {differ[:3]}")
    assert loss_a == loss_b and not differ, differ


def relative(a, b, where) -> float:
    a, b = np.where(where, np.asarray(a, np.float64), 0), np.where(where, np.asarray(b, np.float64), 0)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("impl,family,scan", [(impl, family, scan) for impl in ("cudnn", "flash")
                                               for family in ("bert", "modernbert")
                                               for scan in ((True, False) if impl == "cudnn" else (False,))])
def test_fused_attention_matches_xla_on_the_gpu(impl, family, scan):
    """cuDNN's (or the Pallas flash kernel's) and XLA's attention in bfloat16 are each compared with
    XLA's in float32: the kernel's error may not exceed a few times XLA's own bfloat16 error (both
    round the probabilities to bfloat16, in other orders), while a lost window or key length is off by
    far more (the last assertion)."""
    cfg = encoder_config(family, scan)
    ids, mask, seg = rows()
    if impl == "flash":  # the kernel takes lengths in multiples of 64: more padding at the end
        ids, mask, seg = (np.pad(x, ((0, 0), (0, 64 - x.shape[1]))) for x in (ids, mask, seg))
    ids, mask, seg = jax.device_put((ids, mask, seg), gpus()[0])
    weights = jax.random.normal(jax.random.key(0), (*ids.shape, cfg.hidden_size))  # [batch, length, hidden]
    real = np.asarray(mask)[..., None] > 0

    def outputs_and_grads(cfg):
        graphdef, params = nnx.split(create(BertEncoder, cfg), nnx.Param)

        def f(params):
            out = nnx.merge(graphdef, params)(ids, mask, seg).sequence_output  # [batch, length, hidden]
            return jnp.sum(out.astype(jnp.float32) * weights * mask[..., None]), out

        compiled = jax.jit(lambda p: jax.value_and_grad(f, has_aux=True)(p)).lower(params).compile()
        (_, out), grads = compiled(params)
        return np.asarray(out, np.float32), jax.tree.map(np.asarray, nnx.to_pure_dict(grads)), compiled.as_text()

    exact, exact_grads, _ = outputs_and_grads(dataclasses.replace(cfg, dtype="float32", attention_impl="xla"))
    xla, xla_grads, _ = outputs_and_grads(dataclasses.replace(cfg, attention_impl="xla"))
    fused, fused_grads, hlo = outputs_and_grads(dataclasses.replace(cfg, attention_impl=impl))
    assert KERNEL_CALL[impl] in hlo, f"the {impl} path did not reach its kernel"
    errors = {impl: (relative(fused, exact, real), relative_error(fused_grads, exact_grads)),
              "xla": (relative(xla, exact, real), relative_error(xla_grads, exact_grads))}
    print(f"{family} scan={scan}: against float32, outputs and gradients: {impl} {errors[impl][0]:.4f} "
          f"{errors[impl][1]:.4f}, XLA bfloat16 {errors['xla'][0]:.4f} {errors['xla'][1]:.4f} relative")
    for got, bound in zip(errors[impl], errors["xla"], strict=True):
        assert got <= BF16_FACTOR * bound + PATH_TOLERANCE, errors
    if family == "modernbert":  # the windows matter: every layer global would be far off
        model = create(BertEncoder, dataclasses.replace(cfg, local_window=0, dtype="float32", attention_impl="xla"))
        other = np.asarray(nnx.jit(lambda m: m(ids, mask, seg).sequence_output)(model), np.float32)
        assert relative(other, exact, real) > 10 * PATH_TOLERANCE


@pytest.mark.parametrize("dtype,rate,window,tiling", [
    ("float32", 0.1, 64, (64, 4)), ("bfloat16", 0.1, 0, (64, 4)), ("bfloat16", 0.1, 64, (64, 4)),
    ("bfloat16", 0.1, 64, (128, 8))], ids=["f32", "bf16", "bf16-window", "bf16-window-128/8"])
def test_the_flash_kernel_matches_its_reference_on_the_gpu(dtype, rate, window, tiling):
    """The Pallas flash kernel compiled by Triton against its computation in XLA (`reference_attention`:
    the same dropout mask drawn outside the kernel; the projections' biases) in float32 on the GPU,
    forward and gradients, at real queries of padded rows: float32 inputs within 1% (Triton's float32
    products use TF32), bfloat16 within 3x XLA's own bfloat16 error + 2%."""
    from bert_jax.model import flash

    gpu = gpus()[0]
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v = (jax.device_put(jax.random.normal(x, (4, 256, 4, 64)), gpu) for x in keys[:3])  # [batch, T, heads, kv]
    ids = jax.device_put(jnp.ones((4, 256), jnp.int32).at[1, 200:].set(0).at[2, 60:].set(0), gpu)  # [batch, length]
    real = np.asarray(ids > 0)[:, :, None, None]
    cot = jax.random.normal(keys[3], q.shape) * real
    key = jax.random.key(7)
    bias = jax.device_put(0.5 * jax.random.normal(jax.random.key(8), (3, 4, 64)), gpu)  # [3, heads, kv]

    def run(fn, dt):
        def loss(q, k, v):
            out = fn(q.astype(dt), k.astype(dt), v.astype(dt), ids, bias=bias.astype(dt), key=key, rate=rate,
                     window=window)
            return jnp.sum(out.astype(jnp.float32) * cot), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
        return np.asarray(out, np.float32), [np.asarray(g, np.float32) for g in grads]

    exact, exact_grads = run(flash.reference_attention, jnp.float32)
    got, got_grads = run(functools.partial(flash.flash_attention, tiling=flash.Tiling(*tiling)), jnp.dtype(dtype))
    errors = [relative(got, exact, real)] + [relative(g, h, True) for g, h in zip(got_grads, exact_grads, strict=True)]
    if dtype == "float32":
        bounds = [1e-2] * 4
    else:
        xla, xla_grads = run(flash.reference_attention, jnp.bfloat16)
        bounds = [BF16_FACTOR * e + PATH_TOLERANCE for e in [relative(xla, exact, real)] + [
            relative(g, h, True) for g, h in zip(xla_grads, exact_grads, strict=True)]]
    print(f"flash {tiling} {dtype} rate={rate} window={window}: output, dq, dk, dv {[f'{e:.4f}' for e in errors]} "
          f"(bounds {[f'{b:.4f}' for b in bounds]})")
    assert all(e <= b for e, b in zip(errors, bounds, strict=True)), (errors, bounds)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_fused_norm_kernel_matches_its_reference_on_the_gpu(dtype):
    """The residual-dropout-LayerNorm kernel compiled by Triton against its computation in XLA
    (`reference_add_norm`: the same mask) in float32 on the GPU, at BERT-base's width, forward and
    gradients (x, a, scale, bias, a's bias): float32 within 1e-4, bfloat16 within 3x XLA's own
    bfloat16 error + 2%."""
    from bert_jax.model import fused_norm

    gpu = gpus()[0]
    keys = jax.random.split(jax.random.key(0), 6)
    x, a, dy = (jax.device_put(jax.random.normal(k, (8, 128, 768)), gpu) for k in keys[:3])  # [batch, T, embed]
    scale = jax.device_put(1.0 + 0.1 * jax.random.normal(keys[3], (768,)), gpu)
    bias = jax.device_put(0.1 * jax.random.normal(keys[4], (768,)), gpu)
    a_bias = jax.device_put(0.3 * jax.random.normal(keys[5], (768,)), gpu)  # the sublayer's output bias
    key = jax.random.key(7)

    def run(fn, dt):
        def f(x, a, scale, bias, a_bias):
            return fn(x.astype(dt), a.astype(dt), scale, bias, a_bias=a_bias, eps=1e-12, key=key, rate=0.1)

        @jax.jit
        def forward_and_grads(*args):  # y, dx, da, dscale, dbias, da_bias
            y, vjp = jax.vjp(f, *args)
            return (y, *vjp(dy.astype(dt)))

        return [np.asarray(t, np.float32) for t in forward_and_grads(x, a, scale, bias, a_bias)]

    exact = run(fused_norm.reference_add_norm, jnp.float32)
    got = run(fused_norm.add_dropout_norm, jnp.dtype(dtype))
    errors = [relative(g, e, True) for g, e in zip(got, exact, strict=True)]
    if dtype == "float32":
        bounds = [1e-4] * 6
    else:
        xla = run(fused_norm.reference_add_norm, jnp.bfloat16)
        bounds = [BF16_FACTOR * relative(g, e, True) + PATH_TOLERANCE for g, e in zip(xla, exact, strict=True)]
    print(f"fused norm {dtype}: y, dx, da, dscale, dbias, da_bias {[f'{e:.5f}' for e in errors]} "
          f"(bounds {[f'{b:.5f}' for b in bounds]})")
    assert all(e <= b for e, b in zip(errors, bounds, strict=True)), (errors, bounds)


def test_the_grouped_global_norm_on_the_gpu():
    """The GPU's default global norm (`grouped`: bert_jax/training/global_norm.py) against
    ``optax.tree.norm`` over BERT-base's parameter shapes, and in a few reductions: the compiled
    program has one fusion for each 64 leaves (and their sum), where the per-leaf norm has one a leaf."""
    import math

    import optax

    from bert_jax.model.config import BertConfig
    from bert_jax.pretraining.objective import pretraining_model
    from bert_jax.training import global_norm as gn

    make = pretraining_model(BertConfig.from_size("base", scan_layers=False), objective("bert"))  # per layer: 206
    leaves = jax.tree.leaves(nnx.state(nnx.eval_shape(lambda: make(0)), nnx.Param))  # ShapeDtypeStructs
    keys = jax.random.split(jax.random.key(0), len(leaves))
    tree = [jax.device_put(jax.random.normal(k, x.shape), gpus()[0]) for k, x in zip(keys, leaves, strict=True)]
    fusions = {}
    for name, fn in (("per_leaf", optax.tree.norm), ("grouped", gn.grouped_norm)):
        compiled = jax.jit(fn).lower(tree).compile()
        fusions[name] = (float(compiled(tree)), compiled.as_text().count(" fusion("))
    print(f"global norm over {len(leaves)} leaves: (value, fusions) {fusions}")
    assert fusions["grouped"][0] == pytest.approx(fusions["per_leaf"][0], rel=1e-5)
    assert fusions["grouped"][1] <= 2 * math.ceil(len(leaves) / gn.GROUP) + 1 < len(leaves) <= fusions["per_leaf"][1]

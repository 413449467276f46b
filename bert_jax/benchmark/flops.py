"""Model FLOPs of a pre-training step, and the peak FLOP/s of the device they are measured against.

FLOPs per pre-training step (forward + backward = 3 x forward; a multiply-add is 2 FLOPs),
B batch, S sequence length, L layers, H hidden, I intermediate, E embedding width (= H unless
factorised), V vocabulary, P masked positions. BERT and RoBERTa (E = H):

    6·B·[S·L·(4H² + 2H·I) + P·(H² + H·V)] + 12·L·B·S²·H

- ``S·L·(4H² + 2H·I)``: per token and layer, the Q/K/V/output projections (4H²) and the feed-forward
  (2H·I);
- ``P·(H² + H·V)``: the MLM head on the P gathered positions: transform (H²) and the decoder tied to
  the word embeddings (H·V); a dense head would pay this on all S positions;
- ``12·L·B·S²·H``: attention scores QKᵀ and probabilities·V (2·2·B·S²·H per layer, times 3).

ALBERT (E < H, one shared block) adds the embedding projection E → H on every token and decodes
through E; the shared block still runs L times, so sharing saves parameters, not FLOPs:

    6·B·[S·L·(4H² + 2H·I) + S·E·H + P·(H·E + E·V)] + 12·L·B·S²·H

ELECTRA is the generator (H_g, I_g: `bert_jax.model.electra.electra_generator_config`) as the MLM
model above, with its own projection E → H_g, plus the discriminator on every token with its
replaced-token head (dense H → H, then H → 1); sampling the replacements costs no matmul:

    6·B·[S·L·(4H_g² + 2H_g·I_g) + S·E·H_g + P·(H_g·E + E·V)] + 12·L·B·S²·H_g
      + 6·B·[S·L·(4H² + 2H·I) + S·E·H + S·(H² + H)] + 12·L·B·S²·H        (S·E·H_· only where E ≠ H_·)

Not counted: embedding look-ups, pooler + NSP/SOP (6·B·(H² + 2H), negligible), element-wise work
(GELU, softmax, LayerNorm, dropout, sampling) and the optimizer update. This is the usual "model
FLOPs" of MFU: what the maths needs, not what the hardware executes (rematerialisation does not add
to it). tests/benchmark/test_flops.py checks every formula against the matmuls of the jitted step.
"""

from __future__ import annotations

import time

from bert_jax.model.config import BertConfig

FORMULA = "6*B*[S*L*(4H^2 + 2H*I) + P*(H^2 + H*V)] + 12*L*B*S^2*H"  # BERT, RoBERTa: see `formula`


def encoder_flops(cfg: BertConfig, batch_size: int, seq_len: int, tokens: int | None = None) -> int:
    """Forward + backward of the encoder: the embedding projection E → H (factorised embeddings)
    on all B·S slots, the blocks' projections and feed-forward on ``tokens`` slots (all B·S unless
    unpadded, ``config.unpad_multiple``), attention on the padded [B, S]."""
    b, s = batch_size, seq_len
    n, h, i, e = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.embed_dim
    t = b * s if tokens is None else tokens
    projection = b * s * e * h if e != h else 0
    return 6 * (projection + t * n * (4 * h * h + 2 * h * i)) + 12 * n * b * s * s * h


def mlm_head_flops(cfg: BertConfig, predictions: int) -> int:
    """Forward + backward of the MLM head on ``predictions`` positions: transform H → E, tied decoder E → V."""
    h, e, v = cfg.hidden_size, cfg.embed_dim, cfg.vocab_size
    return 6 * predictions * (h * e + e * v)


def pretraining_flops(cfg: BertConfig, batch_size: int, seq_len: int, max_predictions: int,
                      tokens: int | None = None) -> int:
    """Model FLOPs of one MLM pre-training step (BERT, RoBERTa, ALBERT; the MLM head on
    ``max_predictions`` gathered positions). ``tokens``: the token slots the blocks' projections and
    feed-forward run on when unpadded (``config.unpad_multiple``) instead of all B·S."""
    return encoder_flops(cfg, batch_size, seq_len, tokens) + mlm_head_flops(cfg, batch_size * max_predictions)


def electra_flops(cfg: BertConfig, generator_fraction: float, batch_size: int, seq_len: int, max_predictions: int,
                  tokens: int | None = None) -> int:
    """Model FLOPs of one ELECTRA step: the generator's MLM step + the discriminator on every token
    with its replaced-token head (``cfg`` is the discriminator's)."""
    from bert_jax.model.electra import electra_generator_config

    generator = electra_generator_config(cfg, generator_fraction)
    h, b, s = cfg.hidden_size, batch_size, seq_len
    return (pretraining_flops(generator, b, s, max_predictions, tokens) + encoder_flops(cfg, b, s, tokens)
            + 6 * b * s * (h * h + h))


def model_flops(cfg: BertConfig, objective: str, batch_size: int, seq_len: int, max_predictions: int,
                tokens: int | None = None, generator_fraction: float | None = None) -> int:
    """Model FLOPs of the pre-training step for ``objective`` (nsp | sop | none: MLM; rtd: ELECTRA,
    which needs ``generator_fraction``)."""
    if objective != "rtd":
        return pretraining_flops(cfg, batch_size, seq_len, max_predictions, tokens)
    if generator_fraction is None:
        raise ValueError("objective 'rtd' (ELECTRA) needs the generator_fraction for its FLOPs")
    return electra_flops(cfg, generator_fraction, batch_size, seq_len, max_predictions, tokens)


def formula(cfg: BertConfig, objective: str, generator_fraction: float | None = None) -> str:
    """The formula `model_flops` evaluates for this model, in the module docstring's letters."""
    e, h = cfg.embed_dim, cfg.hidden_size
    if objective != "rtd":
        return FORMULA if e == h else "6*B*[S*L*(4H^2 + 2H*I) + S*E*H + P*(H*E + E*V)] + 12*L*B*S^2*H"
    from bert_jax.model.electra import electra_generator_config

    hg = electra_generator_config(cfg, generator_fraction or 1.0).hidden_size
    return ("generator 6*B*[S*L*(4H_g^2 + 2H_g*I_g)" + (" + S*E*H_g" if e != hg else "")
            + " + P*(H_g*E + E*V)] + 12*L*B*S^2*H_g + discriminator 6*B*[S*L*(4H^2 + 2H*I)"
            + (" + S*E*H" if e != h else "") + " + S*(H^2 + H)] + 12*L*B*S^2*H")


def dense_mlm_flops(cfg: BertConfig, batch_size: int, seq_len: int) -> int:
    """The same (MLM) step with a dense MLM head (vocabulary projection at every position)."""
    return pretraining_flops(cfg, batch_size, seq_len, seq_len)


# Published dense (no sparsity) peak FLOP/s per JAX device, by compute dtype. "float32" is what a
# float32 matmul gets under JAX's default precision: TF32 tensor cores on Ampere and newer NVIDIA
# GPUs, one bfloat16 pass on TPUs (so there it equals the bfloat16 peak). TPU v2/v3 expose each
# TensorCore as a device (half a chip); v4 and newer one device per chip.
# (substring of device_kind, lower case), name, bfloat16, float32
PEAKS: tuple[tuple[tuple[str, ...], str, float, float], ...] = (
    (("h100", "pcie"), "NVIDIA H100 PCIe", 756e12, 378e12),
    (("h100", "nvl"), "NVIDIA H100 NVL", 835e12, 418e12),
    (("h100",), "NVIDIA H100 SXM", 989e12, 495e12),
    (("h200",), "NVIDIA H200", 989e12, 495e12),
    (("a100",), "NVIDIA A100", 312e12, 156e12),
    (("tpu v6",), "TPU v6e (Trillium)", 918e12, 918e12),
    (("tpu v5 lite",), "TPU v5e", 197e12, 197e12),
    (("tpu v5e",), "TPU v5e", 197e12, 197e12),
    (("tpu v5",), "TPU v5p", 459e12, 459e12),
    (("tpu v4",), "TPU v4", 275e12, 275e12),
    (("tpu v3",), "TPU v3 (per core)", 61.5e12, 61.5e12),
    (("tpu v2",), "TPU v2 (per core)", 22.5e12, 22.5e12),
)


def published_peak(device_kind: str, dtype: str) -> tuple[float, str] | None:
    """(peak FLOP/s per device, source) from the table, or None for an unknown device (and CPUs)."""
    kind = device_kind.lower()
    for needles, name, bf16, fp32 in PEAKS:
        if all(n in kind for n in needles):
            peak = bf16 if dtype in ("bfloat16", "float16") else fp32
            return peak, f"published dense {dtype} peak of {name}"
    return None


def measure_matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """Achieved FLOP/s of a jitted n×n @ n×n float32 matmul (median of ``repeats``): the CPU's
    practical peak, measured in the same run (and under the same load) as the benchmark."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f(a, a).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2 * n**3 / float(np.median(times))


def device_peak(dtype: str, devices: int = 1) -> tuple[float, str]:
    """(peak FLOP/s of ``devices`` of the default device kind, where the number comes from): the
    published peak of a known accelerator, else (CPUs) a matmul measured now."""
    import jax

    known = published_peak(jax.devices()[0].device_kind, dtype)
    if known is not None:
        return known[0] * devices, known[1] + (f" x {devices} devices" if devices > 1 else "")
    peak = measure_matmul_peak()
    return peak * devices, ("measured in this run: jitted 2048x2048 @ 2048x2048 float32 matmul, median of 5 "
                            f"({peak / 1e9:.1f} GFLOP/s per device; a practical peak, not the hardware's)")

"""Model FLOPs of a pre-training step, and the peak FLOP/s they are measured against.

Forward + backward = 3 x forward, a multiply-add is 2 FLOPs; B batch, S length, L layers, H hidden,
I intermediate, E embedding width (= H unless factorised), V vocabulary, P masked positions:

    BERT, RoBERTa  6·B·[S·L·(4H² + 2H·I) + P·(H² + H·V)] + 12·L·B·S²·H
    ALBERT         6·B·[S·L·(4H² + 2H·I) + S·E·H + P·(H·E + E·V)] + 12·L·B·S²·H
    ELECTRA        the generator (H_g, I_g) as the MLM model above
                   + 6·B·[S·L·(4H² + 2H·I) + S·E·H + S·(H² + H)] + 12·L·B·S²·H   (the discriminator)
    ModernBERT     as BERT with GeGLU's 3H·I for 2H·I (its projection is H → 2I), and a local layer's
                   attention over the keys within its window, W(S) query-key pairs for S²

(the MLM head at the P gathered positions; ALBERT's shared block still runs L times; ELECTRA's
replaced-token head on every token). Not counted: embedding look-ups, pooler + NSP/SOP, element-wise
work and the optimizer: the "model FLOPs" of MFU. tests/benchmark/test_flops.py checks each formula
against the matmuls of the jitted step; docs/benchmarks.md explains the terms.
"""

from __future__ import annotations

import time

from bert_jax.model.config import BertConfig


def attended_pairs(seq_len: int, window: int) -> int:
    """The (query, key) pairs of a layer's attention over ``seq_len`` tokens: all S² for a global
    layer (``window`` 0), those within ``window // 2`` positions of each other for a local one."""
    s, half = seq_len, window // 2
    if not window or half >= s - 1:
        return s * s
    return s + 2 * (half * (half + 1) // 2 + (s - 1 - half) * half)  # the query itself, and each side


def encoder_flops(cfg: BertConfig, batch_size: int, seq_len: int, tokens: int | None = None) -> int:
    """The encoder: E → H on all B·S slots, the blocks' dense work on ``tokens`` slots (all B·S
    unless unpadded, ``config.unpad_multiple``), attention on the padded [B, S]."""
    b, s, n, h, i, e = batch_size, seq_len, cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.embed_dim
    t = b * s if tokens is None else tokens
    mlp = (3 if cfg.ffn == "geglu" else 2) * h * i  # GeGLU: H → 2I, then I → H
    local = sum(1 for layer in range(n) if cfg.local_window and layer % cfg.global_every)
    pairs = (n - local) * s * s + local * attended_pairs(s, cfg.local_window)
    return 6 * ((b * s * e * h if e != h else 0) + t * n * (4 * h * h + mlp)) + 12 * b * pairs * h


def pretraining_flops(cfg: BertConfig, batch_size: int, seq_len: int, max_predictions: int,
                      tokens: int | None = None) -> int:
    """An MLM step (BERT, RoBERTa, ALBERT): the encoder and the head on B·P positions (H → E → V)."""
    h, e, v = cfg.hidden_size, cfg.embed_dim, cfg.vocab_size
    return encoder_flops(cfg, batch_size, seq_len, tokens) + 6 * batch_size * max_predictions * (h * e + e * v)


def model_flops(cfg: BertConfig, objective: str, batch_size: int, seq_len: int, max_predictions: int,
                tokens: int | None = None, generator_fraction: float | None = None) -> int:
    """The step of ``objective`` (nsp | sop | none: MLM; rtd: ELECTRA, ``cfg`` the discriminator's)."""
    if objective != "rtd":
        return pretraining_flops(cfg, batch_size, seq_len, max_predictions, tokens)
    if generator_fraction is None:
        raise ValueError("objective 'rtd' (ELECTRA) needs the generator_fraction for its FLOPs")
    from bert_jax.model.electra import electra_generator_config

    generator = electra_generator_config(cfg, generator_fraction)
    b, s, h = batch_size, seq_len, cfg.hidden_size
    return (pretraining_flops(generator, b, s, max_predictions, tokens) + encoder_flops(cfg, b, s, tokens)
            + 6 * b * s * (h * h + h))


def dense_mlm_flops(cfg: BertConfig, batch_size: int, seq_len: int) -> int:
    """The MLM step with a dense head (the vocabulary projection at every position: P = S)."""
    return pretraining_flops(cfg, batch_size, seq_len, seq_len)


# Published dense peak FLOP/s per JAX device by compute dtype. "float32" is what a float32 matmul gets
# under JAX's default precision: TF32 on Ampere and newer NVIDIA GPUs, one bfloat16 pass on TPUs. TPU
# v2/v3 expose each TensorCore as a device (half a chip). (substrings of device_kind), name, bf16, fp32:
PEAKS = (
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
    """(peak FLOP/s per device, source) from `PEAKS`, or None for an unknown device (and CPUs)."""
    for needles, name, bf16, fp32 in PEAKS:
        if all(n in device_kind.lower() for n in needles):
            return (bf16 if dtype in ("bfloat16", "float16") else fp32), f"published dense {dtype} peak of {name}"
    return None


def device_peak(dtype: str, devices: int = 1) -> tuple[float, str]:
    """(peak FLOP/s of ``devices`` default devices, its source): a known accelerator's published peak,
    else (a CPU) a jitted 2048³ float32 matmul measured now, under the run's load: a practical peak."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    known = published_peak(jax.devices()[0].device_kind, dtype)
    if known is not None:
        return known[0] * devices, known[1] + (f" x {devices} devices" if devices > 1 else "")
    n, times = 2048, []
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    for _ in range(5):
        t = time.perf_counter()
        f(a, a).block_until_ready()
        times.append(time.perf_counter() - t)
    peak = 2 * n**3 / float(np.median(times))
    return peak * devices, ("measured in this run: jitted 2048x2048 @ 2048x2048 float32 matmul, median of 5 "
                            f"({peak / 1e9:.1f} GFLOP/s per device; a practical peak, not the hardware's)")

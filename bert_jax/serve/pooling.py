"""Sentence vectors from the encoder's outputs: the paper's feature-based choices and
sentence-transformers' mean pooling.

- ``cls``: the last layer's [CLS] vector [H];
- ``mean``: the attention-mask-weighted mean of the last layer's token vectors [H] (what
  sentence-transformers' ``Pooling(pooling_mode_mean_tokens=True)`` computes, e.g. all-MiniLM-L6-v2);
- ``pooled``: the pooler's tanh(W·[CLS]) (the NSP/classifier input) [H], when the checkpoint has one;
- ``last4_concat``: the [CLS] vectors of the last four layers concatenated [4H] (the paper's best
  feature-based combination, §5.3, taken at the token that stands for the sentence; a model with
  fewer than four layers counts the embedding output as a layer, so 2 layers give [3H]).

``normalize`` divides each vector by its L2 norm (sentence-transformers' ``Normalize`` module).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

POOLINGS = ("cls", "mean", "pooled", "last4_concat")


def all_poolings(hidden_states, pooled_output, input_mask) -> dict:
    """Every pooling at once (inside the jitted forward pass).

    hidden_states [layers + 1, B, L, H] (0 = embeddings); pooled_output [B, H] or None; input_mask [B, L].
    """
    last = hidden_states[-1]  # [B, L, H]
    mask = input_mask.astype(last.dtype)[..., None]  # [B, L, 1]
    mean = (last * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)  # [B, H]
    picked = hidden_states[-4:]  # [min(4, layers + 1), B, L, H]
    last4 = jnp.concatenate([h[:, 0] for h in picked], axis=-1)  # [B, 4H]
    out = {"cls": last[:, 0], "mean": mean, "last4_concat": last4}
    if pooled_output is not None:
        out["pooled"] = pooled_output
    return {k: v.astype(jnp.float32) for k, v in out.items()}


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (a zero row stays zero). vectors [N, D]."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)  # [N, 1]
    return vectors / np.maximum(norms, 1e-12)


def sentence_transformers_defaults(directory: str | Path) -> tuple[str, bool] | None:
    """(pooling, normalize) from a sentence-transformers checkpoint's modules.json and
    1_Pooling/config.json, or None when the directory is not one (or pools some other way)."""
    d = Path(directory)
    modules_file = d / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    pooling_module = next((m for m in modules if m.get("type", "").endswith(".Pooling")), None)
    if pooling_module is None:
        return None
    config_file = d / pooling_module.get("path", "1_Pooling") / "config.json"
    if not config_file.is_file():
        return None
    cfg = json.loads(config_file.read_text(encoding="utf-8"))
    modes = [k for k in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                         "pooling_mode_mean_sqrt_len_tokens") if cfg.get(k)]
    if modes == ["pooling_mode_mean_tokens"]:
        pooling = "mean"
    elif modes == ["pooling_mode_cls_token"]:
        pooling = "cls"
    else:
        return None
    return pooling, any(m.get("type", "").endswith(".Normalize") for m in modules)

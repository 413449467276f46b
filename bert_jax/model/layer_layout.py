"""The encoder's two parameter layouts and the conversion between them.

Scanned, the blocks' parameters are stacked: ``bert/layers/attention/query/kernel`` is one array
``[layers, embed, heads, kv]``. Unrolled, each block holds its own: ``bert/layers/0/attention/query/kernel``
``[embed, heads, kv]``, ``bert/layers/1/...``. The stacked form is the one on disk: our checkpoints
(`bert_jax.training.checkpoints` stacks an unrolled model's arrays when it saves and splits them when
it restores), Hugging Face and TF checkpoints (the converters produce it) and exports; stored
weights go into either model: `bert_jax.model.weights.load_params` compares and loads in the stacked
form (`stack`, `stacked_key`) and hands each block its row.
ALBERT's shared block is always stacked (one block on an axis of length 1).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx

PER_LAYER = re.compile(r"(^|.*/)layers/(\d+)/(.+)$")  # prefix, layer index, rest


def unstack(stacked: nnx.Module, cfg) -> list[nnx.Module]:
    """The vmapped block ``stacked`` (parameters ``[layers, ...]``) as ``cfg.num_layers`` blocks with
    their own arrays (row i of each stack) and the logical axis names of one block."""
    from bert_jax.model.layers import TransformerBlock

    values = nnx.to_pure_dict(nnx.state(stacked))
    graphdef, template = nnx.split(nnx.eval_shape(lambda: TransformerBlock(cfg, rngs=nnx.Rngs(0))))
    blocks = []
    for i in range(cfg.num_layers):
        state = jax.tree.map(lambda v: v, template)  # new Variables, one block's metadata
        nnx.replace_by_pure_dict(state, jax.tree.map(lambda a, i=i: a[i], values))
        blocks.append(nnx.merge(graphdef, state))
    return blocks


def stack(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A flat ``{"a/layers/3/b": array}`` dict with every per-layer group stacked into ``"a/layers/b"``
    (layers 0..n-1 in order); anything else unchanged. Raises ValueError on a gap in the layers."""
    out: dict[str, np.ndarray] = {}
    groups: dict[str, dict[int, np.ndarray]] = {}
    for key, value in flat.items():
        m = PER_LAYER.match(key)
        if m:
            groups.setdefault(f"{m[1]}layers/{m[3]}", {})[int(m[2])] = value
        else:
            out[key] = value
    for key, rows in groups.items():
        if sorted(rows) != list(range(len(rows))):
            raise ValueError(f"{key}: layers {sorted(rows)} stored per layer, expected 0..{len(rows) - 1}")
        out[key] = np.stack([np.asarray(rows[i]) for i in range(len(rows))])
    return out


def stacked_key(key: str) -> tuple[str, int] | None:
    """``"a/layers/3/b"`` → (``"a/layers/b"``, 3); None for a key that is not per layer."""
    m = PER_LAYER.match(key)
    return (f"{m[1]}layers/{m[3]}", int(m[2])) if m else None

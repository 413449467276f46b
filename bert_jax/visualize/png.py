"""Attention heat-maps as a PNG (matplotlib, no display needed): one layer's heads side by side, or
one head, queries as rows and keys as columns, for papers and reports."""

from __future__ import annotations

import io

from bert_jax.visualize.attention import Attention

MAX_LABELS = 48  # above this many tokens the axes carry no token labels (they would overlap)


def png_bytes(att: Attention, *, layer: int = -1, head: int | None = None, dpi: int = 120) -> bytes:
    """A PNG of ``layer``'s heat-maps (0-based, negative from the end): every head, or only ``head``
    (0-based)."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    if not -att.num_layers <= layer < att.num_layers:
        raise ValueError(f"layer {layer}: expected 0..{att.num_layers - 1} or -1..-{att.num_layers}")
    if head is not None and not 0 <= head < att.num_heads:
        raise ValueError(f"head {head}: expected 0..{att.num_heads - 1}")
    layer %= att.num_layers
    heads = list(range(att.num_heads)) if head is None else [head]
    cols = min(len(heads), 4)
    rows = -(-len(heads) // cols)
    n = len(att.tokens)
    cell = 3.2 if head is None else max(4.0, 0.22 * n)
    fig = Figure(figsize=(cols * cell + 0.8, rows * cell + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    labels = n <= MAX_LABELS
    for ax, h in zip(axes.flat, heads, strict=False):
        image = ax.imshow(att.probs[layer, h], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(f"layer {layer + 1}, head {h + 1}", fontsize=9)
        if labels:
            size = 7 if head is not None else max(3, 7 - n // 12)
            ax.set_xticks(range(n), att.tokens, rotation=90, fontsize=size)
            ax.set_yticks(range(n), att.tokens, fontsize=size)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    for ax in list(axes.flat)[len(heads):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention (query row → key column)")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()

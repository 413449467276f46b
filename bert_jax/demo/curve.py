"""``python -m bert_jax.demo --curve``: dev accuracy against pre-training steps, as a PNG.

The demo's first pre-training model is pre-trained again for `FRACTIONS` of its step budget (each a
run of its own, with its own warmup and decay; the budget's own run is the demo's), every run is
fine-tuned as the demo's rows are, and the figure shows each point's mean and seeds, the scratch row
at step 0 and as a line, and the MiniLM row's level. It costs several times the demo's pre-training,
so it is off by default.
"""

from __future__ import annotations

import io
from pathlib import Path

FRACTIONS = (0.25, 0.5, 1.0, 2.0)  # of the demo's pre-training steps; step 0 is the scratch row
FILE = "demo_curve.png"


def curve_steps(budget: int) -> list[int]:
    """The pre-training step counts of the curve's points (step 0, the scratch row, not included)."""
    return sorted({max(1, round(budget * f)) for f in FRACTIONS})


def points(rows: dict[int, dict]) -> list[dict]:
    """[{steps, mean, per_seed}] sorted by steps, from {steps: a fine-tuning row of the demo's report}."""
    return [{"steps": steps, "mean": row["mean"], "per_seed": list(row["per_seed"])}
            for steps, row in sorted(rows.items())]


def png_bytes(curve: list[dict], *, scratch: dict, minilm: float | None, model: str, budget: int,
              dpi: int = 120) -> bytes:
    """The figure: dev accuracy (mean and seeds) against pre-training steps; ``scratch`` (a row:
    mean and per_seed) at step 0 and as a dashed line, ``minilm`` as a dotted line."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.subplots()
    xs = [0] + [p["steps"] for p in curve]
    means = [scratch["mean"]] + [p["mean"] for p in curve]
    ax.plot(xs, means, "o-", color="tab:blue", label=f"tiny {model}, pre-trained here (mean of seeds)")
    for x, seeds in zip(xs, [scratch["per_seed"]] + [p["per_seed"] for p in curve], strict=True):
        ax.plot([x] * len(seeds), seeds, ".", color="tab:blue", alpha=0.35)
    ax.axhline(scratch["mean"], ls="--", color="tab:gray", label="from scratch (step 0)")
    if minilm is not None:
        ax.axhline(minilm, ls=":", color="tab:green", label="all-MiniLM-L6-v2 (released weights)")
    ax.axvline(budget, color="tab:orange", alpha=0.3, lw=6, label=f"the demo's budget ({budget} steps)")
    ax.set_xlabel("pre-training steps (32 × 128 tokens each)")
    ax.set_ylabel("dev accuracy after fine-tuning")
    ax.set_title("Dev accuracy against the demo's pre-training steps", fontsize=11)
    ax.grid(alpha=0.3)
    ax.set_ylim(min(min(means), *(min(p["per_seed"]) for p in curve)) - 0.02, max(max(means), minilm or 0) + 0.02)
    ax.legend(fontsize=8, loc="upper center", ncols=2)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def markdown(curve: list[dict], *, scratch: dict, path: Path) -> list[str]:
    """The lines demo_results.md gets: the figure and its numbers."""
    cells = ", ".join(f"{p['steps']}: {p['mean']:.3f}" for p in curve)
    return [f"![dev accuracy against pre-training steps]({path.name})", "",
            f"Dev accuracy against pre-training steps (steps: mean over the fine-tuning seeds): 0 (scratch): "
            f"{scratch['mean']:.3f}, {cells}. Each point is its own pre-training run (warmup and decay "
            f"scaled to its length), fine-tuned as the table's rows.", ""]

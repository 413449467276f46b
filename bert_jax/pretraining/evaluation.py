"""Pre-training's held-out evaluation: what it reads (`eval_source`), the same held-out batches each
time (`HeldOutBatches`), their metrics (`held_out_metrics`, with the unigram reference of
`bert_jax.pretraining.health`) and the step-0 evaluation a resumed run reads back (`step0_reference`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import jax
import numpy as np

from bert_jax.pretraining import health
from bert_jax.pretraining.objective import metrics_from_sums
from bert_jax.training import sharding as sh
from bert_jax.training.metric_writer import read_metrics


def eval_source(config) -> str | None:
    """What the held-out evaluation reads, or None when it is switched off (``eval_every=0`` or
    ``eval_steps=0``). Evaluation on with no held-out data is an error: a long run would otherwise
    train blind (docs/data.md builds held-out shards)."""
    if not (config.eval_every and config.eval_steps):
        return None
    d = config.data
    if d.kind == "synthetic":
        return "synthetic batches"
    if d.eval_input:
        return d.eval_input
    if d.eval_fraction:
        from input_pipeline.pretraining.dataset import held_out_every

        return f"every {held_out_every(d.eval_fraction)}th document of {d.input}"
    raise ValueError("no held-out data: set --config.data.eval_input to held-out shards (docs/data.md), or "
                     "--config.data.eval_fraction=F to hold out documents of text input, or --config.eval_every=0 "
                     "to train without evaluation")


class HeldOutBatches:
    """The first ``num_batches`` batches of the held-out input ``data`` (a reader with ``state`` /
    ``restore``), the same ones at every evaluation: a step's numbers then depend on its parameters
    alone, not on how many evaluations came before it. The first complete pass keeps them in host
    memory when they fit in ``max_bytes``; later passes replay them, and the reader is let go
    (dropping and rebuilding its tf.data iterator at every evaluation cost 0.4-5 s on 2 cores:
    docs/records.md, "The held-out batches kept in memory"). Larger held-out sets are read again from
    their start each time."""

    MAX_BYTES = 1 << 30  # host memory for the kept batches (configs/pretrain.py's phase 2 on one host: ~90 MB)

    def __init__(self, data, num_batches: int, max_bytes: int = MAX_BYTES):
        self.data, self.num_batches, self.max_bytes = data, num_batches, max_bytes
        self.start = data.state()
        self.kept: list[dict] | None = None

    def __iter__(self) -> Iterator[dict]:
        if self.kept is not None:
            yield from self.kept
            return
        if self.data.state() != self.start:
            self.data.restore(self.start)
        kept, size = [], 0
        for _ in range(self.num_batches):
            batch = next(self.data)
            size += sum(np.asarray(v).nbytes for v in batch.values())
            if size > self.max_bytes:
                kept = None
            elif kept is not None:
                kept.append(batch)
            yield batch
        if kept is not None:  # a whole pass (an interrupted one stops above) that fits
            self.kept, self.data = kept, None


def held_out_metrics(eval_fn, state, batches: Iterable[dict], mesh, rules,
                     interrupted: Callable[[], bool] = lambda: False, train_counts=None) -> dict | None:
    """Held-out metrics over ``batches`` (e.g. `HeldOutBatches`); None if ``interrupted()`` turns true
    on the way. ``train_counts`` (the training batches' masked labels, `health.LabelCounts.counts`):
    adds ``mlm_unigram_cross_entropy``, the held-out labels' loss under their frequencies."""
    totals = None
    for batch in batches:
        if interrupted():
            return None
        # Summed on the host: a handful of scalars and histograms, and no eager op on arrays sharded
        # over every device (each would compile a program; one such add aborted a CPU test run).
        sums = jax.device_get(eval_fn(state.params, sh.global_batch(batch, mesh, rules)))
        totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
    result = {k: float(v) for k, v in metrics_from_sums(totals).items()}
    if train_counts is not None and "mlm_label_counts" in totals and train_counts.sum():
        result["mlm_unigram_cross_entropy"] = health.unigram_cross_entropy(train_counts, totals["mlm_label_counts"])
    return result


def step0_reference(workdir) -> dict | None:
    """The step-0 evaluation recorded in ``workdir``'s metrics.jsonl (the last, if recorded twice),
    or None: a resumed run's reference for the collapse warning."""
    try:
        rows = [r for r in read_metrics(workdir, "eval") if r["step"] == 0]
    except (FileNotFoundError, ValueError):
        return None
    return rows[-1] if rows else None

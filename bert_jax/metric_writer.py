"""Metrics to TensorBoard event files and ``metrics.jsonl`` in the workdir (process 0 only).

Events go to ``<workdir>/tensorboard/<name>`` (``train``, ``eval``), so ``tensorboard --logdir
<workdir>/tensorboard`` shows the curves; ``metrics.jsonl`` holds one JSON object per write, with
``"split"`` and ``"step"`` keys, for scripts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricWriter:
    def __init__(self, workdir: str | Path, *, enabled: bool = True):
        self.enabled = enabled
        self.workdir = Path(workdir)
        self._tb: dict = {}
        if enabled:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.workdir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def _writer(self, split: str):
        import tensorflow as tf

        if split not in self._tb:
            self._tb[split] = tf.summary.create_file_writer(str(self.workdir / "tensorboard" / split))
        return self._tb[split]

    def write(self, step: int, metrics: dict[str, float], split: str = "train") -> None:
        if not self.enabled:
            return
        import tensorflow as tf

        clean = {k: float(v) for k, v in metrics.items()}
        self._jsonl.write(json.dumps({"split": split, "step": int(step), **{
            k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}) + "\n")
        self._jsonl.flush()
        with self._writer(split).as_default():
            for k, v in clean.items():
                tf.summary.scalar(k, v, step=int(step))
        self._writer(split).flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            for w in self._tb.values():
                w.close()


def read_metrics(workdir: str | Path, split: str | None = None) -> list[dict]:
    """The rows of ``metrics.jsonl`` (optionally one split), in order."""
    path = Path(workdir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if split is None or r["split"] == split]

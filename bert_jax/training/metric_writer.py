"""Metrics to TensorBoard event files and ``metrics.jsonl`` in the workdir (process 0 only).

Events go to ``<workdir>/tensorboard/<name>`` (``train``, ``eval``), so ``tensorboard --logdir
<workdir>/tensorboard`` shows the curves; ``metrics.jsonl`` holds one JSON object per write, with
``"split"`` and ``"step"`` keys, for scripts. On object stores without append (``gs://``) the
file is rewritten whole (write to a temporary name, then rename) at every write. The event files come
from TensorBoard's own writer (`tensorboard.summary.Writer`: it needs no TensorFlow, so the synthetic-data
trainer runs where TensorFlow is absent; where it is installed, TensorBoard writes through its file
systems, ``gs://`` included).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bert_jax.training.checkpoints import as_path


class MetricWriter:
    def __init__(self, workdir: str | Path, *, enabled: bool = True):
        self.enabled = enabled
        self.workdir = as_path(workdir)
        self._tb: dict = {}
        self._jsonl = self._rows = None
        if enabled:
            self.workdir.mkdir(parents=True, exist_ok=True)
            path = self.workdir / "metrics.jsonl"
            if "://" in str(path):  # no append on object stores: keep the rows, rewrite the file
                self._rows = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
            else:
                self._jsonl = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def _writer(self, split: str):
        from tensorboard.summary import Writer

        if split not in self._tb:
            self._tb[split] = Writer(str(self.workdir / "tensorboard" / split))
        return self._tb[split]

    def write(self, step: int, metrics: dict[str, float], split: str = "train") -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        line = json.dumps({"split": split, "step": int(step), **{
            k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}})
        if self._jsonl is not None:
            self._jsonl.write(line + "\n")
            self._jsonl.flush()
        else:
            self._rows.append(line)
            tmp = self.workdir / "metrics.jsonl.tmp"
            tmp.write_text("\n".join(self._rows) + "\n", encoding="utf-8")
            tmp.replace(self.workdir / "metrics.jsonl")
        writer = self._writer(split)
        for k, v in clean.items():
            writer.add_scalar(k, v, step=int(step))
        writer.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self.enabled:
            for w in self._tb.values():
                w.close()


def read_metrics(workdir: str | Path, split: str | None = None) -> list[dict]:
    """The rows of ``metrics.jsonl`` (optionally one split), in order."""
    path = as_path(workdir) / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if split is None or r["split"] == split]

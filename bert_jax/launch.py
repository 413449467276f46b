"""``run(config, workdir)``: the one entry point of ``train.py`` (and of tests and the demo).

A config with a ``task`` section (configs/glue.py, squad.py, ner.py, sentiment.py) fine-tunes
(`bert_jax.finetuning.trainer`); any other config pre-trains (`bert_jax.training.trainer`).
"""

from __future__ import annotations

from pathlib import Path


def run(config, workdir: str | Path) -> dict:
    """Runs the job ``config`` describes in ``workdir``; returns its last metrics (pre-training) or
    its results (fine-tuning)."""
    if "task" in config:
        from bert_jax.finetuning import trainer as finetuning
        return finetuning.run(config, workdir)
    from bert_jax.training import trainer as pretraining
    return pretraining.run(config, workdir)

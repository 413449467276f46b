"""The attention of a fine-tuned model: ``--init`` a fine-tuning workdir (its encoder, the vocabulary
of its init_checkpoint)."""

import json
import re

import numpy as np
import pytest

from bert_jax import launch
from bert_jax.visualize import attention, command


@pytest.mark.slow  # ~15 s: two fine-tuning steps
def test_finetuning_workdir(tiny_checkpoint, load_config, tmp_path):
    c = load_config("sentiment", "runlocal")
    c.init_checkpoint = tiny_checkpoint
    c.num_train_steps, c.checkpoint_every, c.progress = 2, 2, False
    c.max_train_examples = c.max_eval_examples = 16
    c.batch_size = c.eval_batch_size = 8
    c.max_seq_length = 32
    c.optimizer.update(learning_rate=1e-2, warmup_fraction=0.0)
    launch.run(c, tmp_path / "ft")
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["vocab"] == ""  # from init_checkpoint

    command.run(str(tmp_path / "ft"), "the cat sat", tmp_path / "a.html")
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    (blob,) = re.findall(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    tuned = np.array(json.loads(blob)["attention"])
    before = attention.attention_of(*attention.load(tiny_checkpoint), "the cat sat").probs
    assert tuned.shape == before.shape
    assert np.abs(tuned - before).max() > 1e-3  # the fine-tuned encoder, not the one it started from

"""The family's recipes through the one trainer: ALBERT and ELECTRA pre-train, checkpoint and
resume exactly; fine-tuning restores the encoder (ELECTRA: the discriminator) from their workdirs."""

import dataclasses

import numpy as np
import pytest

from bert_jax import launch
from bert_jax.finetuning.warm_start import open_init_checkpoint
from bert_jax.model import layer_layout
from bert_jax.model.models import BertClassifier, create
from bert_jax.training.checkpoints import read_params
from bert_jax.training.metric_writer import read_metrics
from tests.fixtures.params import params_of

# ~3 min on 2 cores (each family pre-trains twice): resume is guarded fast by BERT's
# (tests/training/test_trainer.py), the family's models by tests/model/test_family.py.
pytestmark = pytest.mark.slow

FAMILY = ["albert", "electra"]


@pytest.fixture(scope="module", params=FAMILY)
def straight(request, tmp_path_factory, tiny_config):
    model = request.param
    workdir = tmp_path_factory.mktemp(f"{model}_straight")
    launch.run(tiny_config(steps=4, model=model, eval_every=0, checkpoint_every=2), workdir)
    return model, workdir


def test_resume_is_exact(straight, tmp_path, tiny_config):
    model, workdir = straight
    launch.run(tiny_config(steps=2, model=model, eval_every=0, checkpoint_every=2), tmp_path)
    launch.run(tiny_config(steps=4, model=model, eval_every=0, checkpoint_every=2), tmp_path)  # resumes at 2
    a, _ = read_params(workdir)
    b, _ = read_params(tmp_path)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    last = read_metrics(tmp_path, "train")[-1]
    np.testing.assert_allclose(last["loss"], read_metrics(workdir, "train")[-1]["loss"], rtol=1e-6)
    if model == "electra":
        assert {"rtd_loss", "rtd_accuracy", "mlm_loss"} <= set(last)
        assert {k.split("/")[0] for k in a} == {"bert", "generator", "mlm", "rtd"}
    else:  # ALBERT: one shared block, sentence-order prediction
        assert a["bert/layers/ffn/intermediate/kernel"].shape[0] == 1 and "nsp_loss" in last


def test_finetuning_restores_the_encoder(straight):
    model, workdir = straight
    warm = open_init_checkpoint(str(workdir))
    cfg = dataclasses.replace(warm.config, use_pooler=True)  # what fine-tuning does for a classifier
    clf = create(BertClassifier, cfg, 2)
    untouched = warm.load_encoder(clf)
    stored, _ = read_params(workdir)  # stacked on disk, whatever ran the blocks
    got = layer_layout.stack(params_of(clf))
    for k, v in got.items():
        if k.startswith("bert/") and not k.startswith("bert/pooler"):
            np.testing.assert_array_equal(v, stored[k], err_msg=k)
    fresh = {p.split("/")[0] if not p.startswith("bert/pooler") else "bert/pooler" for p in untouched}
    # ELECTRA's discriminator has no pooler: it starts fresh, like the classifier.
    assert fresh == ({"classifier", "bert/pooler"} if model == "electra" else {"classifier"})


@pytest.mark.slow  # ~1-2 minutes per model on 2 cores
@pytest.mark.parametrize("model", ["roberta", "albert", "electra"])
def test_train_py_runlocal_resumes_and_fine_tunes(model, tmp_path):
    """The documented commands on the gensim Wikipedia excerpt (shortened): pre-train (ELECTRA on a
    ModernBERT workdir's encoder), resume from the checkpoint, then fine-tune the sentiment task from
    the workdir through train.py."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[2]
    env = {**os.environ, "XLA_FLAGS": ""}

    def train(config, workdir, *flags):
        cmd = [sys.executable, str(root / "train.py"), "--config", config, "--workdir", str(workdir), *flags]
        return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1200, check=True)

    pre = tmp_path / "pre"
    flags = ["--config.checkpoint_every=20", "--config.eval_every=20", "--config.log_every=10"]
    if model == "electra":  # its first stage, ModernBERT's runlocal masked LM (docs/family.md)
        train("configs/pretrain.py:model=modernbert,runlocal", tmp_path / "mlm", "--config.num_train_steps=20", *flags)
        flags.append(f"--config.init_checkpoint={tmp_path / 'mlm'}")
    first = train(f"configs/pretrain.py:model={model},runlocal", pre, "--config.num_train_steps=20", *flags)
    if model == "electra":
        assert f"initialised from {tmp_path / 'mlm'} (encoder) at step 0" in first.stderr
    second = train(f"configs/pretrain.py:model={model},runlocal", pre, "--config.num_train_steps=30", *flags)
    assert "resumed from" in second.stderr and "at step 20" in second.stderr
    rows = read_metrics(pre, "train")
    assert [r["step"] for r in rows][-2:] == [20, 30] and np.isfinite(rows[-1]["loss"])
    train("configs/sentiment.py:runlocal", tmp_path / "ft", f"--config.init_checkpoint={pre}")
    dev = read_metrics(tmp_path / "ft", "dev")
    assert dev and 0.0 <= dev[-1]["accuracy"] <= 1.0

"""Fine-tuning end to end with the tiny model: task files → train a few steps → predictions → metric;
restoring the encoder from a pre-training workdir and from ``hf:``; every fine-tuning config builds."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx, traverse_util

from bert_jax import launch
from bert_jax.finetuning import task as fs
from bert_jax.finetuning.warm_start import open_init_checkpoint
from bert_jax.model import layer_layout
from bert_jax.model.config import BertConfig
from bert_jax.training import sharding as sh
from bert_jax.training.checkpoints import read_params
from bert_jax.training.metric_writer import read_metrics


def small(c, vocab, steps=6):
    c.vocab = str(vocab)
    c.num_train_steps = steps
    c.log_every, c.progress = 3, False
    c.model.update(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
    return c


@pytest.fixture(scope="module")
def conll(tmp_path_factory, conll_text):
    d = tmp_path_factory.mktemp("conll")
    (d / "train.txt").write_text("\n\n".join([conll_text] * 6))  # 24 sentences
    (d / "valid.txt").write_text(conll_text)
    (d / "test.txt").write_text(conll_text)
    return d


@pytest.mark.slow  # ~60 s; NER training is also covered by test_ner_from_hf_checkpoint
def test_ner_end_to_end_and_resume(conll, minilm_dir, tmp_path, load_config):
    c = small(load_config("ner", "runlocal"), minilm_dir / "vocab.txt")
    c.task.source = str(conll)
    results = launch.run(c, tmp_path)
    assert results["task"] == "conll2003" and results["init_checkpoint"] == "scratch"
    for split in ("dev", "test"):
        m = results["per_seed"][0][split]
        assert 0.0 <= m["f1"] <= 1.0 and np.isfinite(m["loss"])
    assert json.loads((tmp_path / "results.json").read_text())["per_seed"] == results["per_seed"]
    lines = (tmp_path / "predictions" / "predictions_dev.txt").read_text().splitlines()
    assert lines[0] == "-DOCSTART- O O" and lines[2].split()[:2] == ["EU", "B-ORG"]
    assert [r["step"] for r in read_metrics(tmp_path, "train")] == [3, 6]
    assert [r["step"] for r in read_metrics(tmp_path, "dev")] == [6]


@pytest.mark.slow  # ~70 s; exact resume is also covered by tests/test_trainer.py::test_resume_is_exact
def test_ner_preempted_run_resumes_exactly(conll, minilm_dir, tmp_path, monkeypatch, load_config):
    """SIGTERM at step 5 saves a checkpoint and exits; re-running finishes the same 9 steps as a
    straight run, with identical parameters."""
    import os
    import signal

    from bert_jax.finetuning import task as finetune

    def config():
        c = small(load_config("ner", "runlocal"), minilm_dir / "vocab.txt", steps=9)
        c.task.source = str(conll)
        c.model.update(hidden_dropout_prob=0.1)  # dropout keys must line up too
        return c

    launch.run(config(), tmp_path / "straight")
    original = finetune.train_batch

    def preempt(features, step, *args):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(features, step, *args)

    monkeypatch.setattr(finetune, "train_batch", preempt)
    assert launch.run(config(), tmp_path / "resumed") == {"interrupted_at_step": 5}
    monkeypatch.setattr(finetune, "train_batch", original)
    assert not (tmp_path / "resumed" / "results.json").exists()
    launch.run(config(), tmp_path / "resumed")
    a, _ = read_params(tmp_path / "straight")
    b, _ = read_params(tmp_path / "resumed")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.slow  # ~35-75 s
def test_mnli_two_seeds_predictions_and_ax(glue_dir, minilm_dir, tmp_path, load_config):
    c = small(load_config("glue", "task=mnli,runlocal"), minilm_dir / "vocab.txt", steps=3)
    c.task.source = str(glue_dir)
    c.seeds = 2
    c.predict_splits = ("test_matched", "ax")
    results = launch.run(c, tmp_path)
    assert results["seeds"] == [0, 1] and len(results["per_seed"]) == 2
    for split in ("dev_matched", "dev_mismatched"):
        s = results["summary"][split]["accuracy"]
        accs = [r[split]["accuracy"] for r in results["per_seed"]]
        assert s["n"] == 2 and s["min"] == min(accs) and s["max"] == max(accs)
        assert s["mean"] == pytest.approx(np.mean(accs))
    for seed in (0, 1):
        preds = tmp_path / f"seed_{seed}" / "predictions"
        assert sorted(p.name for p in preds.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "dev_MNLI-m.tsv", "dev_MNLI-mm.tsv"]
        lines = (preds / "AX.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) > 5
        assert all(line.split("\t")[1] in ("contradiction", "entailment", "neutral") for line in lines[1:])
    # Different seeds → different runs.
    a, _ = read_params(tmp_path / "seed_0")
    b, _ = read_params(tmp_path / "seed_1")
    assert not np.array_equal(a["classifier/dense/kernel"], b["classifier/dense/kernel"])


@pytest.mark.slow  # ~35-50 s; warm start from pre-training is also in test_warm_start_from_pretraining_workdir
def test_stsb_regression_from_pretraining_workdir(glue_dir, tmp_path, tiny_config, load_config):
    """Scratch pre-training workdir → STS-B (regression head, MSE, Pearson/Spearman)."""
    pre = tmp_path / "pre"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(
        {w for line in (glue_dir / "STS-B" / "train.tsv").read_text().lower().split() for w in [line]})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(tokens) + "\n")
    pc = tiny_config(steps=2)
    pc.model.update(vocab_size=len(tokens), max_position_embeddings=128)
    launch.run(pc, pre)
    c = small(load_config("glue", "task=stsb,runlocal"), vocab, steps=3)
    c.task.source = str(glue_dir)
    c.init_checkpoint = str(pre)
    results = launch.run(c, tmp_path / "ft")
    m = results["per_seed"][0]["dev"]
    assert {"pearson", "spearman", "score", "loss"} <= set(m)
    lines = (tmp_path / "ft" / "predictions" / "dev_STS-B.tsv").read_text().splitlines()
    assert all(0.0 <= float(x.split("\t")[1]) <= 5.0 for x in lines[1:])


# ~30 s each; 2.0, the fast suite's fine-tuning run end to end (a null answer, the threshold, scoring)
@pytest.mark.parametrize("version", ["2.0", pytest.param("1.1", marks=pytest.mark.slow)])
def test_squad_end_to_end(version, minilm_dir, tmp_path, load_config, squad_json):
    data = tmp_path / "squad"
    data.mkdir()
    train = squad_json(version)
    for k in range(3):  # enough windows for a few batches; question ids must stay unique
        extra = squad_json(version, malformed=False)
        for article in extra["data"]:
            for qa in article["paragraphs"][0]["qas"]:
                qa["id"] += f"_{k}"
        train["data"] += extra["data"]
    (data / f"train-v{version}.json").write_text(json.dumps(train))
    (data / f"dev-v{version}.json").write_text(json.dumps(squad_json(version, malformed=False)))
    c = small(load_config("squad", f"version={version},runlocal"), minilm_dir / "vocab.txt", steps=4)
    c.task.source = str(data)
    results = launch.run(c, tmp_path / "w")
    m = results["per_seed"][0]["dev"]
    preds = json.loads((tmp_path / "w" / "predictions" / "predictions.json").read_text())
    if version == "2.0":
        assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(m)
        assert set(json.loads((tmp_path / "w" / "predictions" / "null_odds.json").read_text())) == set(preds)
    else:
        assert {"exact_match", "f1"} <= set(m)
    assert set(preds) == {"q_mat", "q_year", "q_trader", "q_queen"} | ({"q_none"} if version == "2.0" else set())
    assert 0.0 <= m["f1"] <= 100.0


@pytest.fixture(scope="module")
def pretrain_workdir(tmp_path_factory, tiny_config):
    """Two steps of tiny pre-training (synthetic batches, vocabulary of 101 tokens)."""
    workdir = tmp_path_factory.mktemp("pretrain")
    launch.run(tiny_config(steps=2), workdir)
    return workdir


def _params(model) -> dict:
    return traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)), sep="/")


def test_warm_start_from_pretraining_workdir(pretrain_workdir):
    warm = open_init_checkpoint(str(pretrain_workdir))
    assert warm.config.vocab_size == 101 and warm.config.num_layers == 2
    stored, _ = read_params(pretrain_workdir)
    for kind, labels in (("classification", 3), ("tagging", 5), ("span", 2)):
        model = nnx.jit(lambda kind=kind, labels=labels: fs.make_model(warm.config, kind, labels, 1))()
        fresh = _params(model)
        untouched = warm.load_encoder(model)
        ours = layer_layout.stack(_params(model))  # checkpoints hold the stacked layout
        assert untouched and all(not k.startswith("bert/") for k in untouched)
        for k, v in ours.items():
            if k.startswith("bert/"):
                np.testing.assert_array_equal(v, stored[k], err_msg=k)
            else:  # heads keep their fresh initialisation
                np.testing.assert_array_equal(v, fresh[k], err_msg=k)
    # A step directory and orbax:WORKDIR name the same thing.
    step_dir = pretrain_workdir / "checkpoints" / "2"
    assert open_init_checkpoint(f"orbax:{step_dir}").config == warm.config


def test_warm_start_shape_mismatch_is_clear(pretrain_workdir):
    warm = open_init_checkpoint(str(pretrain_workdir))
    import dataclasses

    wrong = dataclasses.replace(warm.config, intermediate_size=64)
    model = nnx.jit(lambda: fs.make_model(wrong, "classification", 2, 0))()
    with pytest.raises(ValueError, match="intermediate|mlp|shape|checkpoint"):
        warm.load_encoder(model)


def test_warm_start_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a training workdir"):
        open_init_checkpoint(str(tmp_path))
    with pytest.raises(ValueError, match="unknown prefix 'zz:'; expected a train.py workdir"):
        open_init_checkpoint("zz:/x")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        open_init_checkpoint(f"hf:{tmp_path}/missing")


@pytest.mark.slow  # ~70 s: NER end to end; tagging's step and evaluation: tests/finetuning/test_lengths.py
def test_ner_from_hf_checkpoint(conll, minilm_dir, tmp_path, load_config):
    """The real MiniLM encoder (``hf:``) under a fresh tagging head; vocab taken from the checkpoint."""
    c = small(load_config("ner", "runlocal"), "", steps=2)
    c.vocab = ""
    c.task.source = str(conll)
    c.init_checkpoint = f"hf:{minilm_dir}"
    c.max_eval_examples = 2
    results = launch.run(c, tmp_path)
    assert results["init_checkpoint"].startswith("hf:")
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["init_checkpoint"] == f"hf:{minilm_dir}"
    stored, _ = read_params(tmp_path)
    assert stored["bert/embeddings/word_embeddings/embedding"].shape == (30522, 384)


@pytest.mark.parametrize("name,arg", [("glue", "task=mrpc"), ("glue", "task=stsb,size=large"),
                                      ("glue", "task=mnli"), ("squad", "version=1.1"),
                                      ("squad", "version=2.0"), ("ner", "")])
def test_configs_build_abstractly(name, arg, load_config):
    """Each fine-tuning config's model and optimizer state build with ShapeDtypeStructs only."""
    from bert_jax.finetuning.task import jit_finetuning_steps
    from bert_jax.resolve import resolve
    from input_pipeline.tasks import make_task

    c = resolve(load_config(name, arg), "gpu")  # "auto" as a GPU reads it: the grouped global norm
    task = make_task({**c.task.to_dict(), "source": c.task.source or "tfds"})
    cfg = BertConfig.from_size(c.model.size)
    mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])
    state = jit_finetuning_steps(c, cfg, task.kind, task.num_labels, 1000, mesh).layout.abstract  # what a run builds
    n = sum(x.size for x in jax.tree.leaves(state.params))
    assert n > (300e6 if c.model.size == "large" else 100e6)


def test_glue_ax_is_predicted_by_mnli(load_config):
    with pytest.raises(ValueError, match="task=mnli --config.predict_splits"):
        load_config("glue", "task=ax")


@pytest.mark.parametrize("kind", ["classification", "tagging"])
def test_micro_batches_give_the_whole_batch_step(kind, load_config):
    """Fine-tuning's per_device_batch (the knob pre-training has): 4 micro-batches of 2 rows take the
    same optimizer step as the batch of 8 at once, each micro-batch's loss over the whole batch's
    count (tagging: its labelled tokens, spread unevenly over the rows)."""
    from bert_jax.finetuning.task import jit_finetuning_steps
    from bert_jax.resolve import resolve

    rng = np.random.default_rng(0)
    c = load_config("ner" if kind == "tagging" else "glue", "runlocal" if kind == "tagging" else "task=sst2,runlocal")
    c.unpad_multiple = 0
    ids = rng.integers(5, 99, (8, 16))
    mask = (np.arange(16)[None] < rng.integers(4, 17, (8, 1))).astype(np.int32)
    batch = {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(ids),
             "weight": np.ones(8, np.float32)}
    if kind == "tagging":
        batch.update(label_ids=rng.integers(0, 3, (8, 16)), label_mask=mask * rng.integers(0, 2, (8, 16)))
    else:
        batch["label"] = rng.integers(0, 2, 8)
    mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])
    cfg = BertConfig.from_size("tiny", vocab_size=99, dtype="float32", hidden_dropout_prob=0.0,
                               attention_dropout_prob=0.0)  # the same function of the rows however split
    after = {}
    for per_device in (0, 2):
        c.per_device_batch = per_device
        steps = jit_finetuning_steps(resolve(c, "cpu", batch_shards=1), cfg, kind, 3, 10, mesh)
        assert steps.accumulation_steps == (4 if per_device else 1)
        state, metrics = steps.train_fn(steps.layout.create(0), {k: jax.numpy.asarray(v) for k, v in batch.items()},
                                        jax.random.key(0))
        after[per_device] = (jax.device_get(state.params), float(metrics["loss"]))
    assert after[2][1] == pytest.approx(after[0][1], rel=1e-5)
    for a, b in zip(jax.tree.leaves(after[0][0]), jax.tree.leaves(after[2][0]), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)

"""The pre-training loop on synthetic batches: outputs, exact resume, NaN stop, SIGTERM."""

import json
import os
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

from bert_jax import launch
from bert_jax.pretraining import objective
from bert_jax.resolve import described_model
from bert_jax.training.checkpoints import read_params
from bert_jax.training.metric_writer import read_metrics
from bert_jax.training.trainer import TrainingDivergedError

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tiny_config):
    workdir = tmp_path_factory.mktemp("straight")
    last = launch.run(tiny_config(), workdir)
    return workdir, last


def test_outputs(straight_run):
    workdir, last = straight_run
    written = json.loads((workdir / "config.json").read_text())
    assert written["batch_size"] == 8
    # Resolved once for this platform at the start (bert_jax/resolve.py): no "auto" left.
    assert (written["model"]["dtype"], written["model"]["scan_layers"], written["model"]["dropout_impl"],
            written["per_device_batch"], written["global_norm"]) == ("float32", "false", "fused", 0, "per_leaf")
    assert '"auto"' not in (workdir / "config.json").read_text()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]
    train = read_metrics(workdir, "train")
    assert [r["step"] for r in train] == [2, 3, 4, 6]
    for key in ("loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "grad_norm", "param_norm",
                "steps_per_sec", "examples_per_sec"):
        assert key in train[-1], key
    evals = read_metrics(workdir, "eval")
    assert [r["step"] for r in evals] == [0, 3, 6]  # step 0: the health reference
    # The fitted unigram's held-out loss: from the training batches taken, so none before step 1; no
    # fitted model beats the held-out labels' own frequencies.
    assert "mlm_unigram_cross_entropy" not in evals[0]
    assert all(r["mlm_unigram_cross_entropy"] > r["mlm_unigram_entropy"] for r in evals[1:])
    assert last["train"]["loss"] == train[-1]["loss"]
    for split, rows in (("train", train), ("eval", evals)):  # TensorBoard's scalars: metrics.jsonl's, in float32
        scalars = tensorboard_scalars(workdir / "tensorboard" / split)
        assert set(scalars) == {k for r in rows for k in r} - {"split", "step"}
        assert scalars["loss"] == [(r["step"], np.float32(r["loss"])) for r in rows]


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of the event files in ``directory``, as TensorBoard reads them (its
    scalars plugin)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(directory))
    events.Reload()
    tags = events.Tags()["tensors"]
    assert all(events.SummaryMetadata(t).plugin_data.plugin_name == "scalars" for t in tags)
    return {t: [(e.step, make_ndarray(e.tensor_proto).item()) for e in events.Tensors(t)] for t in tags}


def test_resume_is_exact(straight_run, tmp_path, tiny_config):
    """Stopped at step 3 and resumed, the run reaches the same parameters at step 6."""
    workdir, _ = straight_run
    launch.run(tiny_config(steps=3), tmp_path)
    launch.run(tiny_config(steps=6), tmp_path)  # resumes from checkpoint 3
    a, _ = read_params(workdir)
    b, _ = read_params(tmp_path)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    resumed = read_metrics(tmp_path, "train")
    assert [r["step"] for r in resumed] == [2, 3, 4, 6]
    np.testing.assert_allclose(resumed[-1]["loss"], read_metrics(workdir, "train")[-1]["loss"], rtol=1e-6)
    # Every evaluation reads the same held-out batches, so the resumed run's evaluations (its step 6
    # is its second part's first) are the uninterrupted run's (its third).
    straight_eval = {r["step"]: r for r in read_metrics(workdir, "eval")}
    resumed_eval = {r["step"]: r for r in read_metrics(tmp_path, "eval")}
    assert sorted(resumed_eval) == sorted(straight_eval) == [0, 3, 6]
    for step in (0, 3, 6):
        np.testing.assert_allclose(resumed_eval[step]["loss"], straight_eval[step]["loss"], rtol=1e-6, err_msg=step)


# ~25 s each; the checkpoint-level test (tests/model/test_layer_layout.py) has both directions fast
@pytest.mark.parametrize("first,then", [pytest.param("false", "true", marks=pytest.mark.slow),
                                        pytest.param("true", "false", marks=pytest.mark.slow)])
def test_resume_across_scan_layouts(straight_run, tmp_path, tiny_config, first, then):
    """One layout on disk: a workdir written with the blocks unrolled resumes scanned, and the
    reverse, with no flag; the restored state is the saved one bit for bit (the checkpoint's
    fingerprint is checked on restore) and the run ends where the straight run does."""
    workdir, _ = straight_run
    run = lambda steps, scan: tiny_config(steps=steps, model_overrides={"scan_layers": scan})
    launch.run(run(3, first), tmp_path)
    stored, _ = read_params(tmp_path)
    assert "bert/layers/attention/query/kernel" in stored and not any("layers/0/" in k for k in stored)
    launch.run(run(6, then), tmp_path)  # resumes from checkpoint 3
    a, _ = read_params(workdir)
    b, _ = read_params(tmp_path)
    assert a.keys() == b.keys()
    for k in a:  # a scan and unrolled blocks may round differently: the same run, not the same bits
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6, err_msg=k)


@pytest.mark.slow  # ~18 s
def test_rng_impl_picks_the_dropout_prng(straight_run, tmp_path, tiny_config):
    """config.rng_impl=rbg (XLA's RngBitGenerator for the dropout keys) trains: other dropout masks
    from the same seed, so another loss than the default threefry2x32 run's."""
    workdir, _ = straight_run
    rbg = launch.run(tiny_config(steps=2, rng_impl="rbg", eval_every=0), tmp_path)  # 2 steps, no eval: cheap
    threefry = read_metrics(workdir, "train")[0]
    assert threefry["step"] == 2 and np.isfinite(rbg["train"]["loss"]) and rbg["train"]["loss"] != threefry["loss"]


def test_nan_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch, tiny_config):
    from input_pipeline.pretraining.synthetic import SyntheticBatches

    original = SyntheticBatches.__next__

    def poisoned(self):
        batch = original(self)
        if self.index > 4:  # the 5th batch on
            batch["masked_lm_weights"] = batch["masked_lm_weights"] * np.nan
        return batch

    monkeypatch.setattr(SyntheticBatches, "__next__", poisoned)
    with pytest.raises(TrainingDivergedError, match=r"loss is nan at step 6.*last good checkpoint is step 3"):
        launch.run(tiny_config(eval_every=0), tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["3"]


def test_sigterm_saves_and_exits(tmp_path, monkeypatch, tiny_config):
    from input_pipeline.pretraining.synthetic import SyntheticBatches

    original = SyntheticBatches.__next__

    def preempt(self):
        if self.index == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives during step 2
        return original(self)

    monkeypatch.setattr(SyntheticBatches, "__next__", preempt)
    # Batches read in the loop: with prefetch the 2nd batch is read during step 1 or before it.
    launch.run(tiny_config(eval_every=0, prefetch_batches=0), tmp_path)
    steps = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == ["2"], steps
    _, where = read_params(tmp_path)
    assert where.name == "2"


@pytest.mark.slow  # ~10 s: three runs (one interrupted, its resume, a re-run of the finished one)
def test_an_evaluation_a_signal_skips_runs_on_resume(tmp_path, monkeypatch, tiny_config):
    """SIGTERM during step 3, where an evaluation is due: the run saves step 3 without evaluating
    it; the re-run evaluates step 3 before its first step, then goes on."""
    from input_pipeline.pretraining.synthetic import SyntheticBatches

    original = SyntheticBatches.__next__

    def preempt(self):
        if self.seed == 0 and self.index == 2:  # the training batches (the held-out ones have seed 7)
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while step 3 is queued
        return original(self)

    monkeypatch.setattr(SyntheticBatches, "__next__", preempt)
    config = tiny_config(prefetch_batches=0)  # evaluation and checkpoints every 3 steps, 6 steps
    assert launch.run(config, tmp_path) == {"interrupted_at_step": 3}
    assert [r["step"] for r in read_metrics(tmp_path, "eval")] == [0]
    monkeypatch.setattr(SyntheticBatches, "__next__", original)
    launch.run(config, tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path, "eval")] == [0, 3, 6]
    launch.run(config, tmp_path)  # finished: its last evaluation is recorded, none is repeated
    assert [r["step"] for r in read_metrics(tmp_path, "eval")] == [0, 3, 6]


def test_every_config_builds_abstractly(load_config):
    """Each shipped pre-training configuration builds its model and optimizer state abstractly."""
    from bert_jax.resolve import resolve
    from bert_jax.training import sharding as sh

    mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])
    for arg in ("size=base", "size=large,phase=2", "size=tiny,runlocal", "size=base,objective=sop",
                "size=large,recipe=lamb,phase=1", "size=large,recipe=lamb,phase=2",
                "size=small,objective=none,masking=dynamic", "model=roberta", "model=albert,size=large",
                "model=electra", "model=electra,size=base"):
        c = resolve(load_config("pretrain", arg), "cpu", batch_shards=1)  # as a job resolves it
        abstract = objective.jit_pretraining_steps(c, described_model(c.model, vocab_size=30522), mesh).layout.abstract
        assert abstract.params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape[0] == 30522
    with pytest.raises(ValueError, match="phase=3"):
        load_config("pretrain", "phase=3")
    with pytest.raises(ValueError, match="size='tiny' for model=albert"):
        load_config("pretrain", "model=albert,size=tiny")
    with pytest.raises(ValueError, match="model='xlnet'"):
        load_config("pretrain", "model=xlnet")


def test_electra_settings_name_a_bad_prior(load_config):
    c = load_config("pretrain", "model=electra")
    assert objective.electra_settings(c) == {"generator_fraction": 0.25, "rtd_weight": 50.0, "rtd_prior": 0.0,
                                             "tie_embeddings": True}
    assert not objective.electra_settings(load_config("pretrain", "model=electra,runlocal"))["tie_embeddings"]
    c.electra.rtd_prior = 0.15
    assert objective.electra_settings(c)["rtd_prior"] == 0.15
    c.electra.rtd_prior = 1.5
    with pytest.raises(ValueError, match=r"config.electra.rtd_prior=1.5: expected 0 .* in \(0, 1\)"):
        objective.electra_settings(c)


@pytest.mark.slow
def test_train_py_runlocal_trains_checkpoints_and_resumes(tmp_path):
    """The issue's command on the gensim Wikipedia excerpt (shortened): the loss falls, checkpoints
    and TensorBoard events appear, and a second invocation resumes from the latest checkpoint."""
    import subprocess
    import sys

    def train(steps):
        cmd = [sys.executable, str(ROOT / "train.py"), "--config", "configs/pretrain.py:size=tiny,runlocal",
               "--workdir", str(tmp_path), f"--config.num_train_steps={steps}", "--config.checkpoint_every=40",
               "--config.eval_every=40"]
        env = {**os.environ, "XLA_FLAGS": ""}
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=True)

    train(80)
    rows = read_metrics(tmp_path, "train")
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0, [r["loss"] for r in rows]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["40", "80"]
    assert list((tmp_path / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert list((tmp_path / "tensorboard" / "eval").glob("events.out.tfevents.*"))
    second = train(100)
    assert "resumed from" in second.stderr and "at step 80" in second.stderr
    assert [r["step"] for r in read_metrics(tmp_path, "train")][-2:] == [80, 100]

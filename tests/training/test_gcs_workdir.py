"""``--workdir gs://...`` for real, against a local GCS emulator (tests/fixtures/gcs_emulator.py:
fake-gcs-server on 127.0.0.1; TensorStore, tf.io.gfile/etils.epath, TensorBoard's writer and
google-cloud-storage all pointed at it): the trainer's lock, config.json, metrics.jsonl, TensorBoard
events and Orbax checkpoints land in the bucket; a run preempted there resumes to the numbers of an
uninterrupted run; a second trainer is refused; fine-tuning warm-starts from the bucket."""

import json
import os
import signal
import sys
import time

import numpy as np
import pytest

from bert_jax import launch
from bert_jax.training.checkpoints import as_path, read_params
from bert_jax.training.metric_writer import read_metrics
from bert_jax.training.workdir_lock import WorkdirBusyError, WorkdirLock


def _config(tiny_config, steps):
    return tiny_config(steps=steps, eval_every=0, prefetch_batches=0)  # prefetch 0: SIGTERM lands in step 2


@pytest.fixture(scope="module")
def straight_local(tmp_path_factory, tiny_config):
    """The uninterrupted run, on local disk."""
    workdir = tmp_path_factory.mktemp("straight")
    launch.run(_config(tiny_config, 6), workdir)
    return workdir


def _steps(objects: list[str]) -> list[str]:
    return sorted({name.split("/")[1] for name in objects if name.startswith("checkpoints/") and name.count("/") > 1})


@pytest.fixture(scope="module")
def bucket_workdir(gcs_emulator, straight_local, tiny_config):
    """``gs://bert-runs/tiny``: a run preempted (SIGTERM during step 2), a second trainer started
    while the lock is held (by this process), the run resumed to step 6. Returns the workdir and
    what was seen along the way."""
    from input_pipeline.pretraining.synthetic import SyntheticBatches

    workdir = gcs_emulator.create_bucket("bert-runs") + "/tiny"
    seen = {}
    original = SyntheticBatches.__next__

    def preempt(self):
        if self.index == 1:  # step 2 is next: the trainer is running, its lock in the bucket
            seen["running"] = gcs_emulator.list(workdir)
            seen["lock"] = json.loads((as_path(workdir) / "LOCK").read_text())
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice: save at step 2 and exit
        return original(self)

    with pytest.MonkeyPatch.context() as m:
        for name, value in gcs_emulator.env.items():
            m.setenv(name, value)
        m.setattr(SyntheticBatches, "__next__", preempt)
        launch.run(_config(tiny_config, 6), workdir)
        m.setattr(SyntheticBatches, "__next__", original)
        seen["preempted"] = gcs_emulator.list(workdir)
        seen["preempted_metrics"] = read_metrics(workdir, "train")
        seen["refused"] = "(not refused: the second trainer ran)"
        with WorkdirLock(workdir):
            try:
                launch.run(_config(tiny_config, 6), workdir)
            except WorkdirBusyError as e:
                seen["refused"] = str(e)
            seen["after_refusal"] = gcs_emulator.list(workdir)
        launch.run(_config(tiny_config, 6), workdir)  # resumes from the bucket's step 2
    seen["resumed"] = gcs_emulator.list(workdir)
    return workdir, seen


def test_the_job_writes_into_the_bucket(bucket_workdir):
    workdir, seen = bucket_workdir
    assert {"LOCK", "config.json"} <= set(seen["running"]), seen["running"]
    assert seen["lock"]["pid"] == os.getpid()
    objects = seen["resumed"]
    assert "LOCK" not in seen["preempted"] and "LOCK" not in objects  # released on the way out
    assert any(n.startswith("tensorboard/train/events.out.tfevents.") for n in objects), objects
    assert "metrics.jsonl" in objects and "metrics.jsonl.tmp" not in objects
    assert _steps(objects) == ["2", "3", "6"], objects
    assert all(f"checkpoints/{s}/commit_success.txt" in objects for s in ("2", "3", "6"))


def test_a_preempted_run_resumes_exactly(bucket_workdir, straight_local, gcs_env):
    workdir, seen = bucket_workdir
    assert _steps(seen["preempted"]) == ["2"], seen["preempted"]  # the preemption's save
    assert [r["step"] for r in seen["preempted_metrics"]] == [2]
    a, where = read_params(workdir)
    b, _ = read_params(straight_local)
    assert str(where) == f"{workdir}/checkpoints/6" and a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    resumed, straight = read_metrics(workdir, "train"), read_metrics(straight_local, "train")
    assert [r["step"] for r in resumed] == [r["step"] for r in straight] == [2, 3, 4, 6]
    np.testing.assert_array_equal([r["loss"] for r in resumed], [r["loss"] for r in straight])
    assert json.loads((as_path(workdir) / "config.json").read_text())["batch_size"] == 8


def test_a_second_trainer_is_refused(bucket_workdir):
    workdir, seen = bucket_workdir
    assert seen["refused"].startswith(f"{workdir} is in use by another trainer (pid {os.getpid()} on ")
    assert seen["after_refusal"] == sorted(seen["preempted"] + ["LOCK"])  # the holder's lock; nothing written


def test_finetuning_warm_starts_from_the_bucket(bucket_workdir, gcs_env):
    from flax import nnx, traverse_util

    from bert_jax.finetuning import task as fs
    from bert_jax.finetuning.warm_start import open_init_checkpoint
    from bert_jax.model import layer_layout

    workdir, _ = bucket_workdir
    warm = open_init_checkpoint(workdir)
    assert warm.config.vocab_size == 101
    stored, _ = read_params(workdir)
    model = nnx.jit(lambda: fs.make_model(warm.config, "classification", 3, 1))()
    untouched = warm.load_encoder(model)
    ours = layer_layout.stack(traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)), sep="/"))
    assert untouched and all(not k.startswith("bert/") for k in untouched)
    for k, v in ours.items():
        if k.startswith("bert/"):
            np.testing.assert_array_equal(v, stored[k], err_msg=k)


def test_shards_written_to_and_read_from_the_bucket(gcs_env, pretraining_data, pretraining_config,
                                                    assert_batches_equal):
    """create_pretraining_data --output gs://... (the vocabulary read from the bucket too) writes the
    local tool's bytes there; training reads them (tf.data over gs:// files), batch for batch the
    local input."""
    import tensorflow as tf

    from input_pipeline import create_pretraining_data as cpd
    from input_pipeline.pretraining.dataset import make_pretraining_dataset

    data = gcs_env.create_bucket("bert-data") + "/p1"
    gcs_env.upload(pretraining_data / "vocab.txt", f"{data}/vocab.txt")
    cpd.create_pretraining_data(str(pretraining_data / "corpus" / "*.txt"), f"{data}/static", f"{data}/vocab.txt",
                                max_seq_length=32, max_predictions_per_seq=5, num_shards=4, random_seed=3,
                                masking="static", dupe_factor=2, progress=False)  # the fixture's static shards
    names = sorted(gcs_env.list(f"{data}/static"))
    assert names == sorted(p.name for p in (pretraining_data / "static").iterdir())
    for name in names:
        if name.startswith("pretrain-"):
            with tf.io.gfile.GFile(f"{data}/static/{name}", "rb") as f:
                assert f.read() == (pretraining_data / "static" / name).read_bytes(), name
    local = pretraining_config(pretraining_data, pretraining_data / "static", "static")
    remote = pretraining_config(pretraining_data, f"{data}/static", "static", vocab=f"{data}/vocab.txt")

    def batches(config, n=6):
        ds = make_pretraining_dataset(config, batch_size=4)
        return [next(ds) for _ in range(n)]

    assert_batches_equal(batches(remote), batches(local))


def test_a_bucket_without_google_cloud_storage_is_one_clear_error(monkeypatch):
    """Orbax needs google-cloud-storage for gs:// checkpoint directories; without it the trainer
    says so in one line (no emulator needed: nothing is read)."""
    from bert_jax.training.checkpoints import Checkpointer
    from input_pipeline.command_line import UserError

    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # import fails
    with pytest.raises(UserError, match=r"^gs://b/run/checkpoints: checkpoints in a gs:// bucket need the "
                                        r"google-cloud-storage package .*: pip install google-cloud-storage$"):
        Checkpointer("gs://b/run")


@pytest.mark.slow  # ~65 s: a pre-training and a fine-tuning job, both in the bucket
def test_finetuning_job_in_the_bucket(gcs_env, glue_dir, tmp_path, tiny_config, load_config):
    """Pre-training and then STS-B fine-tuning with every path in the bucket (workdirs, the
    vocabulary, init_checkpoint): results.json and the prediction files land there."""
    root = gcs_env.create_bucket("bert-ft")
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(
        set((glue_dir / "STS-B" / "train.tsv").read_text().lower().split()))
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    gcs_env.upload(tmp_path / "vocab.txt", f"{root}/vocab.txt")
    pc = tiny_config(steps=2)
    pc.model.update(vocab_size=len(tokens), max_position_embeddings=128)
    launch.run(pc, f"{root}/pre")
    c = load_config("glue", "task=stsb,runlocal")
    c.vocab, c.init_checkpoint, c.task.source = f"{root}/vocab.txt", f"{root}/pre", str(glue_dir)
    c.num_train_steps, c.log_every, c.progress = 3, 3, False
    results = launch.run(c, f"{root}/ft")
    assert {"pearson", "spearman", "loss"} <= set(results["per_seed"][0]["dev"])
    objects = gcs_env.list(f"{root}/ft")
    assert {"results.json", "config.json", "metrics.jsonl", "predictions/dev_STS-B.tsv"} <= set(objects), objects
    assert "LOCK" not in objects and not any(n.endswith(".tmp") for n in objects)
    written = json.loads((as_path(root) / "ft" / "results.json").read_text())
    assert written["init_checkpoint"] == f"{root}/pre" and written["per_seed"] == results["per_seed"]
    lines = (as_path(root) / "ft" / "predictions" / "dev_STS-B.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) > 1


@pytest.mark.slow  # ~2 min: three train.py processes (tests/fixtures/fault_runs.py's job, 80 steps)
def test_killed_train_py_in_a_bucket_resumes_exactly(gcs_env, fault_env, tmp_path):
    """``train.py --workdir gs://...`` killed (SIGKILL) while the checkpoint of step 20 is being
    written to the bucket (no commit_success.txt yet), then run again: it takes over the dead
    trainer's lock, resumes from the last committed checkpoint (10), writes step 20 again over the
    partial one, and ends with the uninterrupted run's losses and final state."""
    from bert_jax.training.checkpoints import Checkpointer
    from tests.fixtures.fault_runs import STEPS, final_fingerprint, losses, train

    env = {**fault_env, **gcs_env.env}
    straight = tmp_path / "straight"
    run = train(straight, env)
    assert run.finish() == 0, run.log[-3000:]
    workdir = gcs_env.create_bucket("bert-kill") + "/run"
    run = train(workdir, env)
    assert run.wait_for(r"^step 20/") is not None, run.log[-3000:]
    deadline = time.time() + 10
    while time.time() < deadline and not any(n.startswith("checkpoints/20/") for n in gcs_env.list(workdir)):
        time.sleep(0.01)  # until the save of step 20 has begun writing
    run.proc.send_signal(signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL
    left = gcs_env.list(workdir)
    assert "LOCK" in left  # a dead trainer's
    committed = Checkpointer(workdir, async_save=False).committed_steps()
    assert committed and max(committed) <= 20, committed
    partial = sorted({n.split("/")[1] for n in left if n.startswith("checkpoints/") and n.count("/") > 1}
                     - {str(s) for s in committed})
    print("killed after step 20: committed", committed, "partly written", partial)
    assert partial == ["20"] or committed[-1] == 20, (committed, partial)  # cut off, or (rarely) just done
    run = train(workdir, env)
    assert run.finish() == 0, run.log[-3000:]
    assert "taking over the lock of a trainer that is gone" in run.log
    assert f"at step {max(committed)}" in run.log, run.log[-3000:]

    def bucket_losses():
        rows = [json.loads(line) for line in (as_path(workdir) / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}  # a step logged twice: the last

    expected, got = losses(straight), bucket_losses()
    assert sorted(got) == sorted(expected) and all(got[s] == expected[s] for s in expected)
    meta = json.loads((as_path(workdir) / "checkpoints" / str(STEPS) / "meta" / "metadata").read_text())
    assert meta["fingerprint"] == final_fingerprint(straight, STEPS)
    assert "LOCK" not in gcs_env.list(workdir)

"""Several JAX processes on this machine, the longer runs (see test_multiprocess.py): four processes
give one process's losses; with TFRecord shards of different sizes the processes' input positions
differ and each resumes its own; SIGTERM on one process stops every process at one step."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.fixtures.multiprocess import run_processes
from tests.fixtures.multiprocess_job import JOB, STEPS, metrics


@pytest.mark.slow  # ~55 s on 2 cores
def test_four_processes_give_one_process_losses(multiprocess_corpus, tmp_path):
    runs = {name: run_processes(JOB, n, dict(corpus=str(multiprocess_corpus), workdir=str(tmp_path / name)),
                                log_dir=tmp_path / f"logs_{name}", devices_per_process=4 // n)
            for name, n in (("one", 1), ("four", 4))}
    a, b = metrics(tmp_path / "one"), metrics(tmp_path / "four")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=0, atol=1e-5)
    for step in range(STEPS):
        rows = [r.value["fed"][step] for r in runs["four"]]
        assert sum(rows, []) == runs["one"][0].value["fed"][step]  # process i: rows [2i, 2i + 2)


@pytest.mark.slow  # ~35 s on 2 cores
def test_uneven_shards_resume_each_process_position(multiprocess_corpus, tmp_path):
    """Two TFRecord shards of 69 and 32 examples, one per process (4 rows a step each): process 1
    starts its second epoch at step 9, so at step 10 the two positions differ; resumed there, each
    process continues its own stream exactly."""
    from bert_jax.training.checkpoints import Checkpointer, read_params
    from input_pipeline import create_pretraining_data as cpd
    from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(multiprocess_corpus / "vocab.txt")
    cpd.create_pretraining_data(f"{multiprocess_corpus}/text/*.txt", str(tmp_path / "shards"), tokenizer,
                                masking="none", dupe_factor=1, max_seq_length=32, max_predictions_per_seq=5,
                                num_shards=2, random_seed=3, progress=False)
    overrides = {"data.input": str(tmp_path / "shards"), "data.eval_fraction": 0.0, "eval_every": 0,
                 "checkpoint_every": 5, "optimizer.num_train_steps": 16}
    straight = run_processes(JOB, 2, dict(corpus=str(multiprocess_corpus), workdir=str(tmp_path / "straight"), steps=12,
                                          overrides=overrides), log_dir=tmp_path / "logs_straight")
    ckpt = Checkpointer(tmp_path / "straight", async_save=False)
    try:
        assert ckpt.read_meta(10)["data_per_process"] == [{"kind": "pretraining", "epoch": 0, "batch": 10},
                                                          {"kind": "pretraining", "epoch": 1, "batch": 2}]
    finally:
        ckpt.close()
    shutil.copytree(tmp_path / "straight" / "checkpoints" / "10", tmp_path / "resumed" / "checkpoints" / "10")
    resumed = run_processes(JOB, 2, dict(corpus=str(multiprocess_corpus), workdir=str(tmp_path / "resumed"), steps=12,
                                         overrides=overrides), log_dir=tmp_path / "logs_resumed")
    for p in (0, 1):
        assert resumed[p].value["fed"][:2] == straight[p].value["fed"][10:12]
    assert not set(sum(straight[0].value["fed"], [])) & set(sum(straight[1].value["fed"], []))  # own files
    np.testing.assert_array_equal([r["loss"] for r in metrics(tmp_path / "resumed")],
                                  [r["loss"] for r in metrics(tmp_path / "straight")][10:])
    a, _ = read_params(tmp_path / "straight")
    b, _ = read_params(tmp_path / "resumed")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.slow  # ~20 s on 2 cores
def test_preemption_of_one_process_stops_every_process_at_one_step(multiprocess_corpus, tmp_path):
    """SIGTERM reaches process 1 only (as a pod's hosts get it at different times): JAX's
    preemption service makes both stop after the same step, which both save; both exit normally."""
    from bert_jax.training.checkpoints import Checkpointer

    results = run_processes(JOB, 2, dict(corpus=str(multiprocess_corpus), workdir=str(tmp_path / "w"), steps=40,
                                         die=(1, 2, "SIGTERM"), overrides={"eval_every": 0, "prefetch_batches": 0,
                                                                           "checkpoint_every": 100}),
                            log_dir=tmp_path / "logs")
    ckpt = Checkpointer(tmp_path / "w", async_save=False)
    try:
        stopped = ckpt.latest_step()
    finally:
        ckpt.close()
    assert stopped is not None and 3 <= stopped < 40
    assert [len(r.value["fed"]) for r in results] == [stopped] * 2
    assert metrics(tmp_path / "w")[-1]["step"] == stopped
    for r in results:
        assert f"SIGTERM received: saved a checkpoint at step {stopped}; exiting" in r.log

"""The multi-host path run for real: several JAX processes on this machine (tests/fixtures/multiprocess*.py),
each with 2 fake CPU devices, joined by ``config.multihost`` / ``config.distributed`` (gloo
collectives across processes), pre-training the tiny model on a small text corpus (in memory,
dynamic masking) and fine-tuning it on GLUE RTE files.

One process × 4 devices and two processes × 2 devices (same mesh, same global batch) give the same
losses, each process feeding its own rows; a checkpoint written by two processes resumes exactly in
two processes, restores into one process on another mesh and warm-starts fine-tuning; fine-tuning
evaluation gathers every process's predictions; a killed process stops the others (slow ones:
test_multiprocess_slow.py).
"""

from __future__ import annotations

import json
import shutil
import signal

import numpy as np
import pytest

from tests.fixtures.multiprocess import run_processes
from tests.fixtures.multiprocess_job import JOB, STEPS, metrics, pretrain_config


@pytest.mark.slow  # 120-180 s on 2 cores, a quarter of the fast suite's budget: make test-all runs it
def test_two_processes(multiprocess_corpus, glue_dir, tmp_path):
    """One process × 4 devices, then two processes × 2 devices (both pre-train 4 steps, then
    fine-tune RTE from their checkpoint), then two processes resuming the second run from its
    checkpoint at step 2, in which process 1 kills itself at step 7. One test, not five: the runs
    build on each other, and a module fixture would run them on every xdist worker."""
    corpus, glue = multiprocess_corpus, glue_dir
    runs = {}
    for name, n in (("one", 1), ("two", 2)):
        runs[name] = run_processes(JOB, n, dict(corpus=str(corpus), workdir=str(tmp_path / name), glue=str(glue)),
                                   log_dir=tmp_path / f"logs_{name}", devices_per_process=4 // n)
    (tmp_path / "resumed").mkdir()
    shutil.copytree(tmp_path / "two" / "checkpoints" / "2", tmp_path / "resumed" / "checkpoints" / "2")
    runs["resumed"] = run_processes(JOB, 2, dict(corpus=str(corpus), workdir=str(tmp_path / "resumed"), steps=8,
                                                 die=(1, 4), overrides={"eval_every": 0, "prefetch_batches": 0}),
                                    log_dir=tmp_path / "logs_resumed", devices_per_process=2, check=False)
    check_same_losses_and_own_rows(tmp_path, runs)
    check_exact_resume(tmp_path, runs)
    check_restore_on_another_mesh_and_warm_start(tmp_path / "two", corpus)
    check_finetuning_gathers_every_process(tmp_path, runs)
    check_killed_process_stops_the_others(tmp_path, runs["resumed"])


def check_same_losses_and_own_rows(root, runs):
    """Same global batches, same mesh shape: the same losses within 1e-5, eval included; each
    process fed its own half of every global batch."""
    one, two = runs["one"], runs["two"]
    assert [(r.value["process"], r.value["processes"], r.value["devices"]) for r in two] == [(0, 2, 4), (1, 2, 4)]
    a, b = metrics(root / "one"), metrics(root / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=0, atol=1e-5)
    ea, eb = metrics(root / "one", "eval"), metrics(root / "two", "eval")
    assert [r["step"] for r in eb] == [0, STEPS]  # step 0: the representation-health reference
    np.testing.assert_allclose([r["loss"] for r in eb], [r["loss"] for r in ea], rtol=0, atol=1e-5)
    for step in range(STEPS):
        first, second = two[0].value["fed"][step], two[1].value["fed"][step]
        assert len(first) == len(second) == 4 and not set(first) & set(second)
        assert first + second == one[0].value["fed"][step]  # process i: rows [4i, 4i + 4)


def check_exact_resume(root, runs):
    """From the two-process checkpoint at step 2 each process restores its own input position and
    feeds the rows it fed in the uninterrupted run: the same losses and parameters at step 4."""
    from bert_jax.training.checkpoints import Checkpointer, read_params

    two, resumed = runs["two"], runs["resumed"]
    ckpt = Checkpointer(root / "two", async_save=False)
    try:
        assert ckpt.read_meta(2)["data_per_process"] == [{"kind": "pretraining", "epoch": 0, "batch": 2}] * 2
    finally:
        ckpt.close()
    for p in (0, 1):
        assert resumed[p].value is None  # it did not finish: see check_killed_process_stops_the_others
    fed = [json.loads((root / f"resumed.fed{p}.json").read_text()) for p in (0, 1)]
    for p in (0, 1):
        assert fed[p][:2] == two[p].value["fed"][2:4]
    steps = [r["step"] for r in metrics(root / "resumed")]
    assert steps[:4] == [3, 4, 5, 6]
    np.testing.assert_array_equal([r["loss"] for r in metrics(root / "resumed")][:2],
                                  [r["loss"] for r in metrics(root / "two")][2:])
    a, _ = read_params(root / "two" / "checkpoints" / "4")
    b, _ = read_params(root / "resumed" / "checkpoints" / "4")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def check_restore_on_another_mesh_and_warm_start(workdir, corpus):
    """This process (8 devices, FSDP over all of them) restores the state two processes wrote on
    their data-parallel mesh; fine-tuning's warm start reads its encoder."""
    import jax
    from flax import nnx, traverse_util

    from bert_jax.finetuning import task as fs
    from bert_jax.finetuning.warm_start import open_init_checkpoint
    from bert_jax.model import layer_layout
    from bert_jax.pretraining import objective
    from bert_jax.training import sharding as sh
    from bert_jax.training import trainer
    from bert_jax.training.checkpoints import Checkpointer, read_params

    config = pretrain_config(str(corpus), STEPS)
    config.mesh_shape = (1, 8, 1)
    config = trainer.resolved(config)  # as a job resolves it
    warm = open_init_checkpoint(str(workdir))
    steps = objective.jit_pretraining_steps(config, warm.config, sh.make_mesh(config.mesh_shape))
    ckpt = Checkpointer(workdir, async_save=False)
    try:
        state, _ = ckpt.restore(steps.layout.target())
    finally:
        ckpt.close()
    stored, _ = read_params(workdir)
    in_model = traverse_util.flatten_dict(state.params, sep="/")  # the model's layout (unrolled on the CPU)
    embedding = in_model["bert/embeddings/word_embeddings/embedding"]
    assert embedding.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
    restored = layer_layout.stack({k: np.asarray(v) for k, v in in_model.items()})  # checkpoints: stacked
    assert int(state.step) == STEPS and restored.keys() == stored.keys()
    for k, v in restored.items():
        np.testing.assert_array_equal(np.asarray(v), stored[k], err_msg=k)
    model = fs.make_model(warm.config, "classification", 2, 0)
    fresh = warm.load_encoder(model)
    assert fresh and all(not k.startswith("bert/") for k in fresh)
    loaded = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)), sep="/")
    encoder = [k for k in loaded if k.startswith("bert/")]
    assert len(encoder) > 10
    loaded = layer_layout.stack({k: np.asarray(loaded[k]) for k in encoder})
    for k in loaded:
        np.testing.assert_array_equal(loaded[k], stored[k], err_msg=k)


def check_finetuning_gathers_every_process(root, runs):
    """Fine-tuning RTE from each run's pre-training checkpoint: each of two processes has the
    outputs of every dev row (the eval batch of 16 rows, 4 of them padding, is split over 4 devices
    in 2 processes), the one-process outputs, and the same metric; process 0 writes the same
    predictions file."""
    one, two = runs["one"][0].value["finetune"], [r.value["finetune"] for r in runs["two"]]
    assert two[0] == two[1]  # every process computed the metric over every row
    reference = runs["one"][0].value["finetune_outputs"]
    logits = np.asarray(reference["logits"])
    assert logits.shape == (12, 2) and len(np.unique(logits.round(4), axis=0)) == 12  # rows that differ
    for r in runs["two"]:
        outputs = r.value["finetune_outputs"]
        assert outputs.keys() == reference.keys()
        for k in outputs:
            np.testing.assert_allclose(outputs[k], reference[k], rtol=0, atol=1e-5, err_msg=k)
    a, b = one["per_seed"][0]["dev"], two[0]["per_seed"][0]["dev"]
    assert a.keys() == b.keys() and a["accuracy"] == b["accuracy"]
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=0, atol=1e-5)
    preds = [(root / f"{name}_finetune" / "predictions" / "dev_RTE.tsv").read_text() for name in ("one", "two")]
    assert preds[0] == preds[1] and len(preds[0].splitlines()) == 13
    assert json.loads((root / "two_finetune" / "results.json").read_text())["per_seed"] == two[0]["per_seed"]


def check_killed_process_stops_the_others(root, resumed):
    """Process 1 SIGKILLed itself when asked for step 7's batch: process 0, waiting for it inside
    step 7, exits with JAX's error naming the dead process within the heartbeat timeout (10 s
    here) and a few seconds; the newest complete checkpoint (6, or 4 if 6 was cut short) restores."""
    from bert_jax.training.checkpoints import Checkpointer, read_params

    assert resumed[1].returncode == -signal.SIGKILL, resumed[1].tail()
    assert resumed[0].returncode not in (0, None), resumed[0].tail()
    assert "stopped sending heartbeats" in resumed[0].log and "another task died" in resumed[0].log
    assert resumed[0].seconds - resumed[1].seconds < 40, (resumed[0].seconds, resumed[1].seconds)
    ckpt = Checkpointer(root / "resumed", async_save=False)
    try:
        latest = ckpt.latest_step()
    finally:
        ckpt.close()
    assert latest in (4, 6)
    assert read_params(root / "resumed")[1].name == str(latest)


def test_distributed_config_is_checked():
    import ml_collections

    from bert_jax.training import distributed

    c = ml_collections.ConfigDict({"multihost": True, "distributed": distributed.default_config()})
    c.distributed.update(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=2)
    with pytest.raises(ValueError, match=r"config.distributed.process_id=2 is not in \[0, num_processes=2\)"):
        distributed.initialize(c)
    assert [distributed._is_loopback(a) for a in ("127.0.0.1:80", "localhost:80", "[::1]:80", "10.0.0.1:80",
                                                   "host-0:80")] == [True, True, True, False, False]


def test_mesh_that_gives_a_process_other_rows_is_refused(monkeypatch):
    """As if these 8 devices were one of two processes: with the batch on every device of the
    process the rows are not its half of the batch."""
    import jax

    from bert_jax.training import sharding as sh
    from bert_jax.training.sharding_rules import DEFAULT_RULES

    mesh = sh.make_mesh((1, 1, 8))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"devices hold 16 batch rows from 0 of 16, not one block of 8 rows"):
        sh.process_block(mesh, DEFAULT_RULES, 16)
    with pytest.raises(ValueError, match="batch_size 15 is not divisible by 2 processes"):
        sh.process_block(mesh, DEFAULT_RULES, 15)

"""A checkpoint that will not restore: a flipped byte (which tensorstore restores silently) is caught
by the fingerprint, a truncated file by tensorstore; both name the step and the fall-back;
``restore="previous"`` picks the one before and sets the newer ones aside."""

from pathlib import Path

import jax
import numpy as np
import pytest

from bert_jax.training.checkpoints import Checkpointer, CheckpointRestoreError, fingerprint


def _state(step: int) -> dict:
    return {"step": np.int32(step), "params": {"w": np.arange(65536, dtype=np.float32) * step,
                                               "b": np.ones([3], np.float32)}}


@pytest.fixture
def two_checkpoints(tmp_path) -> Checkpointer:
    ckpt = Checkpointer(tmp_path, async_save=False)
    for step in (1, 2):
        ckpt.save(step, jax.tree.map(jax.numpy.asarray, _state(step)), {"step": step})
    yield ckpt
    ckpt.close()


def _target():
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))


def _largest_data_file(step_dir: Path) -> Path:
    return max((p for p in Path(step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
               key=lambda p: p.stat().st_size)


def test_fingerprint_does_not_depend_on_sharding():
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((8,), ("x",))
    state = _state(3)
    sharded = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
    sharded["params"]["w"] = jax.device_put(state["params"]["w"], NamedSharding(mesh, PartitionSpec("x")))
    assert fingerprint(sharded) == fingerprint(jax.tree.map(jax.numpy.asarray, state))
    changed = _state(3)  # a new buffer: device_put may alias the numpy arrays above
    changed["params"]["w"][7] = np.nextafter(changed["params"]["w"][7], np.float32(1e9))  # one bit
    assert fingerprint(changed)["params/w"] != fingerprint(state)["params/w"]


def test_flipped_byte_is_caught_and_previous_restores(two_checkpoints):
    ckpt = two_checkpoints
    data = _largest_data_file(ckpt.directory / "2")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointRestoreError, match=r"checkpoints/2: cannot restore the checkpoint of step 2: "
                       r"1 arrays differ from what was saved \(fingerprint\), first params/w\. "
                       r"--config.restore=previous resumes from step 1"):
        ckpt.restore(_target(), 2)
    assert ckpt.restore_step("previous") == 1 and ckpt.restore_step("2") == 2 and ckpt.restore_step() == 2
    state, meta = ckpt.restore(_target(), 1)
    np.testing.assert_array_equal(state["params"]["w"], _state(1)["params"]["w"])
    ckpt.set_aside_after(1)
    assert ckpt.restore_step() == 1 and ckpt.committed_steps() == [1]
    assert [p.name.split(".")[0] for p in (ckpt.directory.parent / "checkpoints_set_aside").iterdir()] == ["2"]


def test_truncated_file_names_the_step(two_checkpoints):
    ckpt = two_checkpoints
    data = _largest_data_file(ckpt.directory / "2")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(CheckpointRestoreError, match=r"checkpoints/2: cannot restore the checkpoint of step 2: "
                       r".*--config.restore=previous resumes from step 1") as e:
        ckpt.restore(_target(), 2)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"--config.restore=7: expected 'latest', 'previous' .* holds steps \[1, 2\]"):
        ckpt.restore_step(7)


def test_reads_abandoned_by_a_failed_restore_are_quiet(monkeypatch):
    """After a restore fails part-way, TensorStore's reads still in flight complete into Orbax's closed
    event loop, each an "Event loop is closed" RuntimeError through `sys.unraisablehook` (a screenful of
    tracebacks after the error line): from then on those alone are dropped."""
    import asyncio
    import sys
    import types

    from bert_jax.training import checkpoints

    loop = asyncio.new_event_loop()
    loop.close()

    def unraisable(call):
        try:
            call()
        except Exception as e:  # noqa: BLE001
            return types.SimpleNamespace(exc_type=type(e), exc_value=e, exc_traceback=e.__traceback__,
                                         err_msg=None, object=None)

    closed = unraisable(lambda: loop.call_soon_threadsafe(print))  # what TensorStore's callback meets
    other = unraisable(lambda: 1 / 0)
    elsewhere = unraisable(lambda: (_ for _ in ()).throw(RuntimeError("Event loop is closed")))  # not asyncio's
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    checkpoints._quiet_abandoned_reads()
    checkpoints._quiet_abandoned_reads()  # wrapped once
    for args in (closed, other, elsewhere):
        sys.unraisablehook(args)
    assert seen == [other, elsewhere]


def test_an_array_of_another_shape_is_named_before_any_read(two_checkpoints, monkeypatch):
    """The checkpoint's metadata alone shows that it does not fit: nothing is read (no reads to abandon)."""
    target = _target()
    target["params"]["b"] = jax.ShapeDtypeStruct((4,), np.float32)
    monkeypatch.setattr(two_checkpoints.manager, "restore", lambda *a, **k: pytest.fail("an array was read"))
    with pytest.raises(CheckpointRestoreError, match=r"checkpoints/2: cannot restore the checkpoint of step 2: does "
                       r"not fit this model/optimizer: params/b is \[3\] in the checkpoint, \[4\] here\. "
                       r"--config.restore=previous resumes from step 1"):
        two_checkpoints.restore(target, 2)


def test_a_checkpoint_of_another_model_is_named_by_its_fields(tmp_path):
    """`restore` compares the checkpoint's record of its model with the run's before reading the state:
    the fields that differ, old → new; how the model runs (dtype, scan, remat) and dropout may change."""
    import dataclasses

    from bert_jax.model.config import BertConfig
    from bert_jax.training.trainer import model_changes, restore

    tiny = BertConfig.from_size("tiny")
    ckpt = Checkpointer(tmp_path, async_save=False)
    try:
        ckpt.save(1, jax.tree.map(jax.numpy.asarray, _state(1)), {"step": 1, "model": dataclasses.asdict(tiny)})
        other = dataclasses.replace(tiny, hidden_size=64, num_layers=3)
        with pytest.raises(CheckpointRestoreError) as e:
            restore(ckpt, None, model=other)
        assert str(e.value) == (f"{tmp_path} holds a checkpoint of another model: model.hidden_size 128 → 64, "
                                "model.num_layers 2 → 3; use another --workdir to start fresh (or restore the old "
                                "values)")
    finally:
        ckpt.close()
    runs_otherwise = dataclasses.replace(tiny, dtype="bfloat16", scan_layers=not tiny.scan_layers, remat_policy="full",
                                         hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
    assert model_changes(dataclasses.asdict(tiny), runs_otherwise) == []
    assert model_changes(None, other) == []  # a checkpoint from before the record: the restore decides


def test_a_workdir_of_another_model_is_refused_before_the_job_writes(tmp_path, tiny_config):
    """`refuse_another_model`, the job's look at its workdir before anything is written there: the
    config's model against the checkpoint's record."""
    import dataclasses

    from bert_jax.resolve import described_model
    from bert_jax.training.trainer import refuse_another_model, resolved

    config = resolved(tiny_config())
    model = described_model(config.model, vocab_size=30522)
    refuse_another_model(tmp_path / "new", config.restore, model)  # no checkpoints: nothing to compare
    assert not (tmp_path / "new").exists()
    ckpt = Checkpointer(tmp_path, async_save=False)
    try:
        saved = described_model(config.model, vocab_size=30522)
        ckpt.save(1, jax.tree.map(jax.numpy.asarray, _state(1)), {"step": 1, "model": dataclasses.asdict(saved)})
    finally:
        ckpt.close()
    refuse_another_model(tmp_path, config.restore, model)  # the same model
    config.model.size = "mini"
    with pytest.raises(CheckpointRestoreError, match=rf"^{tmp_path} holds a checkpoint of another model: "
                       r"model.hidden_size 128 → 256, model.num_layers 2 → 4, model.num_heads 2 → 4, "
                       r"model.intermediate_size 512 → 1024; use another --workdir"):
        refuse_another_model(tmp_path, config.restore, described_model(config.model, vocab_size=30522))


def test_reading_one_item_of_a_step_logs_no_metadata_warning(two_checkpoints, caplog):
    """`read_tree` of ``<step>/state`` (how fine-tuning reads a pre-training workdir) restores the
    arrays without Orbax's "Metadata file does not exist" warning: the manager keeps that file one
    directory up. Orbax's other warnings still pass (`_orbax_warnings_only`)."""
    import logging

    from bert_jax.training import checkpoints

    with caplog.at_level(logging.WARNING):
        tree = checkpoints.read_tree(two_checkpoints.directory / "2" / "state")
    np.testing.assert_array_equal(tree["params/w"], _state(2)["params"]["w"])
    assert not [r for r in caplog.records if "Metadata file does not exist" in r.getMessage()]
    kept = logging.LogRecord("absl", logging.WARNING, "/x/orbax/checkpoint/a.py", 1, "Failed to read %s", ("f",), None)
    info = logging.LogRecord("absl", logging.INFO, "/x/orbax/checkpoint/a.py", 1, "Wrote %s", ("f",), None)
    assert checkpoints._orbax_warnings_only(kept) and not checkpoints._orbax_warnings_only(info)

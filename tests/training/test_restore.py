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

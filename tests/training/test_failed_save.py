"""A save that fails (disk full) stops the run with one line (tests/test_faults.py runs it for real):
here, that the writes it abandons print nothing after that line."""

import asyncio
import gc
import logging

import jax
import numpy as np
import pytest

from bert_jax.training.checkpoints import Checkpointer, CheckpointSaveError

FULL = "OUT_OF_RANGE: Error writing ... Failed to write 2127349 bytes to file 11: File too large"


def abandon_a_write() -> None:
    """A future whose exception nobody reads, collected: what each of Orbax's gathered writes leaves
    after a failed save (asyncio logs "... exception was never retrieved" and the traceback)."""
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    future.set_exception(ValueError(FULL))
    loop.close()
    del future
    gc.collect()


def test_a_failed_save_leaves_no_traceback_after_its_line(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])  # this test's filter goes with it
    caplog.set_level(logging.ERROR, logger="asyncio")
    abandon_a_write()
    assert "exception was never retrieved" in caplog.text  # before a save failed: reported as ever

    caplog.clear()
    ckpt = Checkpointer(tmp_path, async_save=False)

    def full_disk(*args, **kwargs):
        raise ValueError(FULL)

    monkeypatch.setattr(ckpt.manager, "save", full_disk)
    with pytest.raises(CheckpointSaveError, match=r"checkpoints: saving a checkpoint failed \(ValueError: "
                       r"OUT_OF_RANGE.*\); the committed checkpoints are intact: steps \[\]"):
        ckpt.save(1, {"w": jax.numpy.asarray(np.ones(3, np.float32))}, {"step": 1})
    abandon_a_write()
    logging.getLogger("asyncio").error("Task was destroyed but it is pending!")  # other reports still go
    assert "never retrieved" not in caplog.text and "Task was destroyed" in caplog.text

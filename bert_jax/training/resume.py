"""Where a run starts: `resume` (every trainer) from the workdir's own checkpoint; for pre-training
`initial_state`: the workdir's own checkpoint (exact resume, every process's input
position included), else ``init_checkpoint`` (per ``init_mode``), else a fresh state; and the input
positions gathered from every process for the checkpoint's meta.

A workdir whose checkpoint another model saved (its meta records the model) is refused before any
array is read, in one line naming the changed fields (`model_changes`)."""

from __future__ import annotations

import dataclasses
import json
import logging

import jax
import numpy as np

from bert_jax.resolve import EXECUTION_FIELDS
from bert_jax.training.checkpoints import Checkpointer, CheckpointRestoreError, as_path

log = logging.getLogger(__name__)


def gather_data_states(state: dict, block: int = 0) -> list[dict]:
    """Every process's input position (they differ on a pod: each reads its own files), in the
    order of their input blocks (`sh.process_block`), so each process resumes its own stream.
    Single process: ``[state]``."""
    if jax.process_count() == 1:
        return [state]
    from jax.experimental import multihost_utils

    raw = json.dumps([block, state]).encode()
    if len(raw) > 4096:
        raise ValueError(f"input pipeline state too large to gather ({len(raw)} bytes)")
    rows = multihost_utils.process_allgather(np.frombuffer(raw.ljust(4096), np.uint8))  # [processes, 4096]
    rows = [json.loads(bytes(r).decode().strip()) for r in np.asarray(rows)]
    return [s for _, s in sorted(rows, key=lambda row: row[0])]


# BertConfig fields a resumed run may change: how the model runs, and the training-time dropout and init.
NOT_THE_MODEL = (*EXECUTION_FIELDS, "remat_policy", "hidden_dropout_prob", "attention_dropout_prob",
                 "initializer_range")


def model_changes(saved: dict | None, model) -> list[str]:
    """``model.<field> old → new`` for each field of ``model`` (a `BertConfig`) that differs from
    ``saved``, a checkpoint's record of its model (meta's ``model``; none in older checkpoints: no
    changes), the fields of `NOT_THE_MODEL` left out."""
    new = dataclasses.asdict(model)
    return [f"model.{k} {saved[k]} → {new[k]}" for k in new
            if saved and k in saved and k not in NOT_THE_MODEL and saved[k] != new[k]]


def _saved_model(ckpt: Checkpointer, step: int) -> dict | None:
    """The checkpoint's record of its model; None if it has none or its meta cannot be read (the
    restore then says why)."""
    try:
        return ckpt.read_meta(step).get("model")
    except Exception:  # noqa: BLE001
        return None


def _another_model(ckpt: Checkpointer, saved: dict | None, model) -> CheckpointRestoreError | None:
    """The error for a checkpoint that records (``saved``) another model than ``model``, else None."""
    changes = model_changes(saved, model)
    if not changes:
        return None
    return CheckpointRestoreError(f"{ckpt.directory.parent} holds a checkpoint of another model: {', '.join(changes)}; "
                                  f"use another --workdir to start fresh (or restore the old values)")


def check_workdir_model(config, workdir) -> None:
    """Before a pre-training job writes anything in ``workdir`` (`bert_jax.training.job.job`'s
    ``check``; config.json first): its checkpoint that ``config.restore`` names, if another model
    saved it, is a `CheckpointRestoreError` naming the changed fields. The vocabulary's size is taken
    from the checkpoint here, compared by `resume` once the vocabulary is loaded."""
    from bert_jax.resolve import described_model

    if not (as_path(workdir) / "checkpoints").is_dir():  # a new workdir (Orbax would create the directory)
        return
    ckpt = Checkpointer(workdir)
    try:
        step = ckpt.restore_step(config.restore)
        saved = _saved_model(ckpt, step) if step is not None else None
        error = None
        if saved and "vocab_size" in saved:
            error = _another_model(ckpt, saved, described_model(config.model, vocab_size=saved["vocab_size"]))
    finally:
        ckpt.close()
    if error is not None:
        raise error


def resume(ckpt: Checkpointer, layout, restore: str = "latest", model=None) -> tuple | None:
    """(state, meta) of the run's own checkpoint that ``restore`` names ("latest", "previous" or a
    step; docs/robustness.md), the checkpoints after it set aside, or None when there is none: how
    every trainer resumes exactly. ``model`` (the run's `BertConfig`): a checkpoint of another model
    is a `CheckpointRestoreError` naming the changed fields, raised before the state is read."""
    step = ckpt.restore_step(restore)
    if step is None:
        return None
    error = _another_model(ckpt, _saved_model(ckpt, step), model) if model is not None else None
    if error is not None:
        raise error
    state, meta = ckpt.restore(layout.target(), step)
    ckpt.set_aside_after(step)
    log.info("resumed from %s at step %d", ckpt.directory, int(state.step))
    return state, meta


# What init_checkpoint carries over: "state" (parameters, optimizer state and step: the paper's phase 2
# continues phase 1's schedule) or "params" (parameters only: the LAMB recipe's phase 2).
INIT_MODES = ("state", "params")


def initial_state(config, steps, ckpt: Checkpointer, data, block: tuple[int, int], model=None):
    """The workdir's checkpoint that ``config.restore`` names (default the newest; exact resume,
    input position included; of the `BertConfig` ``model``, `resume`), else ``init_checkpoint`` per
    ``init_mode`` (`INIT_MODES`), else a fresh state."""
    resumed = resume(ckpt, steps.layout, config.restore, model)
    if resumed is not None:
        state, meta = resumed
        per_process = meta.get("data_per_process") or [meta["data"]]
        if len(per_process) != block[1]:
            raise ValueError(f"{ckpt.directory}: saved by {len(per_process)} processes, resumed by "
                             f"{block[1]}; the input position cannot be carried over")
        data.restore(per_process[block[0]])
        return state
    if config.init_checkpoint:
        mode = config.init_mode
        if mode not in INIT_MODES:
            raise ValueError(f"config.init_mode={mode!r}: expected one of {INIT_MODES}")
        if not (as_path(config.init_checkpoint) / "checkpoints").is_dir():  # Orbax would create it
            raise FileNotFoundError(f"--config.init_checkpoint={config.init_checkpoint}: no checkpoints/ directory "
                                    f"(expected the workdir of a pre-training run)")
        source = Checkpointer(config.init_checkpoint)
        try:
            if mode == "params":  # a new run on old weights: step 0, fresh optimizer, its own schedule
                state = steps.layout.from_params(source.restore_params(steps.layout.target().params))
            else:
                state, _ = source.restore(steps.layout.target(), hint=False)
        finally:
            source.close()
        log.info("initialised from %s (%s) at step %d", config.init_checkpoint, mode, int(state.step))
        return state
    return steps.layout.create(config.seed)

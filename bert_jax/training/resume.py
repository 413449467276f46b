"""Where a run starts: `resume` (every trainer) from the workdir's own checkpoint; for pre-training
`initial_state`: the workdir's own checkpoint (exact resume, every process's input
position included), else ``init_checkpoint`` (per ``init_mode``), else a fresh state; and the input
positions gathered from every process for the checkpoint's meta."""

from __future__ import annotations

import json
import logging

import jax
import numpy as np

from bert_jax.training.checkpoints import Checkpointer, as_path

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


def resume(ckpt: Checkpointer, layout, restore: str = "latest") -> tuple | None:
    """(state, meta) of the run's own checkpoint that ``restore`` names ("latest", "previous" or a
    step; docs/robustness.md), the checkpoints after it set aside, or None when there is none: how
    every trainer resumes exactly."""
    step = ckpt.restore_step(restore)
    if step is None:
        return None
    state, meta = ckpt.restore(layout.target(), step)
    ckpt.set_aside_after(step)
    log.info("resumed from %s at step %d", ckpt.directory, int(state.step))
    return state, meta


# What init_checkpoint carries over: "state" (parameters, optimizer state and step: the paper's phase 2
# continues phase 1's schedule) or "params" (parameters only: the LAMB recipe's phase 2).
INIT_MODES = ("state", "params")


def initial_state(config, steps, ckpt: Checkpointer, data, block: tuple[int, int]):
    """The workdir's checkpoint that ``config.restore`` names (default the newest; exact resume,
    input position included), else ``init_checkpoint`` per ``init_mode`` (`INIT_MODES`), else a
    fresh state."""
    resumed = resume(ckpt, steps.layout, config.restore)
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

"""Where a pre-training run starts other than its own checkpoint: ``config.init_checkpoint`` (another
run's workdir) per ``config.init_mode`` (`INIT_MODES`), or fresh (`start_state`). The trainer looks
for the workdir's own checkpoint first (`bert_jax.training.trainer.restore`).
"""

from __future__ import annotations

import logging

from bert_jax.training.checkpoints import Checkpointer, as_path
from bert_jax.training.steps import TrainState

log = logging.getLogger(__name__)

# What init_checkpoint carries over: "state" (parameters, optimizer state and step: the paper's phase 2
# continues phase 1's schedule), "params" (parameters only: the LAMB recipe's phase 2) or "encoder" (the
# encoder's parameters ``bert/`` only, into a fresh state of any objective: ELECTRA's discriminator
# warm-started from a masked LM's encoder, then trained jointly with a fresh generator).
INIT_MODES = ("state", "params", "encoder")
ENCODER = "bert"  # the encoder's key in every pre-training model's parameters


def check_start(config) -> None:
    """``init_mode`` is one of `INIT_MODES`, and "encoder" has an ``init_checkpoint`` to take it from."""
    if config.init_mode not in INIT_MODES:
        raise ValueError(f"config.init_mode={config.init_mode!r}: expected one of {INIT_MODES}")
    if config.init_mode == "encoder" and not config.init_checkpoint:
        raise ValueError("init_mode=encoder starts the encoder from a masked LM's workdir: set "
                         "--config.init_checkpoint=WORKDIR (ELECTRA's runlocal: the workdir of python train.py "
                         "--config configs/pretrain.py:model=modernbert,runlocal --workdir /tmp/modernbert_tiny), "
                         "or --config.init_mode=state to start from scratch")


def start_state(config, layout) -> TrainState:
    """``init_checkpoint`` per ``init_mode`` (`INIT_MODES`), else a fresh state (the trainer has
    looked for the workdir's own checkpoint first)."""
    check_start(config)
    if not config.init_checkpoint:
        return layout.create(config.seed)
    mode = config.init_mode
    if not (as_path(config.init_checkpoint) / "checkpoints").is_dir():  # Orbax would create it
        raise FileNotFoundError(f"--config.init_checkpoint={config.init_checkpoint}: no checkpoints/ directory "
                                f"(expected the workdir of a pre-training run)")
    source = Checkpointer(config.init_checkpoint)
    try:
        if mode == "encoder":  # the rest (heads, a generator) as a fresh start of this seed initialises it
            state = layout.create(config.seed)
            target = layout.target().params
            encoder = source.restore_params({ENCODER: target[ENCODER]}, what="encoder's parameters")
            state = layout.from_params({**state.params, ENCODER: encoder[ENCODER]})
        elif mode == "params":  # a new run on old weights: step 0, fresh optimizer, its own schedule
            state = layout.from_params(source.restore_params(layout.target().params))
        else:
            state, _ = source.restore(layout.target(), hint=False)
    finally:
        source.close()
    log.info("initialised from %s (%s) at step %d", config.init_checkpoint, mode, int(state.step))
    return state

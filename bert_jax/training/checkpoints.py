"""Orbax checkpoints in ``<workdir>/checkpoints``: exact resume and params-only restore.

Each step directory holds two items: ``state`` (the `TrainState`: step, parameters, optimizer
state; restored straight into its shardings) and ``meta`` (JSON: the dropout RNG seed, the input
pipeline's position, the model config). Saves are asynchronous and atomic (Orbax writes to a
temporary directory and renames), so a killed run never leaves a half checkpoint that a resume
would pick up; the newest K are kept.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from bert_jax.model.weights import load_params

log = logging.getLogger(__name__)


def as_path(path: str | os.PathLike) -> epath.Path:
    """A workdir as an ``epath.Path``: local paths made absolute, ``gs://`` (any URL) kept as is."""
    text = os.fspath(path)
    return epath.Path(text if "://" in text else os.path.abspath(text))


class Checkpointer:
    """A thin wrapper over ``ocp.CheckpointManager`` for the trainer."""

    def __init__(self, workdir: str | Path, *, keep: int = 3, async_save: bool = True):
        self.directory = as_path(workdir) / "checkpoints"
        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # leftovers of a killed save are removed, never restored
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, meta: dict) -> None:
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)), force=True)

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores into ``target``: a pytree of ``jax.ShapeDtypeStruct`` with shardings (see
        `bert_jax.training.state.StateLayout.target`), so every array lands in its shards. A shape
        mismatch names the leaf."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to restore")
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                                     meta=ocp.args.JsonRestore()))
        except (ValueError, KeyError) as e:
            raise ValueError(f"{self.directory}/{step}: does not fit this model/optimizer: {e}") from e
        return out.state, dict(out.meta)

    def read_meta(self, step: int | None = None) -> dict:
        """The ``meta`` item alone (data position, model config) of a step (default: the latest)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to read")
        out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out.meta)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def committed_steps(self) -> list[int]:
        """The steps whose checkpoint is finalized in the directory (read from it, not from Orbax's
        cache): renamed from Orbax's temporary name (local) or holding ``commit_success.txt`` (buckets),
        with both items present."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir()
                      if p.name.isdigit() and ocp.step.is_path_finalized(p)
                      and (p / "state").is_dir() and (p / "meta").is_dir())

    def check_committed(self, step: int) -> None:
        """Raises unless the checkpoint of ``step`` is committed (`committed_steps`)."""
        if step not in self.committed_steps():
            raise RuntimeError(f"{self.directory}/{step}: the checkpoint of step {step} is not on disk after "
                               f"its save finished (committed: {self.committed_steps()})")

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def read_tree(item: str | Path) -> dict[str, np.ndarray]:
    """An Orbax item restored on the host with the shapes and dtypes of its own metadata, flat
    (``{"a/b/c": np.ndarray}``)."""
    # Onto this process's host memory, whatever devices and processes wrote it (a pod's checkpoint
    # on one machine): the saved shardings name devices that may not exist here.
    host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    with ocp.StandardCheckpointer() as ckptr:
        tree = ckptr.metadata(item).item_metadata.tree
        restored = ckptr.restore(item, jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=host), tree))
    # Every leaf, lists and tuples included (optax states hold them): "opt_state/0/mu/bert/...".
    return {"/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_leaves_with_path(restored)}


def read_params(path: str | Path) -> tuple[dict, epath.Path]:
    """The parameters of a training checkpoint, as a flat ``{"a/b/c": np.ndarray}`` dict.

    ``path`` may be a workdir, its ``checkpoints`` directory or one step directory (latest step
    when not given). Returns the params and the step directory they came from.
    """
    path = as_path(path)
    if (path / "checkpoints").is_dir():
        path = path / "checkpoints"
    if not (path / "state").is_dir():
        steps = sorted((int(p.name) for p in path.iterdir() if p.name.isdigit()), reverse=True) \
            if path.is_dir() else []
        if not steps:
            raise FileNotFoundError(f"{path}: no Orbax training checkpoint (expected checkpoints/<step>/state)")
        path = path / str(steps[0])
    state = read_tree(path / "state")
    return {k[len("params/"):]: v for k, v in state.items() if k.startswith("params/")}, path


def restore_params(path: str | Path, target: nnx.Module, *, only: str | None = "bert",
                   allow_missing: tuple[str, ...] = ()) -> list[str]:
    """Loads a pre-training checkpoint's parameters into a (differently-headed) model in place.

    ``only="bert"`` restores the encoder and leaves the heads as initialised (fine-tuning);
    ``only=None`` restores everything. Returns the parameter paths left untouched. Anything missing,
    extra or misshapen raises `CheckpointMismatchError` naming each one; ``allow_missing`` path
    prefixes may be absent (a pooler the pre-training model did not have).
    """
    stored, where = read_params(path)
    return load_params(target, stored, where=str(where), only=only, allow_missing=allow_missing)

"""Orbax checkpoints in ``<workdir>/checkpoints``: exact resume and params-only restore.

Each step directory holds two items: ``state`` (the `TrainState`: step, parameters, optimizer
state; restored straight into its shardings) and ``meta`` (JSON: the dropout RNG seed, the input
pipeline's position, the model config, and the state's `fingerprint`). Saves are asynchronous and
atomic (Orbax writes to a temporary directory and renames; in a ``gs://`` bucket, which cannot
rename, a step counts once its ``commit_success.txt`` is written), so a killed run never leaves a
half checkpoint that a resume would pick up; the newest K are kept. In a bucket Orbax also needs
the google-cloud-storage package (`require_gcs_client`).

Tensorstore keeps no checksum of array data: a flipped byte in a checkpoint file restores as a
wrong value without an error (docs/robustness.md). The fingerprint (two wrap-around uint32 sums of
each array's bits, one position-weighted; integer sums, so any sharding gives the same numbers) is
computed on the devices at save and compared after restore. A checkpoint that cannot be restored
raises `CheckpointRestoreError`, one line naming its step and how to fall back to the one before it
(``config.restore``: "latest" | "previous" | a step).

One layout on disk, whatever ran the blocks: an unrolled model's per-layer arrays
(``layers/0/...``, `bert_jax.model.layer_layout`) are stacked into the scan's ``layers/...`` arrays
when saved (parameters and the optimizer moments alike, `to_stored`), and split again when restored
(`from_stored`), so a workdir written with ``scan_layers`` false resumes with true and the reverse,
bit-exactly. The fingerprint is of the stored (stacked) arrays.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from bert_jax.model.weights import load_params
from input_pipeline.command_line import UserError

log = logging.getLogger(__name__)


def as_path(path: str | os.PathLike) -> epath.Path:
    """A workdir as an ``epath.Path``: local paths made absolute, ``gs://`` (any URL) kept as is."""
    text = os.fspath(path)
    return epath.Path(text if "://" in text else os.path.abspath(text))


class CheckpointRestoreError(ValueError):
    """A checkpoint that cannot be restored (unreadable, incomplete, another model, or its arrays
    differ from what was saved)."""


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
    """[2] uint32: the sum of the array's bit patterns and their position-weighted sum (mod 2**32)."""
    x = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{x.dtype.itemsize * 8}")).astype(jnp.uint32).reshape(-1)
    weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)  # [size]
    return jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * weights, dtype=jnp.uint32)])


_fingerprints = jax.jit(lambda tree: jax.tree.map(_leaf_fingerprint, tree))


def fingerprint(state: Any) -> dict[str, str]:
    """``{"params/bert/...": "<16 hex digits>"}`` for every array of ``state`` (see the module docstring)."""
    sums = jax.device_get(_fingerprints(state))
    return {jax.tree_util.keystr(path, simple=True, separator="/"): f"{int(v[0]):08x}{int(v[1]):08x}"
            for path, v in jax.tree_util.tree_leaves_with_path(sums)}


def _is_per_layer(x: Any) -> bool:
    """A dict of one unrolled block per layer: keys "0".."n-1" (the value of a ``layers`` key)."""
    return isinstance(x, dict) and bool(x) and sorted(x) == [str(i) for i in range(len(x))]


def _stack_blocks(blocks: dict) -> Any:
    return jax.tree.map(lambda *rows: jnp.stack(rows), *(blocks[str(i)] for i in range(len(blocks))))


def _stack_abstract(blocks: dict) -> Any:
    """The stored form of per-layer ShapeDtypeStructs: [layers, ...], the layers axis unsharded."""
    def stack(*rows):
        s = rows[0].sharding
        spec = jax.sharding.PartitionSpec(None, *s.spec) if isinstance(s, jax.sharding.NamedSharding) else None
        sharding = jax.sharding.NamedSharding(s.mesh, spec) if spec is not None else s
        return jax.ShapeDtypeStruct((len(rows), *rows[0].shape), rows[0].dtype, sharding=sharding)
    return jax.tree.map(stack, *(blocks[str(i)] for i in range(len(blocks))))


def has_per_layer(tree: Any) -> bool:
    """Whether ``tree`` holds an unrolled encoder's per-layer blocks."""
    return any(_is_per_layer(x) for x in jax.tree.leaves(tree, is_leaf=_is_per_layer))


def to_stored(tree: Any) -> Any:
    """``tree`` (a state, parameters, or their ShapeDtypeStructs) in the stored layout: every
    per-layer group of blocks stacked on a leading layers axis; anything else unchanged."""
    abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))
    stack = _stack_abstract if abstract else _stack_blocks
    return jax.tree.map(lambda x: stack(x) if _is_per_layer(x) else x, tree, is_leaf=_is_per_layer)


def from_stored(stored: Any, like: Any) -> Any:
    """``stored`` (`to_stored`'s form) split back into ``like``'s per-layer blocks where ``like``
    has them (``like``: the target tree, of arrays or ShapeDtypeStructs)."""
    def split(want, got):
        if not _is_per_layer(want):
            return got
        return {str(i): jax.tree.map(lambda a, i=i: a[i], got) for i in range(len(want))}
    return jax.tree.map(split, like, stored, is_leaf=_is_per_layer)


class CheckpointSaveError(UserError):
    """A checkpoint could not be written (disk full, file size limit, permissions)."""


def _key(entry) -> str:
    for name in ("key", "name", "idx"):  # DictKey, FlattenedIndexKey / GetAttrKey / SequenceKey
        if hasattr(entry, name):
            return str(getattr(entry, name))
    return str(entry)


def _shapes(tree: Any) -> dict[str, tuple]:
    """``path/to/leaf`` → shape for every array (or metadata) leaf that has one."""
    return {"/".join(_key(k) for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree) if getattr(leaf, "shape", None) is not None}


def _stored_shapes(state_dir: epath.Path) -> dict[str, tuple]:
    """The shapes of the arrays in a step's ``state`` item, from its metadata alone (no array is read);
    empty if the metadata cannot be read (the restore then says why)."""
    handler = ocp.StandardCheckpointHandler()
    try:
        metadata = handler.metadata(state_dir)
    except Exception:  # noqa: BLE001
        return {}
    finally:
        handler.close()
    return _shapes(getattr(metadata, "item_metadata", metadata))


def stored_param_shapes(step_dir: str | Path) -> dict[str, tuple]:
    """``{"bert/...": shape}`` of a training checkpoint's parameters (``checkpoints/<step>``), from the
    metadata of its ``state`` item alone: no array is read. Empty if the metadata cannot be read."""
    shapes = _stored_shapes(as_path(step_dir) / "state")
    return {k[len("params/"):]: v for k, v in shapes.items() if k.startswith("params/")}


def _quiet_abandoned_reads() -> None:
    """After a restore failed part-way: TensorStore's reads still in flight complete later into the
    event loop Orbax ran them in, closed by then, and each prints a "RuntimeError: Event loop is
    closed" traceback (through `sys.unraisablehook`), a screenful after the error line. From here on
    those alone are dropped; every other unraisable exception is reported as before."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loop_callbacks", False):
        return

    def hook(unraisable) -> None:
        e, tb = unraisable.exc_value, unraisable.exc_traceback
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if (isinstance(e, RuntimeError) and str(e) == "Event loop is closed" and tb is not None
                and tb.tb_frame.f_code.co_filename.endswith(os.path.join("asyncio", "base_events.py"))):
            return
        previous(unraisable)

    hook.drops_closed_loop_callbacks = True
    sys.unraisablehook = hook


def _never_retrieved(record: logging.LogRecord) -> bool:
    """False for asyncio's "... exception was never retrieved" (a future garbage-collected with its
    exception unread): the `logging.Filter` of `_quiet_abandoned_writes`."""
    return not record.getMessage().partition("\n")[0].endswith("exception was never retrieved")


def _quiet_abandoned_writes() -> None:
    """After a save failed: the writes Orbax gathered for it fail too (the same full disk), and when
    their futures are collected, at the latest as the process exits, asyncio logs each one's unread
    exception with its traceback, a screenful after the error line. From here on those are dropped."""
    logging.getLogger("asyncio").addFilter(_never_retrieved)  # added once: the same function


def _split(stored: Any, target: Any) -> Any:
    """A restored tree back in ``target``'s layout, each array in ``target``'s sharding."""
    if not has_per_layer(target):
        return stored
    shardings = jax.tree.map(lambda t: t.sharding, target)
    return jax.jit(lambda s: from_stored(s, target), out_shardings=shardings)(stored)


def require_gcs_client(directory: epath.Path) -> None:
    """Raises `UserError` if ``directory`` is in a ``gs://`` bucket and google-cloud-storage is not
    installed: Orbax lists and deletes the checkpoints there after asking the bucket, through that
    package, whether it has a hierarchical namespace (orbax/checkpoint/_src/path/gcs_utils.py), and
    orbax-checkpoint does not install it (without it, an ImportError from inside Orbax)."""
    if not os.fspath(directory).startswith("gs://"):
        return
    try:
        import google.cloud.storage  # noqa: F401
    except ImportError:
        raise UserError(f"{directory}: checkpoints in a gs:// bucket need the google-cloud-storage package "
                        "(Orbax reads the bucket's settings with it): pip install google-cloud-storage") from None


def _missing_credentials() -> str | None:
    """Why no Google credentials are to be found on this machine, or None if some are (a key file,
    gcloud's application-default login, the test token). A Cloud VM's metadata server, which needs
    none of them, is not asked: that takes the network."""
    if os.environ.get("GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        return None
    key = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key:
        return None if os.path.isfile(key) else f"GOOGLE_APPLICATION_CREDENTIALS names {key}, which does not exist"
    gcloud = os.environ.get("CLOUDSDK_CONFIG") or os.path.join(os.path.expanduser("~"), ".config", "gcloud")
    if os.path.isfile(os.path.join(gcloud, "application_default_credentials.json")):
        return None
    return "GOOGLE_APPLICATION_CREDENTIALS is unset and gcloud has no application-default login"


def require_storage_access(workdir: str | os.PathLike) -> None:
    """Raises `UserError` naming a ``gs://`` workdir (any URL) that cannot be reached (no network, no
    credentials, no such bucket), found by one look at it before the job starts: otherwise the first
    write fails deep in the storage client, a traceback. Local workdirs are not checked."""
    text = os.fspath(workdir)
    if "://" not in text:
        return
    try:
        as_path(text).exists()
    except Exception as e:  # noqa: BLE001  (TensorFlow's, etils' or the storage client's errors alike)
        reason = " ".join(str(e).split()) or type(e).__name__
        if "error details: " in reason:  # TensorFlow's GCS: "... libcurl code 6 ..., error details: <why>"
            reason = reason.split("error details: ", 1)[1].split(" when ", 1)[0]
        missing = _missing_credentials()
        raise UserError(f"--workdir {text}: cannot reach the storage ({reason[:200]})"
                        + (f"; no Google credentials either: {missing}" if missing else "")
                        + "; check the network and the credentials (gcloud auth application-default login)") from e


def _orbax_warnings_only(record: logging.LogRecord) -> bool:
    """Orbax logs every save and restore at INFO through absl (dozens of lines a checkpoint): its
    warnings and errors are kept, except "Metadata file does not exist" for an item of a step
    (``<step>/state``): the manager writes that file for the step, one directory up, and an item read
    on its own (`read_tree`) looks for it in vain."""
    if "orbax" not in record.pathname:
        return True
    return record.levelno >= logging.WARNING and not record.getMessage().startswith("Metadata file does not exist")


def quiet_orbax() -> None:
    """Installs `_orbax_warnings_only` on absl's logger (once)."""
    absl = logging.getLogger("absl")
    if _orbax_warnings_only not in absl.filters:
        absl.addFilter(_orbax_warnings_only)


class Checkpointer:
    """A thin wrapper over ``ocp.CheckpointManager`` for the trainer."""

    def __init__(self, workdir: str | Path, *, keep: int = 3, async_save: bool = True):
        quiet_orbax()
        self.directory = as_path(workdir) / "checkpoints"
        require_gcs_client(self.directory)
        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # leftovers of a killed save are removed, never restored
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, meta: dict) -> None:
        state = jax.jit(to_stored)(state) if has_per_layer(state) else state  # one layout on disk
        meta = {**meta, "fingerprint": fingerprint(state)}
        try:
            self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                            meta=ocp.args.JsonSave(meta)), force=True)
        except Exception as e:  # this save, or the asynchronous one before it, failed (disk full...)
            raise self._save_failed(e) from e

    def _save_failed(self, e: BaseException) -> CheckpointSaveError:
        _quiet_abandoned_writes()
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        return CheckpointSaveError(f"{self.directory}: saving a checkpoint failed ({reason[:300]}); the committed "
                                   f"checkpoints are intact: steps {self.committed_steps()}")

    def warm_up(self, state: Any) -> None:
        """Compiles the stacking and the fingerprint for ``state``'s structure now, not inside the
        first save (which may be a preemption's, against its grace period)."""
        fingerprint(jax.jit(to_stored)(state) if has_per_layer(state) else state)

    def restore_step(self, choice: str | int = "latest") -> int | None:
        """The step ``config.restore`` names: "latest", "previous" (the one before the newest) or a
        step number; None when the directory holds no checkpoint."""
        steps = sorted(self.manager.all_steps())
        text = str(choice).strip().lower()
        if not steps:
            return None
        if text == "latest":
            return steps[-1]
        if text == "previous" and len(steps) > 1:
            return steps[-2]
        if text.isdigit() and int(text) in steps:
            return int(text)
        raise ValueError(f"--config.restore={choice}: expected 'latest', 'previous' (needs two checkpoints) "
                         f"or a step number; {self.directory} holds steps {steps}")

    def set_aside_after(self, step: int) -> None:
        """Moves the checkpoints newer than ``step`` (a run resumed from an earlier one) to
        ``<workdir>/checkpoints_set_aside/``, so that new saves and the next resume do not meet them."""
        newer = [s for s in self.manager.all_steps() if s > step]
        if newer and jax.process_index() == 0:
            aside = self.directory.parent / "checkpoints_set_aside"
            aside.mkdir(parents=True, exist_ok=True)
            for s in newer:
                (self.directory / str(s)).rename(aside / f"{s}.{os.getpid()}")
            log.warning("resuming from step %d: moved checkpoints %s to %s", step, newer, aside)
        if newer:
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils

                multihost_utils.sync_global_devices("checkpoints set aside")
            self.manager.reload()

    def restore(self, target: Any, step: int | None = None, *, hint: bool = True) -> tuple[Any, dict]:
        """Restores into ``target``: a pytree of ``jax.ShapeDtypeStruct`` with shardings (see
        `bert_jax.training.steps.StateLayout.target`), so every array lands in its shards, and
        checks the fingerprint. Any failure raises `CheckpointRestoreError` naming the step (a shape
        mismatch names the leaf); ``hint`` adds how to fall back to the checkpoint before it."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to restore")
        self.check_restore(target, step, hint=hint)
        try:
            out = self._restore(step, ocp.args.Composite(
                state=ocp.args.StandardRestore(to_stored(target)), meta=ocp.args.JsonRestore()))
        except (ValueError, KeyError) as e:
            raise CheckpointRestoreError(self._cannot(step, f"does not fit this model/optimizer: {e}", hint)) from e
        except Exception as e:  # unreadable: truncated or missing files, bad JSON, tensorstore errors
            raise CheckpointRestoreError(self._cannot(step, f"{type(e).__name__}: {e}", hint)) from e
        saved = (out.meta or {}).get("fingerprint")
        if saved is not None:
            differ = [k for k, v in fingerprint(out.state).items() if saved.get(k) != v]
            if differ:
                raise CheckpointRestoreError(self._cannot(
                    step, f"{len(differ)} arrays differ from what was saved (fingerprint), first {differ[0]}", hint))
        return _split(out.state, target), dict(out.meta)

    def restore_params(self, target: Any, step: int | None = None, *, what: str = "parameters") -> Any:
        """The ``params`` of a saved `TrainState` alone, into ``target`` (ShapeDtypeStructs with
        shardings, `StateLayout.target().params`, or a part of it: ``{"bert": ...}``): the optimizer
        state and step on disk are not read (phase 2 of the LAMB recipe starts from phase 1's
        parameters with a fresh optimizer). ``what`` names ``target`` in errors."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to restore")
        self.check_restore_params(target, step, what=what)
        item = {"params": to_stored(target)}
        args = ocp.args.PyTreeRestore(item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                                      partial_restore=True)
        try:
            out = self._restore(step, ocp.args.Composite(state=args))
        except (ValueError, KeyError) as e:
            raise CheckpointRestoreError(self._cannot(step, f"its {what} do not fit this model: {e}", False)) from e
        except Exception as e:  # unreadable: truncated or missing files, tensorstore errors
            raise CheckpointRestoreError(self._cannot(step, f"{type(e).__name__}: {e}", False)) from e
        return _split(out.state["params"], target)

    def check_restore(self, target: Any, step: int, *, hint: bool = True) -> None:
        """What `restore` checks before it reads anything: every array of ``target`` has its shape on
        disk, from the checkpoint's metadata alone (the dry run calls it too)."""
        self._check_shapes(step, to_stored(target), "does not fit this model/optimizer", hint)

    def check_restore_params(self, target: Any, step: int, *, what: str = "parameters") -> None:
        """What `restore_params` checks before it reads anything (`check_restore`, for parameters)."""
        self._check_shapes(step, {"params": to_stored(target)}, f"its {what} do not fit this model", False,
                           partial=True)

    def _restore(self, step: int, args: ocp.args.Composite) -> Any:
        """``manager.restore``; when it fails, the reads it started and abandoned are kept quiet
        (`_quiet_abandoned_reads`)."""
        try:
            return self.manager.restore(step, args=args)
        except BaseException:
            _quiet_abandoned_reads()
            raise

    def _check_shapes(self, step: int, stored_target: Any, reason: str, hint: bool, partial: bool = False) -> None:
        """Raises `CheckpointRestoreError` naming the first array whose shape on disk differs from
        ``stored_target``'s (the target in `to_stored`'s layout), before any array is read: a restore
        that fails part-way leaves TensorStore's reads completing into Orbax's closed event loop, a
        screenful of "Event loop is closed" tracebacks after the error line. ``partial`` (a part of
        the state is read): also an array of the target that the checkpoint lacks."""
        stored = _stored_shapes(self.directory / str(step) / "state")
        missing = [name for name in _shapes(stored_target) if stored and name not in stored] if partial else []
        if missing:
            raise CheckpointRestoreError(self._cannot(
                step, f"{reason}: {len(missing)} arrays of this model are not in the checkpoint, first {missing[0]}",
                hint))
        for name, shape in _shapes(stored_target).items():
            if name in stored and stored[name] != shape:
                raise CheckpointRestoreError(self._cannot(
                    step, f"{reason}: {name} is {list(stored[name])} in the checkpoint, {list(shape)} here", hint))

    def _cannot(self, step: int, reason: str, hint: bool) -> str:
        reason = " ".join(reason.split())
        reason = reason if len(reason) < 300 else reason[:300] + "..."
        text = f"{self.directory}/{step}: cannot restore the checkpoint of step {step}: {reason}"
        if not hint:
            return text
        earlier = [s for s in self.manager.all_steps() if s < step]
        if earlier:
            return (text + f". --config.restore=previous resumes from step {max(earlier)} "
                    "(later checkpoints are moved to checkpoints_set_aside/)")
        return text + f". No earlier checkpoint: move {self.directory} away to start from scratch"

    def read_meta(self, step: int | None = None) -> dict:
        """The ``meta`` item alone (data position, model config) of a step (default: the latest)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to read")
        out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out.meta)

    def wait(self) -> None:
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            raise self._save_failed(e) from e

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
        try:
            self.wait()
        finally:
            self.manager.close()


def key_names(path) -> list[str]:
    """A pytree path's keys as strings (dict keys, sequence indices, attribute names)."""
    return [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]


def read_tree(item: str | Path) -> dict[str, np.ndarray]:
    """An Orbax item restored on the host with the shapes and dtypes of its own metadata, flat
    (``{"a/b/c": np.ndarray}``)."""
    # Onto this process's host memory, whatever devices and processes wrote it (a pod's checkpoint
    # on one machine): the saved shardings name devices that may not exist here.
    host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    quiet_orbax()
    with ocp.StandardCheckpointer() as ckptr:
        tree = ckptr.metadata(item).item_metadata.tree
        restored = ckptr.restore(item, jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=host), tree))
    # Every leaf, lists and tuples included (optax states hold them): "opt_state/0/mu/bert/...".
    return {"/".join(key_names(path)): np.asarray(v) for path, v in jax.tree_util.tree_leaves_with_path(restored)}


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


def load_into_model(path: str | Path, target: nnx.Module, *, only: str | None = "bert",
                    allow_missing: tuple[str, ...] = ()) -> list[str]:
    """Loads a pre-training checkpoint's parameters into a (differently-headed) model in place.

    ``only="bert"`` restores the encoder and leaves the heads as initialised (fine-tuning);
    ``only=None`` restores everything. Returns the parameter paths left untouched. Anything missing,
    extra or misshapen raises `CheckpointMismatchError` naming each one; ``allow_missing`` path
    prefixes may be absent (a pooler the pre-training model did not have).
    """
    stored, where = read_params(path)
    return load_params(target, stored, where=str(where), only=only, allow_missing=allow_missing)

"""The one strict way to put stored weights into a model.

Every reader (Hugging Face and Google TF checkpoints in `bert_jax.interop`, Orbax parameter
directories, pre-training workdirs) turns its file into a flat ``{"bert/layers/attention/query/kernel":
array}`` dict in our layout and calls `load_params`. It copies what is in scope, leaves the rest as
initialised, and refuses, listing every offending name at once, when anything in scope is missing,
left over or misshapen.

Paths are full paths: the encoder's parameters start with ``bert/``. A bare `BertEncoder` (whose own
paths lack that prefix) and a stored bare encoder are both read as if they had it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from flax import nnx, traverse_util


class CheckpointMismatchError(ValueError):
    """Stored weights do not fit the model: names every missing, extra or misshapen parameter."""


def full_paths(flat: Mapping[str, object]) -> dict[str, str]:
    """``{full path: own path}`` for a flat parameter dict (adds ``bert/`` for a bare encoder)."""
    prefix = "" if any(path.startswith("bert/") for path in flat) else "bert/"
    return {prefix + path: path for path in flat}


def _in_scope(path: str, only: str | None) -> bool:
    return only is None or path == only or path.startswith(only + "/")


def load_params(model: nnx.Module, stored: Mapping[str, np.ndarray], *, where: str, only: str | None = None,
                allow_missing: tuple[str, ...] = (), unmatched: Iterable[str] = (),
                names: Mapping[str, str] | None = None) -> list[str]:
    """Copies ``stored`` (flat, full paths, our layout) into ``model`` in place.

    ``only="bert"`` loads just the encoder: the model's other parameters keep their initial values
    and stored tensors outside ``bert/`` are ignored. ``allow_missing`` lists path prefixes that may
    be absent (new heads, a pooler the checkpoint lacks). ``unmatched`` are stored names a reader
    could not map to any parameter (reported as extra); ``names`` gives a path's name in the file,
    for messages. Returns the model's own paths that were left untouched. Raises
    `CheckpointMismatchError` (``where``: the file) listing every problem.
    """
    state = nnx.state(model, nnx.Param)
    ours = traverse_util.flatten_dict(state.to_pure_dict(), sep="/")
    own = full_paths(ours)  # full path -> the model's own path
    stored = {full: v for full, v in zip(full_paths(stored), stored.values(), strict=True)}
    label = (lambda path: names.get(path, path)) if names else (lambda path: path)
    new, untouched, missing, bad = {}, [], [], []
    for full, path in own.items():
        if not _in_scope(full, only):
            untouched.append(path)
        elif full not in stored:
            if full.startswith(allow_missing):
                untouched.append(path)
            else:
                missing.append(label(full))
        elif (shape := tuple(np.shape(stored[full]))) != tuple(ours[path].shape):
            bad.append(f"{label(full)}: checkpoint {shape} vs model {tuple(ours[path].shape)}")
        else:
            new[path] = np.asarray(stored[full]).astype(ours[path].dtype)
    extra = sorted([*unmatched, *(label(k) for k in stored if _in_scope(k, only) and k not in own)])
    problems = [f"missing from {where}: {', '.join(sorted(missing))}"] if missing else []
    problems += [f"in {where} but not in the model: {', '.join(extra)}"] if extra else []
    problems += [f"shape mismatch in {where}: " + "; ".join(bad)] if bad else []
    if problems:
        raise CheckpointMismatchError(" | ".join(problems))
    nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict({**ours, **new}, sep="/"))
    nnx.update(model, state)
    return untouched

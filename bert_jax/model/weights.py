"""The one strict way to put stored weights into a model.

Every reader (Hugging Face and Google TF checkpoints in `bert_jax.interop`, Orbax parameter
directories, pre-training workdirs) turns its file into a flat ``{"bert/layers/attention/query/kernel":
array}`` dict in our layout and calls `load_params`. It copies what is in scope, leaves the rest as
initialised, and refuses, listing every offending name at once, when anything in scope is missing,
left over or misshapen.

Paths are full paths: the encoder's parameters start with ``bert/``. Blocks may be stored stacked
(``bert/layers/...``, ``[layers, ...]``) or per layer (``bert/layers/3/...``), and load into a model of
either layout (`bert_jax.model.layer_layout`). A bare `BertEncoder` (whose own
paths lack that prefix) and a stored bare encoder are both read as if they had it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from flax import nnx, traverse_util

from bert_jax.model import layer_layout
from bert_jax.model.layer_layout import stacked_key


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
    ours = traverse_util.flatten_dict(nnx.to_pure_dict(state), sep="/")
    # Compared in the stacked layout (`bert_jax.model.layer_layout`): a per-layer model's blocks
    # ("bert/layers/3/...") as the stacks a scanned model holds, so either layout loads either.
    blocks: dict[str, list[tuple[int, str]]] = {}  # stacked full path -> [(layer, own path)]
    own, shapes = {}, {}  # stacked full path -> own path (not per layer); -> (shape, dtype)
    for full, path in full_paths(ours).items():
        if (hit := stacked_key(full)) is not None:
            blocks.setdefault(hit[0], []).append((hit[1], path))
        else:
            own[full], shapes[full] = path, (tuple(ours[path].shape), ours[path].dtype)
    for key, rows in blocks.items():
        rows.sort()
        first = ours[rows[0][1]]
        shapes[key] = ((len(rows), *first.shape), first.dtype)
    stored = layer_layout.stack({full: v for full, v in zip(full_paths(stored), stored.values(), strict=True)})
    label = (lambda path: names.get(path, path)) if names else (lambda path: path)
    own_paths = lambda key: [p for _, p in blocks[key]] if key in blocks else [own[key]]  # noqa: E731
    new, untouched, missing, bad = {}, [], [], []
    for full, (shape_ours, dtype) in shapes.items():
        if not _in_scope(full, only):
            untouched += own_paths(full)
        elif full not in stored:
            if full.startswith(allow_missing):
                untouched += own_paths(full)
            else:
                missing.append(label(full))
        elif (shape := tuple(np.shape(stored[full]))) != shape_ours:
            bad.append(f"{label(full)}: checkpoint {shape} vs model {shape_ours}")
        else:
            value = np.asarray(stored[full]).astype(dtype)
            if full in blocks:
                new.update({path: value[i] for i, path in blocks[full]})
            else:
                new[own[full]] = value
    extra = sorted([*unmatched, *(label(k) for k in stored if _in_scope(k, only) and k not in shapes)])
    problems = [f"missing from {where}: {', '.join(sorted(missing))}"] if missing else []
    problems += [f"in {where} but not in the model: {', '.join(extra)}"] if extra else []
    problems += [f"shape mismatch in {where}: " + "; ".join(bad)] if bad else []
    if problems:
        raise CheckpointMismatchError(" | ".join(problems))
    nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict({**ours, **new}, sep="/"))
    nnx.update(model, state)
    return untouched

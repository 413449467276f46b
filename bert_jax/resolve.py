"""A job's config resolved for the platform it runs on: every "auto" made concrete, once.

`bert_jax.training.job.job` calls `resolve` when a job starts (after ``jax.distributed`` is up,
before anything is built) and writes the result to ``<workdir>/config.json``; everything after
reads concrete values, and nothing under ``bert_jax/model`` asks which backend runs. The AOT tool
resolves for the TPU it compiles for with the same function (``platform="tpu"``).

    resolved = resolve(config, "cpu", batch_shards=8)
    resolved.model.dtype  # "float32"; "bfloat16" on "gpu" / "tpu"

What "auto" means per platform is `bert_jax.model.execution`'s (one pure function a field):

* ``model.dtype``, ``model.scan_layers`` ("true" / "false", the strings ml_collections holds),
  ``model.attention_impl``, ``model.dropout_impl``: `BertConfig.for_platform`;
* ``per_device_batch`` (pre-training): rows per batch shard in one micro-batch, from the rows each
  of ``batch_shards`` data-parallel shards holds ("0": no micro-batches). "auto" keeps the whole
  batch ("0") when ``optimizer.accumulation_steps`` or ``unpad_multiple`` chooses instead.
"""

from __future__ import annotations

import ml_collections

from bert_jax.model.config import BertConfig
from bert_jax.model.execution import platform_kind, resolve_per_device_batch

AUTO = "auto"
EXECUTION_FIELDS = ("dtype", "scan_layers", "attention_impl", "dropout_impl")  # BertConfig.for_platform's


def resolve(config: ml_collections.ConfigDict, platform: str, *, batch_shards: int | None = None
            ) -> ml_collections.ConfigDict:
    """A copy of ``config`` with every "auto" resolved for ``platform`` ("cpu", "gpu", "tpu", ...).
    ``batch_shards``: the data-parallel shards of the batch (needed to resolve an "auto"
    ``per_device_batch``)."""
    c = config.copy_and_resolve_references()
    model = c.get("model")
    if model is not None:
        # The model the job will build (its size's table with the config's fields on top), resolved
        # by BertConfig itself: a shared block, the head width and the dtype count as they will.
        cfg = described_model(model).for_platform(platform)
        with model.unlocked():
            for key in EXECUTION_FIELDS:
                if key in model:
                    value = getattr(cfg, key)
                    model[key] = str(value).lower() if isinstance(value, bool) else value  # scan: "true" | "false"
    if "per_device_batch" in c:  # "auto" or a number (a digit string from a flag counts)
        value = c.per_device_batch
        rows = _per_device_batch(c, platform, batch_shards) if value == AUTO else \
            resolve_per_device_batch(value, platform, rows=0)
        with c.unlocked():  # the field may hold a string ("auto"): replaced by its number
            del c["per_device_batch"]
            c.per_device_batch = rows
    left = auto_keys(c)
    if left:
        raise ValueError(f"config keys {left} are still 'auto' after resolving for {platform!r}")
    return c


def described_model(model: ml_collections.ConfigDict, **fields) -> BertConfig:
    """The `BertConfig` a job config's ``model`` section describes: its ``size``'s table with the
    section's other fields on top (None keeps the table's value), then ``fields``."""
    given = {k: v for k, v in model.items() if k != "size" and v is not None}
    return BertConfig.from_size(model["size"], **{**given, **fields})


def _per_device_batch(c, platform: str, batch_shards: int | None) -> int:
    if c.unpad_multiple:
        return 0  # unpadding's blocks take the whole batch
    if platform_kind(platform) != "cpu":
        return resolve_per_device_batch(AUTO, platform, rows=c.batch_size)  # the whole batch: 0
    if batch_shards is None:
        raise ValueError("per_device_batch='auto' on the CPU needs the batch's data-parallel shards to resolve")
    if c.batch_size % batch_shards:
        return 0
    return resolve_per_device_batch(AUTO, platform, rows=c.batch_size // batch_shards)


def auto_keys(config) -> list[str]:
    """The dotted keys of ``config`` whose value is still "auto"."""
    out = []

    def walk(d, prefix):
        for k, v in d.items():
            if isinstance(v, ml_collections.ConfigDict | dict):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, str) and v == AUTO:
                out.append(prefix + k)

    walk(config, "")
    return out

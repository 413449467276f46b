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

from bert_jax.model.execution import (
    platform_kind,
    resolve_attention,
    resolve_dropout,
    resolve_dtype,
    resolve_per_device_batch,
    resolve_scan,
)

AUTO = "auto"


def resolve(config: ml_collections.ConfigDict, platform: str, *, batch_shards: int | None = None
            ) -> ml_collections.ConfigDict:
    """A copy of ``config`` with every "auto" resolved for ``platform`` ("cpu", "gpu", "tpu", ...).
    ``batch_shards``: the data-parallel shards of the batch (needed to resolve an "auto"
    ``per_device_batch``)."""
    c = config.copy_and_resolve_references()
    model = c.get("model")
    if model is not None:
        with model.unlocked():
            dtype = resolve_dtype(model.get("dtype", "float32"), platform)
            if "dtype" in model:
                model.dtype = dtype
            if "scan_layers" in model:
                scan = model.scan_layers
                scan = scan.lower() == "true" if isinstance(scan, str) and scan.lower() in ("true", "false") else scan
                model.scan_layers = str(resolve_scan(scan, platform, shared=bool(model.get("share_layers")))).lower()
            if "attention_impl" in model:
                head_dim = _head_dim(model)
                model.attention_impl = resolve_attention(model.attention_impl, platform, dtype=dtype, head_dim=head_dim)
            if "dropout_impl" in model:
                model.dropout_impl = resolve_dropout(model.dropout_impl, platform)
    if c.get("per_device_batch") == AUTO:
        c.per_device_batch = str(_per_device_batch(c, platform, batch_shards))
    left = auto_keys(c)
    if left:
        raise ValueError(f"config keys {left} are still 'auto' after resolving for {platform!r}")
    return c


def _head_dim(model) -> int:
    """The head width the config's model will have (its size's, unless overridden)."""
    from bert_jax.model.config import FAMILY_SIZES, SIZES

    size = model.get("size")
    hidden, heads = model.get("hidden_size"), model.get("num_heads")
    if size in SIZES:
        hidden, heads = hidden or SIZES[size][1], heads or SIZES[size][2]
    elif size in FAMILY_SIZES:
        hidden, heads = hidden or FAMILY_SIZES[size]["hidden_size"], heads or FAMILY_SIZES[size]["num_heads"]
    return (hidden or 768) // (heads or 12)


def _per_device_batch(c, platform: str, batch_shards: int | None) -> int:
    if c.get("optimizer", {}).get("accumulation_steps", 1) != 1 or c.get("unpad_multiple", 0):
        return 0  # the accumulation (or unpadding's blocks) is chosen another way
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

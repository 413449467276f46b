"""A job's config resolved for the platform it runs on: every "auto" made concrete, once.

`bert_jax.training.trainer.run` calls `resolve` when a job starts (after ``jax.distributed`` is up,
before anything is built) and writes the result to ``<workdir>/config.json``; everything after
reads concrete values, and nothing under ``bert_jax/model`` asks which backend runs (`BertConfig`
refuses "auto"). The AOT tool resolves for the TPU it compiles for with the same function
(``platform="tpu"``).

    resolved = resolve(config, "cpu", batch_shards=8)
    resolved.model.dtype  # "float32"; "bfloat16" on "gpu" / "tpu"

What "auto" means per platform lives here, one pure function of the platform's name ("cpu",
"gpu"/"cuda", "rocm", "tpu") a field, so every platform's choice is tested on a CPU:

* ``model.dtype``: `resolve_dtype` (bfloat16 on GPU/TPU, float32 on CPU);
* ``model.scan_layers`` ("true" / "false", the strings ml_collections holds): `resolve_scan`
  (unrolled on CPU and NVIDIA GPUs, scanned on TPUs and ROCm, and for ALBERT's shared block);
* ``model.stacked_params``: `resolve_stacked_params` (unrolled blocks over the stacked parameters on
  NVIDIA GPUs, each block with its own arrays on the CPU; False wherever the blocks are scanned);
* ``model.attention_impl``: `resolve_attention` (cuDNN's flash attention on an NVIDIA GPU where it
  applies: bfloat16/float16, a head width that is a multiple of 8 up to 128; else XLA; the GPU's
  Pallas flash attention with dropout, "flash", only when asked for);
* ``model.dropout_impl``: `resolve_dropout` (fused Threefry on CPU, ``jax.random`` elsewhere);
* ``model.norm_impl``: `resolve_norm` (XLA everywhere; the GPU's fused residual-dropout-LayerNorm
  kernel, "fused", only when asked for);
* ``model.recompute_activation``: `resolve_recompute` (on CPU and NVIDIA GPUs, not on TPUs and ROCm);
* ``model.gelu_impl``: `resolve_gelu` (the exact GELU through erf on NVIDIA GPUs, through erfc,
  ``jax.nn.gelu``'s, elsewhere);
* ``per_device_batch`` (pre-training): rows per batch shard in one micro-batch (0: the whole batch
  at once), `resolve_per_device_batch` of the rows each of ``batch_shards`` data-parallel shards
  holds: 8 on the CPU, 0 on GPU/TPU, and 0 whenever ``unpad_multiple`` is set (unpadding's blocks
  take the whole batch) or the batch does not split evenly over the shards;
* ``global_norm``: `resolve_global_norm` (the clip's and the logged norms in ~10 grouped reductions
  on NVIDIA GPUs when no parameter is split over devices; one reduction a parameter elsewhere).

The model section's fields are resolved against the model it describes (`described_model`: its
size's table with the section's fields on top), so a shared block and the head width count as they
will; the resolved section is then checked by building that `BertConfig`.

A saved model record (a checkpoint's meta, ``save_orbax``'s ``bert_config.json``) is read as it was
written, not resolved again: `saved_model`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Literal

import ml_collections

from bert_jax.model.config import ATTENTION_IMPLS, DROPOUT_IMPLS, EXECUTION_FIELDS, GELU_IMPLS, NORM_IMPLS, BertConfig

log = logging.getLogger(__name__)

AUTO = "auto"
__all__ = ["EXECUTION_FIELDS"]  # the model fields "auto" may stand for (BertConfig's), re-exported
# BertConfig's own values of those fields: what a section without the key gets, and what an old
# saved record's "auto" reads as (`saved_model`).
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(BertConfig) if f.name in EXECUTION_FIELDS}
CUDNN_DTYPES = ("bfloat16", "float16")
GLOBAL_NORMS = ("per_leaf", "grouped")  # config.global_norm's choices (bert_jax/training/global_norm.py)
MESH_AXES = ("data", "fsdp", "tensor")  # what config.mesh_shape counts (bert_jax/training/sharding_rules.py's)
CPU_MICRO_BATCH = 8  # rows per micro-batch that "auto" takes on the CPU


def resolve(config: ml_collections.ConfigDict, platform: str, *, batch_shards: int | None = None
            ) -> ml_collections.ConfigDict:
    """A copy of ``config`` with every "auto" resolved for ``platform`` ("cpu", "gpu", "tpu", ...).
    ``batch_shards``: the data-parallel shards of the batch (needed to resolve an "auto"
    ``per_device_batch`` on the CPU)."""
    c = config.copy_and_resolve_references()
    model = c.model if "model" in c else None
    if model is not None:
        fields = resolve_model(model, platform)
        with model.unlocked():
            for key in EXECUTION_FIELDS:
                if key in model:
                    value = fields[key]
                    model[key] = str(value).lower() if isinstance(value, bool) else value  # scan: "true" | "false"
    if "per_device_batch" in c:  # "auto" or a number (a digit string from a flag counts)
        value = c.per_device_batch
        rows = _per_device_batch(c, platform, batch_shards) if value == AUTO else \
            resolve_per_device_batch(value, platform, rows=0)
        with c.unlocked():  # the field may hold a string ("auto"): replaced by its number
            del c["per_device_batch"]
            c.per_device_batch = rows
    if "global_norm" in c:
        with c.unlocked():
            c.global_norm = resolve_global_norm(c.global_norm, platform, params_whole=params_whole(c))
    left = auto_keys(c)
    if left:
        raise ValueError(f"config keys {left} are still 'auto' after resolving for {platform!r}")
    return c


def resolve_model(model: ml_collections.ConfigDict, platform: str) -> dict:
    """The execution fields (`EXECUTION_FIELDS`) of the model a job config's ``model`` section
    describes, resolved for ``platform`` (a field the section leaves out: `BertConfig`'s value).
    The resolved model is built once, so a section that is wrong otherwise fails here."""
    given = {**_DEFAULTS, **{k: model[k] for k in EXECUTION_FIELDS if k in model and model[k] is not None}}
    shape = described_model(model, **_DEFAULTS)  # the size's table and the section: shapes, sharing
    dtype = resolve_dtype(given["dtype"], platform)
    scan = resolve_scan(given["scan_layers"], platform, shared=shape.share_layers)
    fields = dict(
        dtype=dtype,
        scan_layers=scan,
        stacked_params=resolve_stacked_params(given["stacked_params"], platform, scanned=scan),
        attention_impl=resolve_attention(given["attention_impl"], platform, dtype=dtype, head_dim=shape.head_dim),
        dropout_impl=resolve_dropout(given["dropout_impl"], platform),
        norm_impl=resolve_norm(given["norm_impl"], platform),
        recompute_activation=resolve_recompute(given["recompute_activation"], platform),
        gelu_impl=resolve_gelu(given["gelu_impl"], platform))
    described_model(model, **fields)  # raises on anything else the section gets wrong
    return fields


def described_model(model: ml_collections.ConfigDict, **fields) -> BertConfig:
    """The `BertConfig` a job config's ``model`` section describes: its ``size``'s table with the
    section's other fields on top (None keeps the table's value), then ``fields``. The section must
    be resolved (`resolve`): an "auto" left is BertConfig's ValueError."""
    given = {k: v for k, v in model.items() if k != "size" and v is not None}
    return BertConfig.from_size(model["size"], **{**given, **fields})


def saved_model(record: dict, source: object) -> BertConfig:
    """The `BertConfig` a saved model record holds (a checkpoint's meta ``model``, ``save_orbax``'s
    ``bert_config.json`` ``config``), read as it was written: resolved when the job that wrote it
    started, not again for the platform reading it (a fine-tuning job puts its own resolved
    execution fields on top: `bert_jax.finetuning.task.model_config`). Records written before
    jobs resolved their config at the start may hold "auto" in the execution fields: those read as
    `BertConfig`'s own values (float32, scanned, XLA attention, ``jax.random`` dropout), which run on
    any platform and load the same weights, with a warning naming ``source`` (the file)."""
    old = [k for k in EXECUTION_FIELDS if record.get(k) == AUTO]
    if old:
        log.warning("%s: model fields %s are 'auto' (saved before configs were resolved at the start): "
                    "read as %s", source, old, {k: _DEFAULTS[k] for k in old})
        record = {**record, **{k: _DEFAULTS[k] for k in old}}
    return BertConfig.from_dict(record)


def platform_kind(platform: str) -> str:
    """"cuda"/"gpu" → "gpu" (NVIDIA), "rocm" stays "rocm"; the rest as given, lower case."""
    p = platform.lower()
    return "gpu" if p in ("cuda", "gpu") else p


def resolve_dtype(name: str, platform: str) -> str:
    """``"auto"`` → bfloat16 on GPU/TPU, float32 elsewhere (CPU); any other name unchanged."""
    if name != AUTO:
        return name
    return "bfloat16" if platform_kind(platform) in ("gpu", "rocm", "tpu") else "float32"


def resolve_attention(impl: str, platform: str, *, dtype: str = "bfloat16", head_dim: int = 64) -> str:
    """``"auto"`` → "cudnn" on an NVIDIA GPU when the dtype and head width are ones its flash
    attention takes (bfloat16/float16; a multiple of 8, at most 128); "splash" (Pallas splash
    attention) on a TPU where the kernel takes the head width and dtype (`splash.splash_applies`;
    a length it does not take runs on XLA); else "xla". Packed rows stay on XLA even under "cudnn"
    (`bert_jax.model.layers.attention_call`). An explicit "splash" off a TPU is the kernel in Pallas'
    interpreter on the CPU ("splash_interpret": how its tests check it), an error on a GPU; an explicit
    "flash" (the GPU's Pallas kernel with dropout inside, bert_jax/model/flash.py) likewise: the kernel
    on an NVIDIA GPU, interpreted on the CPU, an error on a TPU or ROCm; any other explicit choice is
    returned unchanged."""
    if impl not in (AUTO, *ATTENTION_IMPLS):
        raise ValueError(f"attention_impl {impl!r}: expected one of {(AUTO, *ATTENTION_IMPLS)}")
    kind = platform_kind(platform)
    home = {"splash": "tpu", "flash": "gpu"}.get(impl)
    if home and kind != home:
        if kind != "cpu":
            other = {"tpu": "xla or splash", "gpu": "xla or cudnn"}.get(kind, "xla")
            raise ValueError(f"attention_impl {impl!r} is the {home.upper()}'s kernel: on {platform!r} use {other}")
        return f"{impl}_interpret"  # the CPU: Pallas' interpreter
    if impl != AUTO:
        return impl
    if kind == "tpu":
        from bert_jax.model.splash import splash_applies

        return "splash" if splash_applies(128, head_dim, dtype) else "xla"
    cudnn_ok = kind == "gpu" and dtype in CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= 128
    return "cudnn" if cudnn_ok else "xla"


def resolve_norm(impl: str, platform: str) -> str:
    """``"auto"`` → "xla" on every platform (the fused kernel is not measured on a GPU yet); an explicit
    "fused" (bert_jax/model/fused_norm.py, Pallas lowered to Triton) is the kernel on an NVIDIA GPU,
    the kernel in Pallas' interpreter on the CPU ("fused_interpret"), an error on a TPU or ROCm."""
    if impl not in (AUTO, *NORM_IMPLS):
        raise ValueError(f"norm_impl {impl!r}: expected one of {(AUTO, *NORM_IMPLS)}")
    kind = platform_kind(platform)
    if impl == "fused" and kind != "gpu":
        if kind != "cpu":
            raise ValueError(f"norm_impl 'fused' is the NVIDIA GPU's kernel: on {platform!r} use xla")
        return "fused_interpret"
    return "xla" if impl == AUTO else impl


def resolve_dropout(impl: str, platform: str) -> Literal["jax", "fused"]:
    """``"auto"`` → "fused" (Threefry unrolled into the dropout's fusion) on the CPU, where JAX's own
    Threefry runs as a rolled loop, else "jax" (``jax.random.bernoulli``); an explicit choice unchanged."""
    if impl not in (AUTO, *DROPOUT_IMPLS):
        raise ValueError(f"dropout_impl {impl!r}: expected one of {(AUTO, *DROPOUT_IMPLS)}")
    if impl != AUTO:
        return impl  # type: ignore[return-value]
    return "fused" if platform_kind(platform) == "cpu" else "jax"


def resolve_recompute(value: bool | str, platform: str) -> bool:
    """``"auto"`` → True (the dense feed-forward's activation recomputed in the backward) on the CPU and
    NVIDIA GPUs: XLA's GPU program of BERT-base's step moves 7.2 GB less with it (−4.6% of its least
    time on an H100) and holds 4.5 GiB less, the CPU's step holds less at the same speed; False on
    TPUs, where libtpu's estimate of the step rose 6.8% with it, and ROCm (not measured)
    (docs/records.md, "GELU recomputed in the backward"). True / False (or "true" / "false")
    unchanged."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if value == AUTO:
        return platform_kind(platform) in ("cpu", "gpu")
    if not isinstance(value, bool):
        raise ValueError(f"recompute_activation {value!r}: expected True, False or 'auto'")
    return value


def resolve_gelu(impl: str, platform: str) -> str:
    """``"auto"`` → "erf" (x · (1 + erf(x / √2)) / 2 in float32) on NVIDIA GPUs, where ``jax.nn.gelu``'s
    erfc, two divisions and one or two exponentials an element, made the feed-forward's GELU forward and
    backward 3-4x slower than their memory traffic (13% of BERT-base's step on an H200); "erfc"
    (``jax.nn.gelu``) elsewhere: the CPU's programs stay those that made the demo's table, and a TPU
    kept float32 intermediates through erf (docs/records.md, "GELU through erf on a GPU"). An explicit
    choice unchanged."""
    if impl not in (AUTO, *GELU_IMPLS):
        raise ValueError(f"gelu_impl {impl!r}: expected one of {(AUTO, *GELU_IMPLS)}")
    if impl != AUTO:
        return impl
    return "erf" if platform_kind(platform) == "gpu" else "erfc"


def resolve_global_norm(kind: str, platform: str, *, params_whole: bool) -> str:
    """``"auto"`` → "grouped" (bert_jax/training/global_norm.py: ~10 reductions for BERT-base's ~200
    parameters, each read once) on NVIDIA GPUs when ``params_whole`` (no parameter split over devices:
    grouping concatenates them), where the per-parameter reductions were 360 kernels and 1.3 ms of
    BERT-base's step on an H200 (docs/records.md, "The global norms in grouped reductions"); else
    "per_leaf" (``optax.tree.norm``). An explicit choice unchanged."""
    if kind not in (AUTO, *GLOBAL_NORMS):
        raise ValueError(f"global_norm {kind!r}: expected one of {(AUTO, *GLOBAL_NORMS)}")
    if kind != AUTO:
        return kind
    return "grouped" if platform_kind(platform) == "gpu" and params_whole else "per_leaf"


def params_whole(c: ml_collections.ConfigDict) -> bool:
    """Whether ``c``'s sharding rules put every parameter axis on mesh axes of one device in
    ``c.mesh_shape`` (an axis of -1 takes the devices left: counted as more than one)."""
    if "mesh_shape" not in c or "sharding_rules" not in c:
        return True
    size = dict(zip(MESH_AXES, tuple(c.mesh_shape), strict=False))
    for name, axes in c.sharding_rules:
        if name == "batch" or name.startswith("activation_") or axes is None:
            continue
        if any(size.get(a, -1) != 1 for a in ((axes,) if isinstance(axes, str) else axes)):
            return False
    return True


def resolve_scan(scan_layers: bool | str, platform: str, *, shared: bool = False) -> bool:
    """``"auto"`` → False (unrolled blocks, each with its own parameters) on the CPU, where that
    measured ~10% faster than the scan over stacked parameters, and on an NVIDIA GPU, where the scan's
    loop copies and per-iteration launches cost BERT-base ~9% of its step (docs/records.md, "One GPU");
    True (one ``lax.scan``: compile time and program size independent of depth) on TPUs and ROCm,
    and for ALBERT's ``shared`` block, which has no per-layer parameters to gain. True / False (or
    "true" / "false", as ml_collections holds them) unchanged."""
    if isinstance(scan_layers, str) and scan_layers.lower() in ("true", "false"):
        return scan_layers.lower() == "true"
    if scan_layers == AUTO:
        return shared or platform_kind(platform) not in ("cpu", "gpu")
    if not isinstance(scan_layers, bool):
        raise ValueError(f"scan_layers {scan_layers!r}: expected True, False or 'auto'")
    return scan_layers


def resolve_stacked_params(value: bool | str, platform: str, *, scanned: bool) -> bool:
    """``"auto"`` → True (unrolled blocks slice their parameters from the stacked arrays: 93 arrays of
    state for BERT-base instead of 621, the optimizer's update in 30 kernels instead of 218, the same
    least time: docs/records.md, "Unrolled blocks over stacked parameters") on an NVIDIA GPU when the
    blocks are unrolled; False on the CPU (each block's own arrays: the slicing and the gradients'
    write-back into a stack measured slower there), elsewhere, and when ``scanned`` (a scan reads
    the stack either way). True / False (or "true" / "false") unchanged."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if value == AUTO:
        return not scanned and platform_kind(platform) == "gpu"
    if not isinstance(value, bool):
        raise ValueError(f"stacked_params {value!r}: expected True, False or 'auto'")
    return value


def resolve_per_device_batch(value: int | str, platform: str, *, rows: int) -> int:
    """Rows per batch shard in one micro-batch of the training step (0: the whole batch at once).
    ``rows``: the batch's rows per shard. ``"auto"`` → 8 on the CPU when ``rows`` is a larger
    multiple of 8 (BERT-base at batch 32 measured ~1.2x faster as four accumulated micro-batches of
    8 than as one batch, with less temporary memory; docs/records.md), else 0; on GPU/TPU 0 (a
    large batch is what keeps their matrix units busy). A number (int or its string, as config
    flags give it) is returned as an int."""
    bad = ValueError(f"per_device_batch {value!r}: expected 'auto' or rows per device >= 0 (0: no micro-batches)")
    if isinstance(value, str) and value != AUTO:
        if not value.strip().isdigit():
            raise bad
        value = int(value)
    if value == AUTO:
        cpu = platform_kind(platform) == "cpu"
        return CPU_MICRO_BATCH if cpu and rows > CPU_MICRO_BATCH and rows % CPU_MICRO_BATCH == 0 else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad
    return value


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

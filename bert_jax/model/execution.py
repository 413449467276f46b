"""What "auto" means per platform: the compute dtype, the attention implementation, how dropout
draws its bits, whether the layers are scanned and how many rows a micro-batch takes.

Pure functions of the platform's name ("cpu", "gpu"/"cuda", "rocm", "tpu"), so the choice is tested
for every platform on a CPU. Nothing here asks which backend runs: a job resolves its config once,
at its start (`bert_jax.resolve`, `BertConfig.for_platform`), and the model reads concrete values.

    resolve_dtype("auto", "gpu")  # "bfloat16"; "float32" on CPU
    resolve_attention("auto", "gpu", dtype="bfloat16", head_dim=64)  # "cudnn"; "xla" on CPU/TPU
    resolve_dropout("auto", "cpu")  # "fused" (bert_jax/model/dropout.py); "jax" on GPU/TPU
    resolve_scan("auto", "cpu")  # False: unrolled blocks with per-layer parameters; True (scan) on GPU/TPU
    resolve_per_device_batch("auto", "cpu", rows=32)  # 8: four micro-batches of 8; 0 (whole batch) on GPU/TPU

cuDNN's flash attention (``jax.nn.dot_product_attention(implementation="cudnn")``) runs on NVIDIA
GPUs in bfloat16/float16 with a head width that is a multiple of 8 (at most 128; 256 on Hopper),
and takes a padding mask as per-row key lengths (rows padded at the end, as every pipeline here
builds them). Packed rows (a block-diagonal mask) stay on XLA even under "cudnn"
(`attention_call`), as do float32 and everything on CPU and TPU.
"""

from __future__ import annotations

from typing import Literal

MaskKind = Literal["padding", "packed"]
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "explicit")
CUDNN_DTYPES = ("bfloat16", "float16")
DROPOUT_IMPLS = ("auto", "jax", "fused")


def platform_kind(platform: str) -> str:
    """"cuda"/"gpu" → "gpu" (NVIDIA), "rocm" stays "rocm"; the rest as given, lower case."""
    p = platform.lower()
    return "gpu" if p in ("cuda", "gpu") else p


def resolve_dtype(name: str, platform: str) -> str:
    """``"auto"`` → bfloat16 on GPU/TPU, float32 elsewhere (CPU); any other name unchanged."""
    if name != "auto":
        return name
    return "bfloat16" if platform_kind(platform) in ("gpu", "rocm", "tpu") else "float32"


def mask_kind(mask_shape: tuple[int, ...]) -> MaskKind:
    """A [batch, 1, 1, length] key mask is padding; a [batch, 1, length, length] one is packed rows."""
    return "padding" if mask_shape[-2] == 1 else "packed"


def resolve_attention(impl: str, platform: str, *, dtype: str = "bfloat16",
                      head_dim: int = 64) -> Literal["xla", "cudnn", "explicit"]:
    """``"auto"`` → "cudnn" on an NVIDIA GPU when the dtype and head width are ones its flash
    attention takes, else "xla"; an explicit choice is returned unchanged."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl {impl!r}: expected one of {ATTENTION_IMPLS}")
    if impl != "auto":
        return impl  # type: ignore[return-value]
    cudnn_ok = (platform_kind(platform) == "gpu" and dtype in CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= 128)
    return "cudnn" if cudnn_ok else "xla"


def attention_call(impl: str, kind: MaskKind) -> Literal["xla", "cudnn", "explicit"]:
    """What a resolved ``attention_impl`` runs for a mask of ``kind``: "cudnn" takes padding masks
    (as key lengths) and leaves packed rows, which no key lengths express, to XLA."""
    if impl not in ("xla", "cudnn", "explicit"):
        raise ValueError(f"attention_impl {impl!r} is not resolved: expected xla, cudnn or explicit "
                         "(BertConfig.for_platform resolves 'auto')")
    return "xla" if impl == "cudnn" and kind == "packed" else impl  # type: ignore[return-value]


def resolve_dropout(impl: str, platform: str) -> Literal["jax", "fused"]:
    """``"auto"`` → "fused" (Threefry unrolled into the dropout's fusion) on the CPU, where JAX's own
    Threefry runs as a rolled loop, else "jax" (``jax.random.bernoulli``); an explicit choice unchanged."""
    if impl not in DROPOUT_IMPLS:
        raise ValueError(f"dropout_impl {impl!r}: expected one of {DROPOUT_IMPLS}")
    if impl != "auto":
        return impl  # type: ignore[return-value]
    return "fused" if platform_kind(platform) == "cpu" else "jax"


def resolve_scan(scan_layers: bool | str, platform: str, *, shared: bool = False) -> bool:
    """``"auto"`` → False (unrolled blocks, each with its own parameters) on the CPU, where that
    measured ~10% faster than the scan over stacked parameters (docs/records.md); True (one
    ``lax.scan``: compile time and program size independent of depth) on GPU/TPU, and for ALBERT's
    ``shared`` block, which has no per-layer parameters to gain."""
    if scan_layers == "auto":
        return shared or platform_kind(platform) != "cpu"
    if not isinstance(scan_layers, bool):
        raise ValueError(f"scan_layers {scan_layers!r}: expected True, False or 'auto'")
    return scan_layers


CPU_MICRO_BATCH = 8  # rows per micro-batch that "auto" takes on the CPU


def resolve_per_device_batch(value: int | str, platform: str, *, rows: int) -> int:
    """Rows per batch shard in one micro-batch of the training step (0: the whole batch at once).
    ``rows``: the batch's rows per shard. ``"auto"`` → 8 on the CPU when ``rows`` is a larger
    multiple of 8 (BERT-base at batch 32 measured ~1.2x faster as four accumulated micro-batches of
    8 than as one batch, with less temporary memory; docs/records.md), else 0; on GPU/TPU 0 (a
    large batch is what keeps their matrix units busy). A number (int or its string, as config
    flags give it) is returned as an int."""
    bad = ValueError(f"per_device_batch {value!r}: expected 'auto' or rows per device >= 0 (0: no micro-batches)")
    if isinstance(value, str) and value != "auto":
        if not value.strip().isdigit():
            raise bad
        value = int(value)
    if value == "auto":
        cpu = platform_kind(platform) == "cpu"
        return CPU_MICRO_BATCH if cpu and rows > CPU_MICRO_BATCH and rows % CPU_MICRO_BATCH == 0 else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad
    return value

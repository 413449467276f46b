"""What "auto" resolves to per platform (dtype, attention implementation), tested without a GPU;
resolved once (`BertConfig.for_platform`, `bert_jax.resolve`), never by the model."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.execution import attention_call, mask_kind, resolve_attention, resolve_dtype
from bert_jax.model.models import create
from tests.model.test_model import batch


@pytest.mark.parametrize("platform,expected", [("cpu", "float32"), ("gpu", "bfloat16"), ("cuda", "bfloat16"),
                                               ("rocm", "bfloat16"), ("tpu", "bfloat16")])
def test_auto_dtype_per_platform(platform, expected):
    assert resolve_dtype("auto", platform) == expected
    assert resolve_dtype("float32", platform) == "float32"  # an explicit choice is kept
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"


@pytest.mark.parametrize("platform,kind,dtype,head_dim,expected", [
    ("gpu", "padding", "bfloat16", 64, "cudnn"),
    ("cuda", "padding", "float16", 128, "cudnn"),
    ("gpu", "packed", "bfloat16", 64, "xla"),  # block-diagonal mask: no key lengths express it
    ("gpu", "padding", "float32", 64, "xla"),  # cuDNN flash attention has no float32
    ("gpu", "padding", "bfloat16", 12, "xla"),  # head width not a multiple of 8
    ("gpu", "padding", "bfloat16", 256, "xla"),
    ("rocm", "padding", "bfloat16", 64, "xla"),  # no cuDNN on AMD
    ("tpu", "padding", "bfloat16", 64, "xla"),
    ("cpu", "padding", "float32", 64, "xla"),
    ("cpu", "packed", "bfloat16", 64, "xla"),
])
def test_auto_attention_per_platform_and_mask(platform, kind, dtype, head_dim, expected):
    assert attention_call(resolve_attention("auto", platform, dtype=dtype, head_dim=head_dim), kind) == expected


def test_explicit_attention_choice_is_kept_and_unknown_rejected():
    for impl in ("xla", "cudnn", "explicit"):
        assert resolve_attention(impl, "cpu", dtype="float32") == impl
    with pytest.raises(ValueError, match="attention_impl 'flash'"):
        resolve_attention("flash", "gpu")
    with pytest.raises(ValueError, match="attention_impl 'auto' is not resolved"):
        attention_call("auto", "padding")


def test_mask_kind_from_shape():
    assert mask_kind((4, 1, 1, 128)) == "padding"
    assert mask_kind((4, 1, 128, 128)) == "packed"


def test_auto_is_resolved_before_the_model_is_built():
    """The configs default to "auto"; a model takes only resolved values (on CPU: float32, XLA
    attention, unrolled, fused dropout), so the numbers are those of the explicit config."""
    from bert_jax.config_args import load_config_file

    assert load_config_file("pretrain", "size=tiny,synthetic=True").model.dtype == "auto"
    assert load_config_file("glue", "task=sst2,runlocal=True").model.dtype == "auto"
    cfg = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32).deterministic()
    auto = dataclasses.replace(cfg, dtype="auto", scan_layers="auto", attention_impl="auto", dropout_impl="auto")
    assert auto.unresolved == ["dtype", "scan_layers", "attention_impl", "dropout_impl"]
    with pytest.raises(ValueError, match=r"BertConfig fields \['dtype', 'scan_layers', 'attention_impl', "
                       r"'dropout_impl'\] are 'auto'"):
        create(BertEncoder, auto)
    cpu = auto.for_platform("cpu")
    assert (cpu.dtype, cpu.scan_layers, cpu.attention_impl, cpu.dropout_impl) == ("float32", False, "xla", "fused")
    tpu = auto.for_platform("tpu")
    assert (tpu.dtype, tpu.scan_layers, tpu.attention_impl, tpu.dropout_impl) == ("bfloat16", True, "xla", "jax")
    assert auto.for_platform("gpu").attention_impl == "cudnn"  # "auto" dtype: bfloat16 on a GPU
    assert dataclasses.replace(auto, dtype="float32").for_platform("gpu").attention_impl == "xla"  # no float32
    args = batch()
    run = nnx.jit(lambda m, *a: m(*a).sequence_output)
    np.testing.assert_array_equal(run(create(BertEncoder, cpu), *args),
                                  run(create(BertEncoder, dataclasses.replace(cfg, scan_layers=False)), *args))


def test_resolved_cudnn_takes_key_lengths(monkeypatch):
    """Resolved for a GPU, the config says bfloat16 and cuDNN, which gets each row's key length;
    cuDNN is stood in for by XLA given the same lengths, which must give the padded mask's outputs."""
    cfg = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32, num_heads=2).deterministic()
    ids, mask, seg = batch()
    real = np.asarray(mask)[..., None] > 0
    on_cpu = nnx.jit(lambda m: m(ids, mask, seg).sequence_output)(
        create(BertEncoder, dataclasses.replace(cfg, dtype="bfloat16")))

    calls = []
    original = jax.nn.dot_product_attention

    def cudnn_stand_in(q, k, v, mask=None, key_value_seq_lengths=None, implementation=None):
        calls.append((implementation, None if key_value_seq_lengths is None else key_value_seq_lengths.shape))
        impl = None if implementation == "cudnn" else implementation
        return original(q, k, v, mask=mask, key_value_seq_lengths=key_value_seq_lengths, implementation=impl)

    monkeypatch.setattr(jax.nn, "dot_product_attention", cudnn_stand_in)
    gpu = dataclasses.replace(cfg, dtype="auto", attention_impl="auto").for_platform("gpu")
    assert (gpu.compute_dtype, gpu.attention_impl) == (jax.numpy.bfloat16, "cudnn")
    on_gpu = nnx.jit(lambda m: m(ids, mask, seg).sequence_output)(create(BertEncoder, gpu))
    assert calls and all(c == ("cudnn", (3,)) for c in calls)
    np.testing.assert_allclose(np.where(real, np.asarray(on_gpu, np.float32), 0),
                               np.where(real, np.asarray(on_cpu, np.float32), 0), atol=2e-2)


def test_a_job_config_resolves_once(load_config):
    """`bert_jax.resolve`: no "auto" left in what config.json records; micro-batches from the
    rows per batch shard on the CPU, none on an accelerator."""
    from bert_jax.resolve import auto_keys, resolve

    c = load_config("pretrain", "size=tiny,runlocal")
    assert set(auto_keys(c)) >= {"model.dtype", "model.scan_layers", "per_device_batch"}
    cpu = resolve(c, "cpu", batch_shards=1)
    assert auto_keys(cpu) == [] and auto_keys(c)  # a copy: the given config keeps its "auto"
    assert (cpu.model.dtype, cpu.model.scan_layers, cpu.model.dropout_impl) == ("float32", "false", "fused")
    assert cpu.per_device_batch == (8 if c.batch_size > 8 and c.batch_size % 8 == 0 else 0)
    tpu = resolve(c, "tpu")
    assert (tpu.model.dtype, tpu.model.scan_layers, tpu.per_device_batch) == ("bfloat16", "true", 0)
    assert "auto" not in cpu.to_json()
    with pytest.raises(ValueError, match="needs the batch's data-parallel shards"):
        resolve(c, "cpu")


@pytest.mark.parametrize("value,platform,rows,expected", [
    ("auto", "cpu", 32, 8), ("auto", "cpu", 16, 8), ("auto", "cpu", 8, 0), ("auto", "cpu", 12, 0),
    ("auto", "gpu", 32, 0), ("auto", "tpu", 256, 0), ("auto", "cuda", 64, 0),
    ("16", "cpu", 32, 16), ("0", "cpu", 32, 0), (4, "tpu", 32, 4), (0, "cpu", 32, 0)])
def test_per_device_batch_per_platform(value, platform, rows, expected):
    from bert_jax.model.execution import resolve_per_device_batch

    assert resolve_per_device_batch(value, platform, rows=rows) == expected


@pytest.mark.parametrize("bad", ["eight", "-1", -2, 1.5, True])
def test_per_device_batch_rejects_what_is_not_a_row_count(bad):
    from bert_jax.model.execution import resolve_per_device_batch

    with pytest.raises(ValueError, match="per_device_batch .*expected 'auto' or rows per device"):
        resolve_per_device_batch(bad, "cpu", rows=32)

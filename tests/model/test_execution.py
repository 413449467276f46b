"""What "auto" resolves to per platform (dtype, attention implementation), tested without a GPU."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.execution import mask_kind, resolve_attention, resolve_dtype
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
    assert resolve_attention("auto", platform, kind, dtype=dtype, head_dim=head_dim) == expected


def test_explicit_attention_choice_is_kept_and_unknown_rejected():
    for impl in ("xla", "cudnn", "explicit"):
        assert resolve_attention(impl, "cpu", "packed", dtype="float32") == impl
    with pytest.raises(ValueError, match="attention_impl 'flash'"):
        resolve_attention("flash", "gpu", "padding")


def test_mask_kind_from_shape():
    assert mask_kind((4, 1, 1, 128)) == "padding"
    assert mask_kind((4, 1, 128, 128)) == "packed"


def test_auto_is_the_cpu_default_unchanged():
    """The configs default to "auto"; on CPU it is float32 and XLA attention: the same numbers."""
    from bert_jax.config_args import load_config_file

    assert load_config_file("pretrain", "size=tiny,synthetic=True").model.dtype == "auto"
    assert load_config_file("glue", "task=sst2,runlocal=True").model.dtype == "auto"
    cfg = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32).deterministic()
    auto = dataclasses.replace(cfg, dtype="auto")
    assert auto.compute_dtype == np.float32
    args = batch()
    run = nnx.jit(lambda m, *a: m(*a).sequence_output)
    np.testing.assert_array_equal(run(create(BertEncoder, auto), *args), run(create(BertEncoder, cfg), *args))


def test_auto_takes_cudnn_with_key_lengths_on_a_gpu(monkeypatch):
    """On a (pretended) GPU, "auto" resolves bfloat16 and calls cuDNN with each row's key length;
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

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax.nn, "dot_product_attention", cudnn_stand_in)
    auto = dataclasses.replace(cfg, dtype="auto")
    assert auto.compute_dtype == jax.numpy.bfloat16
    on_gpu = nnx.jit(lambda m: m(ids, mask, seg).sequence_output)(create(BertEncoder, auto))
    assert calls and all(c == ("cudnn", (3,)) for c in calls)
    np.testing.assert_allclose(np.where(real, np.asarray(on_gpu, np.float32), 0),
                               np.where(real, np.asarray(on_cpu, np.float32), 0), atol=2e-2)


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

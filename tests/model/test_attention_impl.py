"""The attention kernel a resolved ``attention_impl`` runs for a mask (bert_jax/model/layers.py:
`attention_call`, `mask_kind`); what "auto" resolves to per platform is tests/test_resolve.py's."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.layers import attention_call, mask_kind
from bert_jax.model.models import create
from bert_jax.resolve import resolve
from tests.model.test_model import batch


@pytest.mark.parametrize("impl,kind,expected", [
    ("cudnn", "padding", "cudnn"), ("cudnn", "packed", "xla"),  # no key lengths express packed rows
    ("xla", "padding", "xla"), ("xla", "packed", "xla"), ("explicit", "packed", "explicit")])
def test_attention_call_per_mask(impl, kind, expected):
    assert attention_call(impl, kind) == expected


def test_attention_call_takes_resolved_values_only():
    with pytest.raises(ValueError, match="attention_impl 'auto'.*bert_jax.resolve"):
        attention_call("auto", "padding")


def test_mask_kind_from_shape():
    assert mask_kind((4, 1, 1, 128)) == "padding"
    assert mask_kind((4, 1, 128, 128)) == "packed"


def test_a_job_resolved_for_the_cpu_runs_its_explicit_config(load_config):
    """The configs default to "auto"; resolved for the CPU (float32, XLA attention, unrolled, fused
    dropout) the model computes what the explicit config does."""
    from bert_jax.resolve import described_model

    c = load_config("pretrain", "size=tiny,synthetic=True")
    assert c.model.dtype == "auto"
    assert load_config("glue", "task=sst2,runlocal=True").model.dtype == "auto"
    with c.unlocked():
        c.model.max_position_embeddings = 32
    cpu = described_model(resolve(c, "cpu", batch_shards=1).model, vocab_size=97).deterministic()
    assert (cpu.dtype, cpu.scan_layers, cpu.attention_impl, cpu.dropout_impl) == ("float32", False, "xla", "fused")
    cfg = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32).deterministic()
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
    gpu = dataclasses.replace(cfg, dtype="bfloat16", attention_impl="cudnn")  # what "auto" is on a GPU
    assert (gpu.compute_dtype, gpu.attention_impl) == (jax.numpy.bfloat16, "cudnn")
    on_gpu = nnx.jit(lambda m: m(ids, mask, seg).sequence_output)(create(BertEncoder, gpu))
    assert calls and all(c == ("cudnn", (3,)) for c in calls)
    np.testing.assert_allclose(np.where(real, np.asarray(on_gpu, np.float32), 0),
                               np.where(real, np.asarray(on_cpu, np.float32), 0), atol=2e-2)

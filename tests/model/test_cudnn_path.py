"""What a GPU computes under ``attention_impl="cudnn"``, checked on the CPU: every call the model makes
to ``jax.nn.dot_product_attention(implementation="cudnn")`` is routed to XLA with the same arguments
(tests/fixtures/attention_paths.py), and the encoder must give the XLA path's outputs on real tokens,
for BERT (padded rows) and ModernBERT (padded rows longer than the local window), scanned and
unrolled. The same comparison against real cuDNN runs on a GPU in tests/gpu/test_gpu_numerics.py."""

import dataclasses

import numpy as np
import pytest
from flax import nnx

from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import create
from tests.fixtures.attention_paths import encoder_config, rows


@pytest.mark.parametrize("family", ["bert", "modernbert"])
@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
def test_cudnn_path_computes_the_xla_path(family, scan, cudnn_routed_to_xla):
    cfg = encoder_config(family, scan)
    ids, mask, seg = rows()
    run = nnx.jit(lambda m: m(ids, mask, seg).sequence_output)
    xla = np.asarray(run(create(BertEncoder, cfg)), np.float32)  # [batch, length, hidden]
    assert {impl for impl, _ in cudnn_routed_to_xla} == {"xla"}  # the XLA path never asks for cuDNN
    cudnn_routed_to_xla.clear()
    gpu = np.asarray(run(create(BertEncoder, dataclasses.replace(cfg, attention_impl="cudnn"))), np.float32)
    kinds = {impl for impl, _ in cudnn_routed_to_xla}
    assert "cudnn" in kinds and ({"cudnn", "xla"} if family == "modernbert" else {"cudnn"}) == kinds
    assert all(given == ("key_value_seq_lengths",) for impl, given in cudnn_routed_to_xla if impl == "cudnn")
    real = mask[..., None] > 0
    gap = np.abs(np.where(real, gpu - xla, 0)).max()
    assert gap <= 1e-2, f"the cuDNN path differs from XLA's by {gap} on real tokens"
    if family == "modernbert":  # the windows matter here: every layer global would be far off
        every_global = dataclasses.replace(cfg, local_window=0)
        other = np.asarray(run(create(BertEncoder, every_global)), np.float32)
        assert np.abs(np.where(real, other - xla, 0)).max() > 0.5

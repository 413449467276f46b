"""Embedding look-ups gather rows of the float32 tables and cast them after, so that their gradients
are float32 scatter-adds: a bfloat16 scatter-add runs as compare-and-swap loops on a GPU (the 2-row
token-type table's took 95 ms of a 157 ms BERT-base step on an H200: docs/records.md, "One GPU")."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.layers import lookup
from bert_jax.model.models import create
from tests.model.test_model import batch


def test_embedding_gradients_are_float32_scatters():
    cfg = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32, dtype="bfloat16")
    graphdef, params = nnx.split(create(BertEncoder, cfg), nnx.Param)
    ids, mask, seg = batch()

    def f(params):
        return nnx.merge(graphdef, params)(ids, mask, seg).sequence_output.astype(jnp.float32).sum()

    hlo = jax.jit(jax.grad(f)).lower(params).as_text(dialect="hlo")
    scatters = re.findall(r"= (\w+)\[[\d,]*\](?:\{[^}]*\})? scatter\(", hlo)
    assert len(scatters) == 3 and set(scatters) == {"f32"}, scatters  # word, position and token-type tables


def test_lookup_gives_the_rows_in_the_compute_dtype():
    table = nnx.Embed(5, 3, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    ids = jnp.array([[4, 0], [1, 1]])
    rows = lookup(table, ids)
    assert rows.shape == (2, 2, 3) and rows.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(rows, np.float32), np.asarray(table(ids), np.float32))

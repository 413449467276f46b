"""The attention cost tool (bert_jax/benchmark/aot_attention.py): its XLA attention core computes
what the encoder's attention computes, and (with libtpu, `pip
install -e '.[tpu]'`; skipped without) each variant compiles for a TPU and the dropout-free core's
FLOPs are the matmuls'. Its argument errors are in tests/fixtures/bad_inputs.py."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.benchmark import aot_attention

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="needs libtpu: pip install -e '.[tpu]'")


def test_xla_core_is_masked_attention():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 8, 2, 4)), jnp.float32) for _ in range(3))
    mask = jnp.asarray(np.arange(8)[None] < np.array([[8], [5]]), jnp.int32)  # row 1: 3 padding tokens
    got = aot_attention.xla_attention(q, k, v, mask, jax.random.key(0), rate=0.0)
    want = jax.nn.dot_product_attention(q, k, v, mask=(mask[:, None, None, :] > 0))
    np.testing.assert_allclose(got, want, atol=1e-5)
    dropped = aot_attention.xla_attention(q, k, v, mask, jax.random.key(0), rate=0.5)
    assert not np.allclose(dropped, got)  # the dropout is applied


@needs_libtpu
def test_each_variant_compiles_for_a_tpu(tmp_path):
    rows = aot_attention.main(["--topology", "v5e-1", "--size", "tiny", "--rows", "8", "--seq_len", "128",
                               "--output", str(tmp_path / "a.jsonl")])
    assert [r["variant"] for r in rows] == list(aot_attention.VARIANTS)
    assert all(r["compiler_ms"] > 0 and r["step_share_ms"] == pytest.approx(2 * r["compiler_ms"], abs=0.01)
               for r in rows)
    no_dropout = rows[1]
    matmuls = 3 * 2 * 2 * 8 * 2 * 128 * 128 * 64  # forward + 2x backward; 2 einsums; rows x heads x T x S x head_dim
    assert matmuls <= no_dropout["flops"] <= 1.5 * matmuls, no_dropout["flops"] / matmuls
    assert rows[2]["flops"] < 0.1 * matmuls  # the cost analysis does not see inside the Mosaic kernel
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 3

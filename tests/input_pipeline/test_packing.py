"""Sequence packing: the packer's layout, and a packed row computes what its examples compute alone."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import packed_mask, packed_positions
from bert_jax.pretraining import objective as ts
from input_pipeline.pretraining.packing import pack_examples
from input_pipeline.pretraining.synthetic import SyntheticBatches

# A large initialiser: at 0.02 attention is nearly uniform and a row's losses barely depend on
# which tokens it attends to, so a mask that let examples see each other would go unnoticed.
CFG = BertConfig.from_size("tiny", vocab_size=97, max_position_embeddings=32, hidden_dropout_prob=0.0,
                           attention_dropout_prob=0.0, initializer_range=0.5)


def examples(n=12, seed=3):
    """n examples of 6-12 tokens (with 2 predictions at most), right-padded to length 32."""
    b = next(SyntheticBatches(batch_size=n, seq_len=12, max_predictions=2, vocab_size=97, seed=seed))
    return {k: np.pad(v, ((0, 0), (0, 20))) if k in ("input_ids", "input_mask", "segment_ids") else v
            for k, v in b.items()}


def test_positions_and_mask_of_packed_rows():
    ids = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(packed_positions(ids), [[0, 1, 2, 0, 1, 0, 1], [0, 1, 2, 3, 4, 5, 6]])
    m = np.asarray(packed_mask(ids))[0, 0]  # [query, key]
    assert m[0, :3].all() and not m[0, 3:].any()  # example 1 sees itself only
    assert m[4, 3:5].all() and not m[4, :3].any() and not m[4, 5:].any()  # example 2 likewise
    assert not m[:, 5:].any()  # nobody attends to padding


def test_pack_examples_layout():
    batch = examples()
    packed, used = pack_examples(batch, num_rows=3, max_examples=3, max_predictions=5)
    lengths = batch["input_mask"].sum(1)
    assert 6 < used < 12 and packed["nsp_weights"].sum() == used  # 6-12 tokens each: 2-3 per row of 32
    assert packed["input_mask"].sum() == lengths[:used].sum()  # every token of the used examples, once
    assert packed["masked_lm_weights"].sum() == batch["masked_lm_weights"][:used].sum()
    for r in range(3):
        for k in np.nonzero(packed["nsp_weights"][r])[0]:
            tokens = packed["input_ids"][r][packed["example_ids"][r] == k + 1]
            start = packed["cls_positions"][r, k]
            assert packed["example_ids"][r, start] == k + 1 and (start == 0 or packed["example_ids"][r, start - 1] == k)
            i = [j for j in range(used)
                 if lengths[j] == len(tokens) and (batch["input_ids"][j, : len(tokens)] == tokens).all()]
            assert len(i) == 1 and packed["next_sentence_labels"][r, k] == batch["next_sentence_labels"][i[0]]
    real = packed["masked_lm_weights"] > 0
    np.testing.assert_array_equal(np.take_along_axis(packed["input_ids"], packed["masked_lm_positions"], 1)[real] > 0,
                                  True)  # predictions point at real tokens
    with pytest.raises(ValueError, match="right-padded"):
        pack_examples({**batch, "input_mask": batch["input_mask"][:, ::-1]}, 2)


def test_packed_rows_give_the_losses_of_their_examples_alone():
    """The MLM and NSP sums of a packed batch equal those of the same examples one per row: no
    attention crosses examples and positions restart, so each example is computed as if alone."""
    batch = examples()
    packed, used = pack_examples(batch, num_rows=4, max_examples=3, max_predictions=6)
    assert used > 8  # most rows hold several examples
    alone = {k: v[:used] for k, v in batch.items()}
    params = ts.init_state(CFG, "nsp", __import__("optax").sgd(0.1), 0).params
    loss = jax.jit(functools.partial(ts._loss, graphdef=ts.model_graphdef(CFG, "nsp"), rng=None,
                                     deterministic=True))
    _, a = loss(params, batch=jax.tree.map(jnp.asarray, alone))
    _, b = loss(params, batch=jax.tree.map(jnp.asarray, packed))
    assert float(a["examples"]) == float(b["examples"]) == used
    for k in ("mlm_loss_sum", "mlm_weight", "mlm_correct", "nsp_loss_sum", "nsp_correct"):
        np.testing.assert_allclose(float(b[k]), float(a[k]), rtol=2e-5, err_msg=k)


def test_synthetic_lengths_follow_short_seq_prob():
    def lengths(p):
        data = SyntheticBatches(batch_size=400, seq_len=64, max_predictions=10, vocab_size=97, short_seq_prob=p)
        return next(data)["input_mask"].sum(1)

    assert (lengths(0.0) == 64).all()
    short = lengths(1.0)
    assert short.min() >= 2 and short.max() <= 64 and 25 < short.mean() < 40  # uniform in [2, 64]
    assert 0.8 < (lengths(0.1) == 64).mean() < 0.97
    default = next(SyntheticBatches(batch_size=400, seq_len=64, max_predictions=10, vocab_size=97))["input_mask"]
    assert default.sum(1).min() >= 32  # the default stays uniform in [S/2, S]

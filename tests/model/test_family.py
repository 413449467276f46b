"""The family's switches on the one encoder: factorised embeddings, shared layers, position offset,
one token type, and ELECTRA's generator + discriminator."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bert_jax.model import electra
from bert_jax.model.config import BertConfig, count_params
from bert_jax.model.electra import ElectraForPreTraining, electra_generator_config, replace_masked
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.heads import ReplacedTokenHead
from bert_jax.model.models import BertForPreTraining, create
from bert_jax.pretraining import objective as ts

TINY = dict(vocab_size=50, max_position_embeddings=24, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)


def n_params(model) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def inputs(batch=2, length=10, vocab=50, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, (batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[1, 7:] = 0
    seg = np.zeros((batch, length), np.int32)
    seg[:, 5:] = 1
    return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(seg)


# The papers' parameter counts (ALBERT Table 1, 30k vocabulary; ELECTRA Table 6, 30,522). ALBERT's
# xlarge and xxlarge come out at 58.7M and 222.6M with the architecture the paper describes (the
# released Hugging Face checkpoints have the same counts); the table rounds loosely there.
PAPER = {"albert-base": (30000, 12e6, 0.03), "albert-large": (30000, 18e6, 0.03),
         "albert-xlarge": (30000, 60e6, 0.03), "albert-xxlarge": (30000, 235e6, 0.06),
         "electra-small": (30522, 14e6, 0.04), "electra-base": (30522, 110e6, 0.02)}


@pytest.mark.parametrize("size", sorted(PAPER))
def test_parameter_counts_match_the_papers(size):
    vocab, paper, tol = PAPER[size]
    cfg = BertConfig.from_size(size, vocab_size=vocab)
    model = nnx.eval_shape(lambda: BertEncoder(cfg, rngs=nnx.Rngs(0)))
    assert n_params(model) == count_params(cfg)
    assert abs(count_params(cfg) - paper) / paper < tol, (size, count_params(cfg))


def test_count_params_matches_every_switch():
    cfg = BertConfig.from_size("tiny", **TINY, embedding_size=16, share_layers=True)
    model = nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0), objective="sop"))
    assert n_params(model) == count_params(cfg, with_mlm=True, with_nsp=True)
    gen = electra_generator_config(cfg, 0.5)
    electra = nnx.eval_shape(lambda: ElectraForPreTraining(dataclasses.replace(cfg, use_pooler=False),
                                                           rngs=nnx.Rngs(0), generator_fraction=0.5))
    disc = count_params(dataclasses.replace(cfg, use_pooler=False))
    rtd = cfg.hidden_size * cfg.hidden_size + cfg.hidden_size + cfg.hidden_size + 1
    assert n_params(electra) == disc + count_params(gen, with_embeddings=False, with_mlm=True) + rtd


def test_factorised_embeddings_project_and_decode_through_e():
    cfg = BertConfig.from_size("tiny", **TINY, embedding_size=16)
    model = create(BertForPreTraining, cfg, objective="none")
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (50, 16)
    assert params["bert"]["embedding_projection"]["kernel"].shape == (16, 128)
    assert params["mlm"]["transform"]["kernel"].shape == (128, 16)
    ids, mask, seg = inputs()
    out = model(ids, mask, seg)
    assert out.encoder.sequence_output.shape == (2, 10, 128) and out.mlm_logits.shape == (2, 10, 50)
    # No projection when E = hidden (BERT): the same parameter names as before the switch existed.
    plain = nnx.state(nnx.eval_shape(lambda: BertEncoder(BertConfig.from_size("tiny", **TINY), rngs=nnx.Rngs(0))))
    assert "embedding_projection" not in nnx.to_pure_dict(plain)


@pytest.mark.parametrize("scan", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_shared_layers_hold_one_block_applied_num_layers_times(scan):
    """ALBERT: the stored stack has one block; the output equals an unshared encoder whose every
    layer is a copy of that block."""
    cfg = BertConfig.from_size("tiny", **TINY, num_layers=3, share_layers=True, scan_layers=scan)
    shared = create(BertEncoder, cfg)
    sp = nnx.to_pure_dict(nnx.state(shared, nnx.Param))
    assert sp["layers"]["ffn"]["intermediate"]["kernel"].shape[0] == 1
    unshared = create(BertEncoder, dataclasses.replace(cfg, share_layers=False, scan_layers=True))  # stacked
    up = nnx.state(unshared, nnx.Param)
    copied = jax.tree.map(lambda s: s, sp)
    copied["layers"] = jax.tree.map(lambda a: jnp.repeat(a, 3, axis=0), sp["layers"])
    nnx.replace_by_pure_dict(up, copied)
    nnx.update(unshared, up)
    ids, mask, seg = inputs()
    a = shared(ids, mask, seg).sequence_output
    b = unshared(ids, mask, seg).sequence_output
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_position_offset_shifts_the_position_table():
    cfg = BertConfig.from_size("tiny", **TINY)
    offset = dataclasses.replace(cfg, position_offset=2)
    a, b = create(BertEncoder, cfg), create(BertEncoder, offset)
    state = nnx.state(b, nnx.Param)
    pure = nnx.to_pure_dict(nnx.state(a, nnx.Param))
    table = pure["embeddings"]["position_embeddings"]["embedding"]
    pure["embeddings"]["position_embeddings"]["embedding"] = jnp.concatenate([table[-2:], table[:-2]])
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(b, state)
    ids, mask, seg = inputs()
    np.testing.assert_allclose(np.asarray(a(ids, mask, seg).sequence_output),
                               np.asarray(b(ids, mask, seg).sequence_output), atol=1e-5)
    with pytest.raises(ValueError, match="position_offset"):
        b(*inputs(length=23))


def test_one_token_type_ignores_segment_ids():
    """RoBERTa has one token type: pair features with segment ids 1 run, as if all were 0."""
    model = create(BertEncoder, BertConfig.from_size("tiny", **TINY, type_vocab_size=1))
    ids, mask, seg = inputs()
    out = model(ids, mask, seg).sequence_output
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(np.asarray(out), np.asarray(model(ids, mask, jnp.zeros_like(seg)).sequence_output))


def test_generator_config_follows_the_paper():
    small = electra_generator_config(BertConfig.from_size("electra-small"), 0.25)
    assert (small.hidden_size, small.num_heads, small.intermediate_size, small.embed_dim) == (64, 1, 256, 128)
    base = electra_generator_config(BertConfig.from_size("electra-base"), 1 / 3)
    assert (base.hidden_size, base.num_heads, base.intermediate_size, base.embed_dim) == (256, 4, 1024, 768)
    with pytest.raises(ValueError, match="generator_fraction"):
        electra_generator_config(BertConfig.from_size("electra-small"), 0.0)


def test_replace_masked_writes_only_real_slots():
    ids = jnp.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    out = replace_masked(ids, jnp.array([[1, 0], [3, 2]]), jnp.array([[1.0, 0.0], [1.0, 1.0]]),
                         jnp.array([[20, 21], [22, 23]]))
    np.testing.assert_array_equal(np.asarray(out), [[1, 20, 3, 4], [5, 6, 23, 22]])


def electra_batch():
    ids, mask, seg = inputs()
    ids = ids.at[:, 1].set(7)  # both rows' first masked token is 7
    positions = jnp.array([[1, 3, 0], [1, 4, 6]], jnp.int32)
    weights = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    original = jnp.take_along_axis(ids, positions, axis=1)
    masked = replace_masked(ids, positions, weights, jnp.full_like(positions, 3))  # 3 = [MASK]
    return dict(input_ids=masked, input_mask=mask, segment_ids=seg, masked_lm_positions=positions,
                masked_lm_ids=original, masked_lm_weights=weights, next_sentence_labels=jnp.zeros(2, jnp.int32))


def run(model, b, key=0):
    return model(b["input_ids"], b["input_mask"], b["segment_ids"], b["masked_lm_positions"], b["masked_lm_ids"],
                 b["masked_lm_weights"], sample_key=jax.random.key(key))


@pytest.mark.slow  # ~20 s; ELECTRA step by step: tests/training/test_trajectory_golden.py
def test_electra_shares_embeddings_and_labels_replacements():
    cfg = BertConfig.from_size("tiny", **TINY, embedding_size=32, use_pooler=False)
    model = create(ElectraForPreTraining, cfg, generator_fraction=0.5)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert set(params) == {"bert", "generator", "mlm", "rtd"}
    assert "embeddings" not in params["generator"]  # one set of tables, the discriminator's
    assert params["generator"]["embedding_projection"]["kernel"].shape == (32, 64)
    b = electra_batch()
    out = run(model, b)
    assert out.mlm_logits.shape == (2, 3, 50) and out.rtd_logits.shape == (2, 10)
    labels = np.asarray(out.rtd_labels)
    assert labels[0, [0, 2, 4, 5, 6]].sum() == 0 and labels[1, [0, 2, 3, 5]].sum() == 0  # never masked
    assert labels[1, 7:].sum() == 0  # padding is never labelled
    assert labels.sum() > 0  # an untrained generator replaces some of the 5 masked tokens
    # A generator that can only say 7 puts the original back at the one masked slot (7) per row:
    # nothing is replaced, every label is 0.
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)
    pure["mlm"]["output_bias"] = jnp.full(50, -1e4).at[7].set(0.0)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    b["masked_lm_weights"] = jnp.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    b["input_ids"] = b["input_ids"].at[0, 3].set(b["masked_lm_ids"][0, 1]).at[1, 4].set(b["masked_lm_ids"][1, 1])
    b["input_ids"] = b["input_ids"].at[1, 6].set(b["masked_lm_ids"][1, 2])
    assert np.asarray(run(model, b, key=1).rtd_labels).sum() == 0


def test_electra_untied_generator_has_and_decodes_through_its_own_tables(tmp_path):
    """tie_embeddings=False (the reference's untied_generator_embeddings): the generator's own tables
    under generator/embeddings, its MLM logits move with them and not with the discriminator's, and the
    HF export's generator carries them."""
    from bert_jax.interop import convert

    cfg = BertConfig.from_size("tiny", **TINY, embedding_size=32, use_pooler=False)
    model = create(ElectraForPreTraining, cfg, generator_fraction=0.5, tie_embeddings=False)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    own = params["generator"]["embeddings"]["word_embeddings"]["embedding"]
    assert own.shape == params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape
    b = electra_batch()
    before = np.asarray(run(model, b).mlm_logits)
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)
    pure["bert"]["embeddings"]["word_embeddings"]["embedding"] = jnp.zeros_like(own)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    np.testing.assert_array_equal(np.asarray(run(model, b).mlm_logits), before)  # not the discriminator's
    pure["generator"]["embeddings"]["word_embeddings"]["embedding"] = 2 * own
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)
    assert not np.allclose(np.asarray(run(model, b).mlm_logits), before)
    from safetensors.numpy import load_file

    _, gen_dir = convert.export_electra(model, cfg, tmp_path)
    exported = load_file(gen_dir / "model.safetensors")
    np.testing.assert_array_equal(exported["electra.embeddings.word_embeddings.weight"], 2 * np.asarray(own))


@pytest.mark.slow  # ~30 s; ELECTRA's losses step by step: tests/training/test_trajectory_golden.py
def test_electra_loss_is_mlm_plus_weighted_bce_and_sampling_passes_no_gradient():
    cfg = BertConfig.from_size("tiny", **TINY, embedding_size=32, use_pooler=False)
    settings = dict(generator_fraction=0.5, rtd_weight=50.0)
    state = ts.init_state(cfg, "rtd", optax.sgd(0.1), 0, settings)
    graphdef = ts.model_graphdef(cfg, "rtd", settings)
    b = electra_batch()

    def part(name):
        return lambda p: ts._loss(p, graphdef, b, jax.random.key(3), False)[1][name]

    @jax.jit
    def losses(params):  # the loss, its parts, and each part's gradient: one program
        loss, sums = ts._loss(params, graphdef, b, jax.random.key(3), False)
        return (loss, ts.metrics_from_sums(sums), jax.grad(part("rtd_loss_sum"))(params),
                jax.grad(part("mlm_loss_sum"))(params))

    loss, s, rtd_grads, mlm_grads = losses(state.params)
    np.testing.assert_allclose(float(loss), float(s["mlm_loss"] + 50.0 * s["rtd_loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(s["loss"]), float(loss), rtol=1e-6)
    assert float(optax.tree.norm(rtd_grads["generator"]) + optax.tree.norm(rtd_grads["mlm"])) == 0.0
    assert float(optax.tree.norm(rtd_grads["bert"])) > 0.0  # the discriminator's loss stays in it
    # The generator's MLM loss trains the shared tables, not the discriminator's blocks.
    assert float(optax.tree.norm(mlm_grads["bert"]["embeddings"])) > 0.0
    assert float(optax.tree.norm(mlm_grads["bert"]["layers"])) == 0.0


def test_rtd_settings_need_the_rtd_objective():
    with pytest.raises(ValueError, match="objective 'rtd'"):
        ts.pretraining_model(BertConfig.from_size("tiny", **TINY), "nsp", dict(rtd_weight=1.0))


def test_discriminator_starts_at_the_replaced_fraction(monkeypatch):
    """``rtd_prior`` p starts the output bias at log(p / (1 - p)), so the untrained discriminator
    already predicts p on every token; 0 keeps the paper's zero bias."""
    cfg = BertConfig.from_size("tiny", **TINY, use_pooler=False)
    for prior in (0.15, 0.25):
        head = ReplacedTokenHead(cfg, rngs=nnx.Rngs(0), prior=prior)
        np.testing.assert_allclose(float(jax.nn.sigmoid(head.prediction.bias[0])), prior, rtol=1e-6)
    assert float(ReplacedTokenHead(cfg, rngs=nnx.Rngs(0)).prediction.bias[0]) == 0.0
    with pytest.raises(ValueError, match="prior=1.5"):
        ReplacedTokenHead(cfg, rngs=nnx.Rngs(0), prior=1.5)
    head = ReplacedTokenHead(cfg, rngs=nnx.Rngs(0), prior=0.15)
    hidden = jax.random.normal(jax.random.key(1), (4, 16, cfg.hidden_size))  # [batch, length, embed], LayerNorm'd-like
    p = jax.nn.sigmoid(jax.jit(lambda h: head(h))(hidden))  # [batch, length]
    assert abs(float(p.mean()) - 0.15) < 0.02, float(p.mean())
    built = []  # the setting reaches the discriminator's head (built abstractly: an eager build costs ~6 s)
    monkeypatch.setattr(electra, "ReplacedTokenHead",
                        lambda *a, **kw: built.append(kw["prior"]) or ReplacedTokenHead(*a, **kw))
    nnx.eval_shape(lambda: ElectraForPreTraining(cfg, rngs=nnx.Rngs(0), rtd_prior=0.15))
    assert built == [0.15]

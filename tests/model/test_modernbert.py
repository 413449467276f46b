"""ModernBERT's switches on the one encoder: rotary positions, local attention windows alternating with
global layers, pre-LayerNorm with a final norm, GeGLU, no biases; sizes, per-layer data in the scan,
scanned and unrolled alike (parity with transformers: tests/interop/test_modernbert.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util

from bert_jax.model import axes
from bert_jax.model.config import BertConfig, count_params
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.layers import local_mask, rotary
from bert_jax.model.models import BertForPreTraining, create
from tests.fixtures.params import assert_same_params, params_of

# 3 layers (global, local, local), a window of 6 (+-3) in rows of 16.
SMALL = dict(num_layers=3, vocab_size=64, max_position_embeddings=32, local_window=6, initializer_range=0.2)


def small(**kw) -> BertConfig:
    return BertConfig.from_size("modernbert-tiny", **(SMALL | kw))


def n_params(model) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def inputs(batch=2, length=16, vocab=64, seed=0):
    ids = np.random.default_rng(seed).integers(5, vocab, (batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[1, 11:] = 0
    return jnp.asarray(ids), jnp.asarray(mask), jnp.zeros((batch, length), jnp.int32)


def test_sizes_match_the_paper():
    """base 149M, large 395M (Warner et al., 2024); the model holds what count_params counts, layer 0's
    unused attention norm included (hidden_size parameters more than Hugging Face's)."""
    for size, paper in (("modernbert-base", 149e6), ("modernbert-large", 395e6)):
        cfg = BertConfig.from_size(size)
        assert abs(count_params(cfg) - paper) / paper < 0.003, (size, count_params(cfg))
    # transformers 5.23's ModernBertModel / ModernBertForMaskedLM of the same sizes (counted on the meta device)
    base, large = BertConfig.from_size("modernbert-base"), BertConfig.from_size("modernbert-large")
    assert (count_params(base), count_params(base, with_mlm=True)) == (149_014_272 + 768, 149_655_232 + 768)
    assert count_params(large) == 394_781_696 + 1024
    cfg = small(use_bias=True, norm_bias=True)
    for c in (cfg, small()):
        model = nnx.eval_shape(lambda c=c: BertForPreTraining(c, rngs=nnx.Rngs(0), objective="none"))
        assert n_params(model) == count_params(c, with_mlm=True)
    assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size, base.vocab_size,
            base.max_position_embeddings) == (22, 768, 12, 1152, 50368, 8192)
    assert (large.num_layers, large.hidden_size, large.num_heads, large.intermediate_size) == (28, 1024, 16, 2624)


def test_layer_specs():
    """Layer i is global iff i % global_every == 0 (window 0, the global theta); BERT has none."""
    specs = BertConfig.from_size("modernbert-base").layer_specs()
    assert specs.window.tolist() == [0 if i % 3 == 0 else 128 for i in range(22)]
    assert specs.rope_theta.tolist() == [160_000.0 if i % 3 == 0 else 10_000.0 for i in range(22)]
    assert specs.norm_input.tolist() == [False] + [True] * 21
    assert specs.at(1) == (128, 10_000.0, True) and type(specs.at(1).window) is int
    assert BertConfig.from_size("tiny").layer_specs() is None
    assert small(local_window=0).layer_specs().window.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="even head width"):
        BertConfig(hidden_size=30, num_heads=2, position_embedding="rotary")
    with pytest.raises(ValueError, match="position_offset 0"):
        BertConfig(position_embedding="rotary", position_offset=2)
    with pytest.raises(ValueError, match=r"invalid BertConfig field\(s\) \['norm_position', 'ffn'\]"):
        BertConfig(norm_position="sandwich", ffn="swiglu")


def test_local_mask_and_rotary():
    mask = jnp.ones((1, 1, 1, 6), bool)
    band = np.asarray(local_mask(mask, 4))[0, 0]  # +-2
    assert band.shape == (6, 6) and band[0].tolist() == [1, 1, 1, 0, 0, 0] and band[3].tolist() == [0, 1, 1, 1, 1, 1]
    assert local_mask(mask, 0) is mask  # a global layer's mask, untouched
    traced = jax.jit(local_mask)(mask, jnp.int32(0))  # a scanned layer's window is data: 0 = global
    assert np.asarray(traced).all() and traced.shape == (1, 1, 6, 6)
    # Rotation by position: q·k depends on the positions' difference only.
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 8))
    def score(pq, pk):
        return float(jnp.sum(rotary(q, jnp.array([[pq]]), 10_000.0) * rotary(k, jnp.array([[pk]]), 10_000.0)))
    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5) and score(3, 1) != pytest.approx(score(3, 2))


def test_scanned_and_unrolled_compute_the_same():
    """Per-layer data (window, theta, layer 0's unnormed input) as scan inputs or Python values: one model."""
    cfg = small(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
    ids, mask, seg = inputs()
    scanned = create(BertForPreTraining, cfg, objective="none")
    unrolled = create(BertForPreTraining, dataclasses.replace(cfg, scan_layers=False), objective="none")
    stacked = {k.replace("layers/0/", "layers/"): v for k, v in params_of(unrolled).items() if "layers/" not in k
               or "layers/0/" in k}
    assert stacked.keys() == params_of(scanned).keys()
    run = nnx.jit(lambda m, *a: m(*a).mlm_logits)
    np.testing.assert_allclose(run(scanned, ids, mask, seg), run(unrolled, ids, mask, seg), atol=1e-5)
    # remat keeps an unrolled block's per-layer values static
    remat = create(BertForPreTraining, dataclasses.replace(cfg, scan_layers=False, remat_policy="full"),
                   objective="none")
    assert_same_params(remat, unrolled)
    np.testing.assert_allclose(run(remat, ids, mask, seg), run(unrolled, ids, mask, seg), atol=1e-6)


# unrolled: ~9 s; its layers' windows also in tests/model/test_cudnn_path.py (unrolled, ModernBERT)
@pytest.mark.parametrize("scan", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["scanned", "unrolled"])
def test_windows_positions_and_the_first_norm(scan):
    """A window as wide as the row is global attention (a narrow one is not); rotary outputs do not move with a constant
    shift of the positions (absolute ones do); layer 0's attention norm gets no gradient."""
    # one rotary base for both kinds of layer: only the window tells them apart
    cfg = small(scan_layers=scan, hidden_dropout_prob=0.0, attention_dropout_prob=0.0, local_rope_theta=160_000.0)
    ids, mask, seg = inputs()
    model = create(BertEncoder, cfg)

    def variant(**kw):  # the same parameters under another pattern (windows are not parameters)
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: BertEncoder(dataclasses.replace(cfg, **kw), rngs=nnx.Rngs(0))))
        return nnx.merge(graphdef, nnx.state(model))

    @nnx.jit
    def forward(m, shift):
        return m(ids, mask, seg, position_ids=jnp.arange(16)[None] + shift).sequence_output

    def run(m, shift=0):
        return np.asarray(forward(m, shift))[np.asarray(mask).astype(bool)]  # real positions

    global_ = run(variant(global_every=1))
    np.testing.assert_allclose(run(variant(local_window=32)), global_, atol=1e-5)
    assert np.abs(run(model) - global_).max() > 1e-3
    np.testing.assert_allclose(run(model, 5), run(model), atol=2e-5)

    grads = nnx.grad(lambda m: jnp.sum(m(ids, mask, seg).sequence_output ** 2))(model)
    g = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(
        nnx.to_pure_dict(nnx.state(grads, nnx.Param)), sep="/").items()}
    first = g["layers/attention_norm/scale"][0] if scan else g["layers/0/attention_norm/scale"]
    later = g["layers/attention_norm/scale"][1] if scan else g["layers/1/attention_norm/scale"]
    assert not first.any() and later.any()


def test_training_mode_bfloat16_and_axes():
    """Dropout (deterministic=False), bfloat16 compute, and every parameter named for sharding (the
    GeGLU kernel [embed, 2, mlp] is split like a feed-forward kernel)."""
    cfg = small(hidden_dropout_prob=0.1, attention_dropout_prob=0.1, dtype="bfloat16")
    ids, mask, seg = inputs()
    for scan in (True, False):
        model = create(BertForPreTraining, dataclasses.replace(cfg, scan_layers=scan), objective="none")
        out = nnx.jit(lambda m: m(ids, mask, seg, deterministic=False, rngs=nnx.Rngs(dropout=1)).mlm_logits)(model)
        assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()
    model = create(BertForPreTraining, cfg, objective="none")
    layer_axis = axes.stacked_axes(nnx.state(model, nnx.Param))
    assert layer_axis["bert"]["layers"]["ffn"]["intermediate"]["kernel"] == 0
    assert "bias" not in layer_axis["bert"]["layers"]["ffn"]["intermediate"]
    spec = nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(model, nnx.Param)))
    assert tuple(spec["bert"]["layers"]["ffn"]["intermediate"]["kernel"]) == (axes.LAYERS, axes.EMBED, None, axes.MLP)
    assert model.bert.embeddings.position_embeddings is None and model.bert.embeddings.token_type_embeddings is None


def test_modernbert_initialises_as_its_reference_and_bert_as_bert():
    """ModernBERT (init_method "megatron", as the reference's ``full_megatron`` with cutoff 2): every
    matrix N(0, 0.02²) cut at ±2σ (std 0.88σ), the blocks' output projections σ = 0.02 / sqrt(2L);
    BERT keeps Google's, the same cut normal with σ = 0.02 everywhere."""
    def weights(cfg):
        params = nnx.to_pure_dict(nnx.state(create(BertForPreTraining, cfg, objective="none"), nnx.Param))
        return {"/".join(map(str, k)): np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}

    layers = 22
    mb = weights(BertConfig.from_size("modernbert-mini", vocab_size=4096, num_layers=layers, local_window=8))
    sigma, cut = 0.02, 0.02 * 0.87962566  # the std of N(0, σ²) cut at ±2σ
    out = [k for k in mb if k.endswith(("attention/output/kernel", "ffn/output/kernel"))]
    inner = [k for k in mb if k.endswith("kernel") and k not in out] + ["bert/embeddings/word_embeddings/embedding"]
    assert len(out) == 2 and len(inner) >= 5
    for k in inner:
        assert np.abs(mb[k]).max() <= 2 * sigma and abs(mb[k].std() - cut) < 0.03 * cut, (k, mb[k].std())
    for k in out:
        scaled = sigma / np.sqrt(2 * layers)
        assert np.abs(mb[k]).max() <= 2 * scaled and abs(mb[k].std() - 0.8796 * scaled) < 0.03 * scaled, k
    bert = weights(BertConfig.from_size("mini", vocab_size=4096))
    for k in ("bert/layers/attention/output/kernel", "bert/layers/ffn/intermediate/kernel"):
        assert np.abs(bert[k]).max() <= 2 * sigma and abs(bert[k].std() - cut) < 0.03 * cut, k

"""The BERT family through Hugging Face directories: parity with transformers on tiny random ALBERT,
ELECTRA (discriminator and generator) and RoBERTa (tests/golden, `make golden`), exact export round
trips, strict loading, clear refusals, and fine-tuning's warm start from each."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util
from safetensors.numpy import load_file

from bert_jax.finetuning.warm_start import open_init_checkpoint
from bert_jax.interop import convert, pretrained
from bert_jax.model.config import BertConfig
from bert_jax.model.electra import ElectraDiscriminator, ElectraForPreTraining
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import BertForPreTraining
from bert_jax.model.weights import CheckpointMismatchError
from tests.fixtures.hf_dirs import write_dir
from tests.fixtures.params import params_of

# network -> (our model class, objective, model_type, HF architecture)
EXPECTED = {
    "albert": (BertForPreTraining, "sop", "albert", "AlbertForPreTraining"),
    "electra_discriminator": (ElectraDiscriminator, None, "electra", "ElectraForPreTraining"),
    "electra_generator": (BertForPreTraining, "none", "electra", "ElectraForMaskedLM"),
    "roberta": (BertForPreTraining, "none", "roberta", "RobertaForMaskedLM"),
}
NETWORKS = list(EXPECTED)
ENCODER_ARCH = {"albert": "AlbertModel", "electra": "ElectraModel", "roberta": "RobertaModel"}


def outputs_of(model, inputs) -> dict[str, np.ndarray]:
    """hidden [B, L, H] and whatever heads the model has: pooled, mlm, pair, rtd (one compiled call)."""

    def run(m, ids, mask, seg):
        if isinstance(m, ElectraDiscriminator):
            enc = m.bert(ids, mask, seg)
            out = {"rtd": m.rtd(enc.sequence_output)}
        else:
            res = m(ids, mask, seg)
            enc, out = res.encoder, {"mlm": res.mlm_logits}
            if res.nsp_logits is not None:
                out["pair"] = res.nsp_logits
        out["hidden"] = enc.sequence_output
        if enc.pooled_output is not None:
            out["pooled"] = enc.pooled_output
        return out

    res = nnx.jit(run)(model, *(jnp.asarray(a) for a in inputs))
    return {k: np.asarray(v) for k, v in res.items()}


def encoder_params(ckpt) -> dict[str, np.ndarray]:
    """The checkpoint's encoder in our names and layout (the table's view, no model built)."""
    params, _, _ = convert.to_our_names(ckpt.tensors, ckpt.config, source="hf", model_type=ckpt.model_type)
    return {k.removeprefix("bert/"): v for k, v in params.items() if k.startswith("bert/")}


def assert_params_equal(model, expected: dict[str, np.ndarray]):
    ours = params_of(model)
    assert sorted(ours) == sorted(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(np.asarray(ours[k]), v, err_msg=k)


@pytest.fixture(scope="module")
def family_model(family_golden):
    """``family_model(network)`` -> (checkpoint, model from `build_model`), built once: several tests
    read the same model (those that change it work on an ``nnx.clone``)."""
    cache = {}

    def load(network):
        if network not in cache:
            ckpt = pretrained.read_checkpoint(f"hf:{family_golden(network).directory}")
            cache[network] = ckpt, pretrained.build_model(ckpt, config=ckpt.config.deterministic())
        return cache[network]

    return load


@pytest.mark.parametrize("network", [pytest.param(n, marks=pytest.mark.slow) if n == "electra_generator" else n
                                     for n in NETWORKS])  # the generator: ~18 s, the discriminator's code
def test_matches_transformers(network, family_golden, family_model):
    """Every output of the HF model within 1e-4 (float32) at real positions, and the right model."""
    g = family_golden(network)
    cls, objective, model_type, arch = EXPECTED[network]
    assert g.config["architectures"] == [arch]
    ckpt, model = family_model(network)
    assert ckpt.model_type == model_type
    assert type(model) is cls and getattr(model, "objective", None) == objective
    ours = outputs_of(model, g.inputs)
    assert ours.keys() == g.outputs.keys()
    real = g.inputs[1].astype(bool)
    for k, ref in g.outputs.items():
        per_token = ref.shape[:2] == real.shape
        np.testing.assert_allclose(ours[k][real] if per_token else ours[k], ref[real] if per_token else ref,
                                   atol=1e-4, err_msg=k)


def test_family_configs(family_golden):
    """What each config.json becomes: factorised embeddings, shared block, RoBERTa's positions."""
    cfg = {n: pretrained.read_checkpoint(f"hf:{family_golden(n).directory}").config for n in NETWORKS}
    a, d, g, r = (cfg[n] for n in NETWORKS)
    assert (a.embedding_size, a.hidden_size, a.share_layers, a.num_layers) == (16, 32, True, 3)
    assert a.hidden_act == "gelu_new"
    assert (d.embedding_size, d.hidden_size, d.use_pooler, d.share_layers) == (16, 32, False, False)
    assert (g.embedding_size, g.hidden_size, g.num_heads, g.intermediate_size) == (None, 16, 2, 32)  # E == hidden
    assert (r.position_offset, r.type_vocab_size, r.layer_norm_eps, r.max_position_embeddings) == (2, 1, 1e-5, 40)
    assert a.position_offset == d.position_offset == g.position_offset == 0 and not r.share_layers


@pytest.mark.parametrize("network", NETWORKS)
def test_export_gives_back_the_hf_files(network, family_golden, family_model, tmp_path):
    """Import -> export writes the very tensors transformers saved, under the same names, and a
    config.json of the same family; importing that again gives the same parameters."""
    g = family_golden(network)
    _, _, model_type, arch = EXPECTED[network]
    ckpt, model = family_model(network)
    # The generator (E == hidden, no pair head) has a plain BERT config: its family must be named.
    convert.export_hf(model, ckpt.config, tmp_path, model_type=ckpt.model_type)
    written = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(written) == sorted(g.tensors)
    for k, v in g.tensors.items():
        np.testing.assert_array_equal(written[k], v, err_msg=k)
    hf_cfg = json.loads((tmp_path / "config.json").read_text())
    assert hf_cfg["model_type"] == model_type and hf_cfg["architectures"] == [arch]
    for k in ("embedding_size", "pad_token_id", "type_vocab_size", "layer_norm_eps", "max_position_embeddings",
              "hidden_act", "num_hidden_groups", "inner_group_num", "hidden_size", "intermediate_size"):
        assert hf_cfg.get(k) == g.config.get(k), k
    again = pretrained.read_checkpoint(f"hf:{tmp_path}")
    assert again.config == ckpt.config and again.heads == ckpt.heads and again.model_type == ckpt.model_type
    params, unmatched, _ = convert.to_our_names(again.tensors, again.config, source="hf", model_type=model_type)
    assert unmatched == []
    assert_params_equal(model, params)


@pytest.mark.parametrize("network", [pytest.param("albert", marks=pytest.mark.slow),  # ~13 s each
                                     pytest.param("electra_discriminator", marks=pytest.mark.slow), "roberta"])
def test_encoder_alone(network, family_golden, tmp_path):
    """with_heads=False gives the encoder; exported alone it is HF's base model (no prefix)."""
    g = family_golden(network)
    ckpt = pretrained.read_checkpoint(f"hf:{g.directory}")
    encoder = pretrained.build_model(ckpt, with_heads=False)
    assert isinstance(encoder, BertEncoder)
    assert_params_equal(encoder, encoder_params(ckpt))
    convert.export_hf(encoder, ckpt.config, tmp_path)
    hf_cfg = json.loads((tmp_path / "config.json").read_text())
    assert hf_cfg["architectures"] == [ENCODER_ARCH[hf_cfg["model_type"]]]
    base = f"{hf_cfg['model_type']}."
    assert sorted(load_file(str(tmp_path / "model.safetensors"))) == sorted(
        k.removeprefix(base) for k in g.tensors if k.startswith(base))
    again = pretrained.read_checkpoint(f"hf:{tmp_path}")
    assert again.config == ckpt.config and not (again.heads["mlm"] or again.heads["nsp"] or again.heads["rtd"])
    assert_params_equal(encoder, encoder_params(again))


def test_strict_loading_names_what_is_wrong(family_golden, tmp_path):
    g = family_golden("albert")
    block = "albert.encoder.albert_layer_groups.0.albert_layers.0."
    tensors = {k: v for k, v in g.tensors.items() if k != block + "ffn.bias"}
    tensors["albert.encoder.albert_layer_groups.1.albert_layers.0.ffn.bias"] = g.tensors[block + "ffn.bias"]
    with pytest.raises(CheckpointMismatchError) as e:
        pretrained.build_model(pretrained.read_checkpoint(f"hf:{write_dir(tmp_path / 'a', tensors, g.config)}"))
    assert f"missing from {tmp_path / 'a'}: {block}ffn.bias" in str(e.value)
    assert "not in the model: albert.encoder.albert_layer_groups.1.albert_layers.0.ffn.bias" in str(e.value)

    g = family_golden("electra_discriminator")
    tensors = {k: v for k, v in g.tensors.items() if k != "electra.embeddings_project.weight"}
    with pytest.raises(CheckpointMismatchError, match="missing from .*electra.embeddings_project.weight"):
        pretrained.build_model(pretrained.read_checkpoint(f"hf:{write_dir(tmp_path / 'e', tensors, g.config)}"))

    g = family_golden("roberta")
    tensors = g.tensors | {"roberta.embeddings.token_type_embeddings.weight": np.zeros((2, 32), np.float32)}
    with pytest.raises(CheckpointMismatchError, match=r"token_type_embeddings.weight: checkpoint \(2, 32\) vs "
                                                      r"model \(1, 32\)"):
        pretrained.build_model(pretrained.read_checkpoint(f"hf:{write_dir(tmp_path / 'r', tensors, g.config)}"))


def test_unsupported_configs_are_refused(family_golden, tmp_path):
    g = family_golden("albert")
    for change, message in (({"num_hidden_groups": 2}, "num_hidden_groups=2, inner_group_num=1 is not supported"),
                            ({"inner_group_num": 2}, "inner_group_num=2 is not supported"),
                            ({"embedding_size": 32}, "ALBERT with embedding_size == hidden_size"),
                            ({"model_type": "deberta"}, "model_type 'deberta' is not supported"),
                            ({"position_embedding_type": "relative_key"}, "relative_key")):
        with pytest.raises(ValueError, match=message):
            convert.config_from_hf(g.config | change, source="x/config.json")
    with pytest.raises(ValueError, match=r"missing ALBERT config key\(s\) \['embedding_size'\]"):
        convert.config_from_hf({k: v for k, v in g.config.items() if k != "embedding_size"})
    # HF RoBERTa's MLM head always applies erf-GELU; ours applies hidden_act: refused, not silently off.
    g = family_golden("roberta")
    d = write_dir(tmp_path / "r", g.tensors, g.config | {"hidden_act": "gelu_new"})
    with pytest.raises(ValueError, match=r"hidden_act='gelu_new' with an MLM head \(HF RoBERTa's MLM head always"):
        pretrained.read_checkpoint(f"hf:{d}")


def test_export_refuses_what_the_family_cannot_hold(tmp_path):
    tiny = BertConfig.from_size("tiny", vocab_size=64, max_position_embeddings=16, num_heads=4)

    def abstract(cls, cfg):  # shapes only: the refusal comes before any array is read
        return nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))

    offset = dataclasses.replace(tiny, position_offset=2)  # RoBERTa's positions: exported as roberta
    with pytest.raises(ValueError, match="not a Hugging Face RoBERTa model: a nsp head"):
        convert.export_hf(abstract(BertForPreTraining, offset), offset, tmp_path)
    factorised = dataclasses.replace(tiny, embedding_size=32)
    with pytest.raises(ValueError, match=r"not a Hugging Face ELECTRA model: a pooler \(HF ELECTRA has none"):
        convert.export_hf(abstract(BertEncoder, factorised), factorised, tmp_path)
    with pytest.raises(ValueError, match="not a Hugging Face BERT model: embedding_size=32 with hidden_size=128"):
        convert.export_hf(abstract(BertEncoder, factorised), factorised, tmp_path, model_type="bert")
    shared = dataclasses.replace(tiny, share_layers=True)
    with pytest.raises(ValueError, match="not a Hugging Face ALBERT model: embedding_size=128 with hidden_size=128"):
        convert.export_hf(abstract(BertEncoder, shared), shared, tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("network", NETWORKS)
def test_fine_tuning_warm_start(network, family_golden, family_model):
    """``init_checkpoint=hf:DIR`` restores just the encoder of each family (heads left alone)."""
    g = family_golden(network)
    warm = open_init_checkpoint(f"hf:{g.directory}")
    ckpt, model = family_model(network)
    assert warm.config == ckpt.config and warm.has_pooler == ckpt.heads["pooler"]
    target = nnx.clone(model)  # a model with heads; its encoder zeroed, its heads moved
    state = nnx.state(target, nnx.Param)
    encoder = nnx.filter_state(state, lambda path, _: path[0] == "bert")
    nnx.update(target, jax.tree.map(lambda p: jnp.zeros_like(p), encoder))
    assert not np.asarray(params_of(target)["bert/embeddings/word_embeddings/embedding"]).any()
    heads = {k: np.asarray(v) + 1 for k, v in params_of(target).items() if not k.startswith("bert/")}
    nnx.update(target, nnx.State(traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in heads.items()})))
    assert sorted(warm.load_encoder(target)) == sorted(heads)
    assert_params_equal(target.bert, encoder_params(ckpt))
    for k, v in heads.items():
        np.testing.assert_array_equal(params_of(target)[k], v)


@pytest.fixture(scope="module")
def electra_pair(family_golden):
    disc, gen = (pretrained.read_checkpoint(f"hf:{family_golden(n).directory}")
                 for n in ("electra_discriminator", "electra_generator"))
    return disc, gen, pretrained.build_electra(disc, gen, config=disc.config.deterministic())


@pytest.mark.slow  # ~20 s; each network alone matches transformers fast
def test_electra_pair_is_one_two_network_model(family_golden, electra_pair, tmp_path):
    """HF's discriminator + generator directories -> the `ElectraForPreTraining` pre-training trains
    (one shared embedding copy) holding each network's tensors; exported back, the very files."""
    disc, gen, model = electra_pair
    assert isinstance(model, ElectraForPreTraining) and model.generator.cfg.hidden_size == 16
    ours = params_of(model)
    for ckpt, rename in ((disc, lambda k: k), (gen, lambda k: k.replace("bert/layers/", "generator/layers/"))):
        params, _, _ = convert.to_our_names(ckpt.tensors, ckpt.config, source="hf", model_type="electra")
        for k, v in params.items():
            np.testing.assert_array_equal(np.asarray(ours[rename(k)]), v, err_msg=k)
    assert not any(k.startswith("generator/embedding") for k in ours)  # E == 16 == the generator's hidden

    disc_g, gen_g = family_golden("electra_discriminator"), family_golden("electra_generator")
    for directory, g in zip(convert.export_electra(model, disc.config, tmp_path), (disc_g, gen_g), strict=True):
        written = load_file(str(directory / "model.safetensors"))
        assert sorted(written) == sorted(g.tensors), directory
        for k, v in g.tensors.items():
            np.testing.assert_array_equal(written[k], v, err_msg=k)
    with pytest.raises(ValueError, match="use export_electra"):
        convert.export_hf(model, disc.config, tmp_path / "one")

    def changed(name, tensors=gen_g.tensors, config=gen_g.config):
        return pretrained.read_checkpoint(f"hf:{write_dir(tmp_path / name, tensors, config)}")

    bias = "electra.embeddings.LayerNorm.bias"
    with pytest.raises(ValueError, match=r"generator's embeddings are missing or differ .*layer_norm/bias"):
        pretrained.build_electra(disc, changed("bias", tensors=gen_g.tensors | {bias: gen_g.tensors[bias] + 1}))
    with pytest.raises(ValueError, match=r"not the generator of .* at fraction 0.5: intermediate_size=30 \(expected"):
        pretrained.build_electra(disc, changed("width", config=gen_g.config | {"intermediate_size": 30}))
    with pytest.raises(ValueError, match="expected an ELECTRA discriminator"):
        pretrained.build_electra(disc, disc)


@pytest.mark.slow
def test_electra_pair_matches_transformers(family_golden, electra_pair):
    """The two-network model's generator (on the shared embeddings) and discriminator compute HF's
    ElectraForMaskedLM and ElectraForPreTraining logits (1e-4, real positions)."""
    _, _, model = electra_pair
    disc_g, gen_g = family_golden("electra_discriminator"), family_golden("electra_generator")

    def run(m, ids, mask, seg):
        generated = m.generator(ids, mask, seg, embedding_output=m.bert.embeddings(ids, seg))
        return (m.mlm(generated.sequence_output, m.bert.embeddings.word_embeddings),  # [B, L, V]
                m.rtd(m.bert(ids, mask, seg).sequence_output))  # [B, L]

    mlm, rtd = nnx.jit(run)(model, *(jnp.asarray(a) for a in disc_g.inputs))
    real = disc_g.inputs[1].astype(bool)
    np.testing.assert_allclose(np.asarray(mlm)[real], gen_g.outputs["mlm"][real], atol=1e-4)
    np.testing.assert_allclose(np.asarray(rtd)[real], disc_g.outputs["rtd"][real], atol=1e-4)

"""Released weights: parity with transformers on a real checkpoint, round trips, TF and Orbax, errors."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.interop import convert, pretrained
from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import BertClassifier, BertForPreTraining, create
from bert_jax.model.weights import CheckpointMismatchError
from tests.fixtures.params import assert_same_params, params_of

TINY = BertConfig.from_size("tiny", vocab_size=64, max_position_embeddings=16, num_heads=4)


def test_minilm_matches_transformers(minilm_dir, minilm_golden):
    """Every layer's hidden states and attention probabilities within 1e-4 of transformers (fp32)."""
    g = minilm_golden
    ckpt = pretrained.read_checkpoint(f"hf:{minilm_dir}")
    model = pretrained.build_model(ckpt, with_heads=False, config=ckpt.config.deterministic())
    forward = nnx.jit(lambda m, ids, seg: m(ids, jnp.ones_like(ids), seg, output_hidden_states=True,
                                             output_attentions=True))
    offsets, att_offsets = g["offsets"], g["attention_offsets"]
    worst_hidden = worst_att = 0.0
    for i in range(len(offsets) - 1):
        lo, hi = offsets[i], offsets[i + 1]
        ids, seg = g["input_ids"][lo:hi][None], g["segment_ids"][lo:hi][None]
        out = forward(model, jnp.asarray(ids), jnp.asarray(seg))
        ours_h = np.asarray(out.hidden_states)[:, 0]  # [layers + 1, length, hidden]
        ref_h = g["hidden_states"][:, lo:hi]
        ours_a = np.asarray(out.attentions)[:, 0]  # [layers, heads, length, length]
        ref_a = g["attentions"][att_offsets[i]:att_offsets[i + 1]].reshape(ours_a.shape)
        worst_hidden = max(worst_hidden, float(np.abs(ours_h - ref_h).max()))
        worst_att = max(worst_att, float(np.abs(ours_a - ref_a).max()))
    assert len(offsets) - 1 >= 8
    assert worst_hidden <= 1e-4 and worst_att <= 1e-4, (worst_hidden, worst_att)


def test_hf_round_trip_is_exact(minilm_dir, tmp_path):
    ckpt = pretrained.read_checkpoint(f"hf:{minilm_dir}")
    first = pretrained.build_model(ckpt)
    convert.export_hf(first, ckpt.config, tmp_path / "out")
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "out" / "vocab.txt")
    again = pretrained.read_checkpoint(f"hf:{tmp_path / 'out'}")
    assert again.config == ckpt.config
    assert_same_params(first, pretrained.build_model(again))


@pytest.mark.slow  # ~12 s; the heads against transformers: test_tiny_pretraining_heads_match_transformers
def test_pretraining_heads_round_trip(tmp_path):
    model = create(BertForPreTraining, TINY, seed=3)
    convert.export_hf(model, TINY, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["BertForPreTraining"] and cfg["num_hidden_layers"] == 2
    ckpt = pretrained.read_checkpoint(f"hf:{tmp_path}")
    assert ckpt.heads == {"pooler": True, "mlm": True, "nsp": True, "rtd": False}
    back = pretrained.build_model(ckpt)
    assert isinstance(back, BertForPreTraining)
    assert_same_params(model, back)


def tf_names(model, cfg) -> dict[str, np.ndarray]:
    """Our parameters under Google's names and layouts, derived independently of convert.py."""
    p = params_of(model)
    d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    out = {
        "bert/embeddings/word_embeddings": p["bert/embeddings/word_embeddings/embedding"],
        "bert/embeddings/position_embeddings": p["bert/embeddings/position_embeddings/embedding"],
        "bert/embeddings/token_type_embeddings": p["bert/embeddings/token_type_embeddings/embedding"],
        "bert/embeddings/LayerNorm/gamma": p["bert/embeddings/layer_norm/scale"],
        "bert/embeddings/LayerNorm/beta": p["bert/embeddings/layer_norm/bias"],
        "bert/pooler/dense/kernel": p["bert/pooler/kernel"],
        "bert/pooler/dense/bias": p["bert/pooler/bias"],
        "cls/predictions/transform/dense/kernel": p["mlm/transform/kernel"],
        "cls/predictions/transform/dense/bias": p["mlm/transform/bias"],
        "cls/predictions/transform/LayerNorm/gamma": p["mlm/layer_norm/scale"],
        "cls/predictions/transform/LayerNorm/beta": p["mlm/layer_norm/bias"],
        "cls/predictions/output_bias": p["mlm/output_bias"],
        "cls/seq_relationship/output_weights": np.asarray(p["nsp/dense/kernel"]).T,
        "cls/seq_relationship/output_bias": p["nsp/dense/bias"],
        "global_step": np.int64(1000),
    }
    for i in range(cfg.num_layers):
        t, L = f"bert/encoder/layer_{i}/", lambda k: np.asarray(p[f"bert/layers/{k}"][i])  # noqa: B023
        for q in ("query", "key", "value"):
            out[t + f"attention/self/{q}/kernel"] = L(f"attention/{q}/kernel").reshape(d, n * h)
            out[t + f"attention/self/{q}/bias"] = L(f"attention/{q}/bias").reshape(n * h)
            out[t + f"attention/self/{q}/kernel/adam_m"] = np.zeros((d, n * h), np.float32)
        out[t + "attention/output/dense/kernel"] = L("attention/output/kernel").reshape(n * h, d)
        out[t + "attention/output/dense/bias"] = L("attention/output/bias")
        for ln, ours in (("attention/output/LayerNorm", "attention_norm"), ("output/LayerNorm", "output_norm")):
            out[t + ln + "/gamma"], out[t + ln + "/beta"] = L(f"{ours}/scale"), L(f"{ours}/bias")
        for dense, ours in (("intermediate/dense", "ffn/intermediate"), ("output/dense", "ffn/output")):
            out[t + dense + "/kernel"], out[t + dense + "/bias"] = L(f"{ours}/kernel"), L(f"{ours}/bias")
    return {k: np.asarray(v) for k, v in out.items()}


def write_tf_checkpoint(tensors: dict[str, np.ndarray], prefix) -> None:
    """A name-based TF1 checkpoint, as Google's BERT releases are."""
    import tensorflow as tf

    with tf.Graph().as_default():
        variables = [tf.compat.v1.Variable(v, name=k) for k, v in tensors.items()]
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(prefix), write_meta_graph=False)


def test_google_tf_checkpoint(tmp_path):
    model = create(BertForPreTraining, TINY, seed=5)
    write_tf_checkpoint(tf_names(model, TINY), tmp_path / "bert_model.ckpt")
    hf_cfg = convert.config_to_hf(TINY, ["BertForPreTraining"])
    (tmp_path / "bert_config.json").write_text(json.dumps(hf_cfg))
    ckpt = pretrained.read_checkpoint(f"tf:{tmp_path / 'bert_model.ckpt'}")
    assert ckpt.heads == {"pooler": True, "mlm": True, "nsp": True, "rtd": False}
    assert_same_params(model, pretrained.build_model(ckpt))


def test_orbax_round_trip_and_encoder_only_restore(tmp_path):
    model = create(BertForPreTraining, TINY, seed=7)
    pretrained.save_orbax(model, TINY, tmp_path / "ck")
    ckpt = pretrained.read_checkpoint(f"orbax:{tmp_path / 'ck'}")
    assert_same_params(model, pretrained.build_model(ckpt))
    encoder = pretrained.build_model(ckpt, with_heads=False)
    assert isinstance(encoder, BertEncoder)
    assert_same_params(model.bert, encoder)
    # A checkpoint that does not fit the model names the offending parameters.
    other = create(BertForPreTraining, BertConfig.from_size("tiny", vocab_size=64, max_position_embeddings=32))
    with pytest.raises(CheckpointMismatchError, match="position_embeddings.*checkpoint \\(16, 128\\)"):
        pretrained.load_into(ckpt, other)


@pytest.mark.slow  # ~14 s; test_orbax_round_trip_and_encoder_only_restore
def test_fine_tuning_restores_encoder_only(tmp_path):
    source = create(BertForPreTraining, TINY, seed=1)
    convert.export_hf(source, TINY, tmp_path)
    ckpt = pretrained.read_checkpoint(f"hf:{tmp_path}")
    clf = create(BertClassifier, TINY, 3, seed=9)
    head_before = np.asarray(params_of(clf)["classifier/dense/kernel"])
    # Strict by default: the classifier head is not in a pre-training checkpoint.
    with pytest.raises(CheckpointMismatchError, match="missing from .*classifier.weight"):
        convert.load_tensors(clf, ckpt.tensors, TINY, source="hf")
    untouched = convert.load_tensors(clf, ckpt.tensors, TINY, source="hf", only="bert")
    assert untouched == ["classifier/dense/bias", "classifier/dense/kernel"]
    assert_same_params(source.bert, clf.bert)
    np.testing.assert_array_equal(params_of(clf)["classifier/dense/kernel"], head_before)
    # allow_missing keeps a new head's initial values while loading everything else strictly.
    tensors = {k: v for k, v in ckpt.tensors.items() if not k.startswith("cls.")}
    convert.load_tensors(clf, tensors, TINY, source="hf", allow_missing=("classifier",))


@pytest.fixture
def tiny_hf(tmp_path):
    model = create(BertForPreTraining, TINY, seed=2)
    convert.export_hf(model, TINY, tmp_path)
    return tmp_path


def edit_checkpoint(path, fn):
    from safetensors.numpy import load_file, save_file

    tensors = fn(load_file(str(path / "model.safetensors")))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_extra_and_misshapen_tensors_are_listed(tiny_hf):
    edit_checkpoint(tiny_hf, lambda t: {k: v for k, v in t.items() if "layer.1.output.dense" not in k}
                    | {"bert.encoder.layer.7.output.dense.weight": np.zeros((2, 2), np.float32)})
    ckpt = pretrained.read_checkpoint(f"hf:{tiny_hf}")
    with pytest.raises(CheckpointMismatchError) as e:
        pretrained.build_model(ckpt)
    msg = str(e.value)
    assert "missing from" in msg and "bert.encoder.layer.1.output.dense.weight" in msg
    assert "bert.encoder.layer.1.output.dense.bias" in msg
    assert "not in the model: bert.encoder.layer.7.output.dense.weight" in msg


def test_shape_mismatch_is_named(tiny_hf):
    edit_checkpoint(tiny_hf, lambda t: t | {"cls.predictions.bias": np.zeros((65,), np.float32)})
    with pytest.raises(CheckpointMismatchError, match=r"cls.predictions.bias: checkpoint \(65,\)"):
        pretrained.build_model(pretrained.read_checkpoint(f"hf:{tiny_hf}"))


def test_bad_checkpoints_give_one_line_errors(tiny_hf, tmp_path):
    (tiny_hf / "vocab.txt").write_text("\n".join(f"t{i}" for i in range(10)) + "\n")
    with pytest.raises(ValueError, match=r"vocab.txt has 10 tokens but .*config.json says vocab_size=64"):
        pretrained.read_checkpoint(f"hf:{tiny_hf}")
    (tiny_hf / "vocab.txt").unlink()
    (tiny_hf / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="model.safetensors: cannot read safetensors"):
        pretrained.read_checkpoint(f"hf:{tiny_hf}")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor pytorch_model.bin"):
        pretrained.read_checkpoint(f"hf:{empty}")
    (empty / "pytorch_model.bin").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a zip-format PyTorch checkpoint"):
        pretrained.read_checkpoint(f"hf:{empty}")
    with pytest.raises(ValueError, match="model.safetensors: cannot read safetensors"):
        pretrained.read_checkpoint(str(tiny_hf))  # no prefix: recognised as a Hugging Face directory
    with pytest.raises(ValueError, match="unknown prefix 'zz:'; expected a train.py workdir"):
        pretrained.read_checkpoint("zz:/x")
    (tmp_path / "neither").mkdir()
    with pytest.raises(FileNotFoundError, match="neither: neither a training workdir"):
        pretrained.read_checkpoint(str(tmp_path / "neither"))
    with pytest.raises(FileNotFoundError, match="cannot open TF checkpoint"):
        pretrained.read_checkpoint(f"tf:{tmp_path / 'nope' / 'bert_model.ckpt'}")


def test_hf_config_is_validated(tmp_path):
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        convert.config_from_hf({"position_embedding_type": "relative_key"}, source="x/config.json")
    with pytest.raises(ValueError, match=r"x/config.json: missing BERT config key\(s\) \['num_hidden_layers'"):
        convert.config_from_hf({"vocab_size": 3, "hidden_size": 4, "num_attention_heads": 2},
                               source="x/config.json")


def test_name_table_covers_every_parameter():
    model = nnx.eval_shape(lambda: BertForPreTraining(TINY, rngs=nnx.Rngs(0)))
    table = {row[0] for row in convert.name_table(TINY)}
    assert set(params_of(model)) <= table
    hf = [row[2] for row in convert.name_table(TINY)]
    assert len(hf) == len(set(hf))  # one-to-one


def test_pytorch_bin_read_without_torch_matches_safetensors(golden_file):
    d = golden_file("tiny_bert/pytorch_model.bin").parent
    from safetensors.numpy import load_file

    from bert_jax.interop.torch_pickle import load_state_dict

    from_bin, from_st = load_state_dict(d / "pytorch_model.bin"), load_file(str(d / "model.safetensors"))
    shared = set(from_bin) & set(from_st)
    assert len(shared) >= len(from_st) - 2
    for k in shared:
        np.testing.assert_array_equal(from_bin[k], from_st[k], err_msg=k)


def test_tiny_pretraining_heads_match_transformers(golden_file):
    """MLM and NSP logits of a random tiny BertForPreTraining equal transformers' (fp32)."""
    ref_file = golden_file("tiny_bert/tiny_bert_outputs.npz")
    ref = dict(np.load(ref_file))
    ckpt = pretrained.read_checkpoint(f"hf:{ref_file.parent}")
    model = pretrained.build_model(ckpt, config=ckpt.config.deterministic())
    out = nnx.jit(lambda m, a, b, c: m(a, b, c))(
        model, *(jnp.asarray(ref[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))
    real = ref["attention_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref["prediction_logits"][real], atol=1e-4)
    np.testing.assert_allclose(out.nsp_logits, ref["seq_relationship_logits"], atol=1e-4)
    np.testing.assert_allclose(out.encoder.pooled_output, ref["pooler_output"], atol=1e-4)
    assert jax.tree.leaves(out)  # computed

"""ModernBERT through Hugging Face directories: parity with transformers 5.23 on two small random models
(tests/golden/modernbert_l3, modernbert_l4: `make golden`), scanned and unrolled, padded, unpadded and
packed rows beyond the local window; both config.json forms; exports that are the very files
transformers wrote; strict loading and clear refusals; fine-tuning's warm start and feature
extraction from a ModernBERT directory."""

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from bert_jax.finetuning.warm_start import open_init_checkpoint
from bert_jax.interop import convert, pretrained
from bert_jax.interop import extract_features as ef
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import BertClassifier, BertForPreTraining, create_abstract
from bert_jax.model.weights import CheckpointMismatchError
from input_pipeline.unpadding import token_index
from tests.fixtures.hf_dirs import write_dir
from tests.fixtures.params import params_of

NAMES = ("l3", "l4")
GOLDEN_PY = Path.home() / ".cache" / "bert_jax" / "golden-venv" / "bin" / "python"
TOKEN_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")


class Golden:
    """One golden model directory: its config.json (both forms), tensors and outputs."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.config = json.loads((directory / "config.json").read_text())
        self.released = json.loads((directory / "config_released.json").read_text())
        self.tensors = load_file(str(directory / "model.safetensors"))
        self.outputs = dict(np.load(directory / "outputs.npz"))
        self.ids, self.mask = self.outputs["input_ids"], self.outputs["attention_mask"]
        self.real = self.mask.astype(bool)


@pytest.fixture(scope="module")
def golden(golden_file):
    cache = {}

    def load(name: str) -> Golden:
        if name not in cache:
            cache[name] = Golden(golden_file(f"modernbert_{name}"))
        return cache[name]

    return load


@pytest.fixture(scope="module")
def built(golden):
    """``built(name, scan)`` -> (checkpoint, `BertForPreTraining` loaded from it), once per module."""
    cache = {}

    def load(name: str, scan: bool = True):
        if (name, scan) not in cache:
            ckpt = pretrained.read_checkpoint(f"hf:{golden(name).directory}")
            cfg = dataclasses.replace(ckpt.config.deterministic(), scan_layers=scan)
            cache[name, scan] = ckpt, pretrained.build_model(ckpt, config=cfg)
        return cache[name, scan]

    return load


@nnx.jit
def forward(model, ids, mask):
    """MLM logits [B, L, V], every hidden state [layers + 1, B, L, H] and the last [B, L, H]."""
    seg = jnp.zeros_like(ids)
    enc = model.bert(ids, mask, seg, output_hidden_states=True)
    return model.mlm(enc.sequence_output, model.bert.embeddings.word_embeddings), enc.hidden_states, enc.sequence_output


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
@pytest.mark.parametrize("name", NAMES)
def test_matches_transformers(name, scan, golden, built):
    """MLM logits and every hidden state (the last after the final norm) within 1e-4 of HF's at real
    positions, in rows longer than the local window and padded ones (measured: <= 4e-6)."""
    g = golden(name)
    ckpt, model = built(name, scan)
    assert ckpt.model_type == "modernbert" and type(model) is BertForPreTraining and model.nsp is None
    assert g.ids.shape[1] > ckpt.config.local_window and not g.real.all()
    logits, hidden, last = forward(model, jnp.asarray(g.ids), jnp.asarray(g.mask))
    np.testing.assert_allclose(np.asarray(logits)[g.real], g.outputs["logits"][g.real], atol=1e-4)
    assert hidden.shape == g.outputs["hidden_states"].shape
    for i, ref in enumerate(g.outputs["hidden_states"]):
        np.testing.assert_allclose(np.asarray(hidden[i])[g.real], ref[g.real], atol=1e-4, err_msg=f"layer {i}")
    np.testing.assert_array_equal(np.asarray(hidden[-1]), np.asarray(last))  # after the final norm, as HF's


def test_unpadded_blocks_match_transformers(golden, built):
    """``token_index`` (the real tokens only, in two shards): the same logits at real positions."""
    g = golden("l4")
    _, model = built("l4")
    index = jnp.asarray(token_index(np.concatenate([g.mask, g.mask]), shards=2, multiple=16))
    ids, mask = (jnp.asarray(np.concatenate([a, a])) for a in (g.ids, g.mask))
    out = nnx.jit(lambda m, i, k, t: m(i, k, jnp.zeros_like(i), token_index=t))(model, ids, mask, index)
    real = np.concatenate([g.real, g.real])
    ref = np.concatenate([g.outputs["logits"]] * 2)
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref[real], atol=1e-4)


def test_packed_rows_match_transformers(golden, built):
    """Two golden rows packed in one (``example_ids``: no attention between them, rotary positions
    restarting): each example's logits are HF's for its own row."""
    g = golden("l3")
    _, model = built("l3", scan=False)
    a, b = (g.ids[i, :n] for i, n in ((1, 17), (2, 9)))
    ids = np.concatenate([a, b])[None].astype(np.int32)  # [1, 26]
    example_ids = np.array([[1] * 17 + [2] * 9], np.int32)
    out = nnx.jit(lambda m, i, e: m(i, jnp.ones_like(i), jnp.zeros_like(i), example_ids=e))(
        model, jnp.asarray(ids), jnp.asarray(example_ids))
    logits = np.asarray(out.mlm_logits)[0]
    np.testing.assert_allclose(logits[:17], g.outputs["logits"][1, :17], atol=1e-4)
    np.testing.assert_allclose(logits[17:], g.outputs["logits"][2, :9], atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_both_config_forms(name, golden, tmp_path):
    """transformers 5's config.json (layer_types, rope_parameters) and the released form
    (global_attn_every_n_layers, global/local_rope_theta) give the same model."""
    g = golden(name)
    assert "layer_types" in g.config and "global_attn_every_n_layers" in g.released
    shutil.copy(g.directory / "model.safetensors", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(g.released))
    cfg = pretrained.read_checkpoint(f"hf:{g.directory}").config
    assert pretrained.read_checkpoint(f"hf:{tmp_path}").config == cfg
    expected = {"l3": dict(num_layers=3, hidden_size=64, global_every=3, local_window=8, rope_theta=160_000.0,
                           local_rope_theta=10_000.0, use_bias=False, norm_bias=False, layer_norm_eps=1e-5,
                           vocab_size=2048),
                "l4": dict(num_layers=4, hidden_size=96, global_every=2, local_window=16, rope_theta=20_000.0,
                           local_rope_theta=5_000.0, use_bias=True, norm_bias=True, layer_norm_eps=1e-6,
                           vocab_size=160)}[name]
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert (cfg.position_embedding, cfg.norm_position, cfg.ffn, cfg.type_vocab_size, cfg.use_pooler) == (
        "rotary", "pre", "geglu", 0, False)
    specs = cfg.layer_specs()
    assert [("full_attention" if w == 0 else "sliding_attention") for w in specs.window] == g.config["layer_types"]
    assert specs.norm_input.tolist() == [False] + [True] * (cfg.num_layers - 1)


@pytest.mark.parametrize("name", NAMES)
def test_export_gives_back_the_hf_files(name, golden, built, tmp_path):
    """Import -> export writes the tensors transformers saved (key for key, shape for shape, value for
    value) and its config.json (key for key; transformers_version aside); the bare encoder is
    ``ModernBertModel``'s file (no ``model.`` prefix); importing again gives the same config."""
    g = golden(name)
    ckpt, model = built(name)
    convert.export_hf(model, ckpt.config, tmp_path / "mlm", token_ids={k: g.config[k] for k in TOKEN_KEYS})
    written = load_file(str(tmp_path / "mlm" / "model.safetensors"))
    assert sorted(written) == sorted(g.tensors)
    for k, v in g.tensors.items():
        assert written[k].shape == v.shape and written[k].dtype == v.dtype, k
        np.testing.assert_array_equal(written[k], v, err_msg=k)
    hf_cfg = json.loads((tmp_path / "mlm" / "config.json").read_text())
    assert hf_cfg == {k: v for k, v in g.config.items() if k != "transformers_version"}
    assert pretrained.read_checkpoint(f"hf:{tmp_path / 'mlm'}").config == ckpt.config

    encoder = nnx.eval_shape(lambda: BertEncoder(ckpt.config, rngs=nnx.Rngs(0)))
    nnx.update(encoder, nnx.state(model.bert, nnx.Param))
    convert.export_hf(encoder, ckpt.config, tmp_path / "base")
    bare = load_file(str(tmp_path / "base" / "model.safetensors"))
    assert sorted(bare) == sorted(k.removeprefix("model.") for k in g.tensors if k.startswith("model."))
    assert json.loads((tmp_path / "base" / "config.json").read_text())["architectures"] == ["ModernBertModel"]
    again = pretrained.read_checkpoint(f"hf:{tmp_path / 'base'}")
    assert again.config == ckpt.config and not again.heads["mlm"]
    encoder_again = pretrained.build_model(again)
    for k, v in params_of(encoder_again).items():
        np.testing.assert_array_equal(v, params_of(model.bert)[k], err_msg=k)


def test_export_token_ids_and_refusals(tmp_path):
    """Without ``token_ids`` an export writes ModernBERT's ids where they fit the vocabulary, else
    none (transformers takes both); a model that is not ModernBERT-shaped is refused in one line."""
    from bert_jax.model.config import BertConfig

    big = BertConfig.from_size("modernbert-tiny", num_layers=1)  # vocab 50368
    small = dataclasses.replace(big, vocab_size=100)
    for cfg, pad in ((big, 50283), (small, None)):
        hf = convert.config_to_hf(cfg, ["ModernBertModel"], "modernbert")
        assert hf["pad_token_id"] == pad and hf["layer_types"] == ["full_attention"]
    tiny = BertConfig.from_size("tiny", vocab_size=64, max_position_embeddings=16)
    with pytest.raises(ValueError, match=r"not a Hugging Face ModernBERT model: position_embedding='absolute'"):
        convert.export_hf(create_abstract(BertEncoder, dataclasses.replace(tiny, use_pooler=False)),
                          tiny, tmp_path, model_type="modernbert")
    with pytest.raises(ValueError, match=r"not a Hugging Face BERT model: position_embedding='rotary'"):
        convert.check_fits(small, "bert", {"mlm": True}, where="x")
    assert convert.model_type_of(None, small) == "modernbert"


def test_strict_loading_names_what_is_wrong(golden, tmp_path):
    g = golden("l3")
    tensors = {k: v for k, v in g.tensors.items() if k != "model.layers.1.attn_norm.weight"}
    tensors["model.layers.0.attn_norm.weight"] = g.tensors["model.layers.1.attn_norm.weight"]  # layer 0 has none
    with pytest.raises(CheckpointMismatchError) as e:
        pretrained.build_model(pretrained.read_checkpoint(f"hf:{write_dir(tmp_path / 'a', tensors, g.config)}"))
    assert "missing from" in str(e.value) and "model.layers.1.attn_norm.weight" in str(e.value)
    assert "not in the model: model.layers.0.attn_norm.weight" in str(e.value)
    tensors = g.tensors | {"model.layers.2.mlp.Wi.weight": np.zeros((96, 64), np.float32)}
    with pytest.raises(CheckpointMismatchError, match=r"shape mismatch in .*model.layers.0.mlp.Wi.weight \(192, 64\), "
                                                      r".*model.layers.2.mlp.Wi.weight \(96, 64\)"):
        pretrained.build_model(pretrained.read_checkpoint(f"hf:{write_dir(tmp_path / 'b', tensors, g.config)}"))
    biased = g.tensors | {"model.final_norm.bias": np.zeros(64, np.float32)}  # norm_bias is false
    with pytest.raises(CheckpointMismatchError, match="not in the model: model.final_norm.bias"):
        pretrained.build_model(pretrained.read_checkpoint(f"hf:{write_dir(tmp_path / 'c', biased, g.config)}"))


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["sliding_attention", "full_attention", "full_attention"]}, "is not supported"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "2 layer_types for num_hidden_layers=3"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0}}},
     r"rope_parameters\['full_attention'\]"),
    ({"mlp_bias": True}, "one use_bias"),
    ({"decoder_bias": False}, "decoder_bias=False"),
    ({"classifier_activation": "relu"}, "classifier_activation='relu'"),
    ({"hidden_activation": "silu", "classifier_activation": "silu"}, "hidden_activation='silu'"),
    ({"num_attention_heads": 3}, "hidden_size must be divisible by num_heads"),
])
def test_unsupported_configs_are_refused(change, message, golden):
    with pytest.raises(ValueError, match=message):
        convert.config_from_hf(golden("l3").config | change, source="x/config.json")


def test_fine_tuning_warm_start(golden, built):
    """``init_checkpoint=hf:DIR`` restores the encoder into a classifier (a fresh pooler: ModernBERT has
    none); the tokenizer.json is the vocabulary."""
    g = golden("l3")
    warm = open_init_checkpoint(f"hf:{g.directory}")
    ckpt, model = built("l3")
    assert warm.config == ckpt.config and not warm.has_pooler and warm.vocab_file.endswith("tokenizer.json")
    cfg = dataclasses.replace(warm.config, use_pooler=True)
    target = create_abstract(BertClassifier, cfg, 3)
    state = nnx.state(target, nnx.Param)
    nnx.update(target, jax.tree.map(lambda p: jnp.ones(p.shape, p.dtype), state))
    left = warm.load_encoder(target)
    assert sorted(left) == sorted(k for k in params_of(target) if not k.startswith("bert/") or "pooler" in k)
    ours = params_of(target)
    for k, v in params_of(model.bert).items():
        np.testing.assert_array_equal(ours[f"bert/{k}"], v, err_msg=k)


def test_extract_features_from_a_modernbert_dir(golden, built, tmp_path):
    """``extract_features --init hf:DIR`` reads the directory's tokenizer.json (2,005 ids into a table of
    2,048) and gives the encoder's hidden states; the last after the final norm."""
    g = golden("l3")
    lines = ["A film that rewards patience.", "Who won? ||| The home team, 3-1.",
             " ".join(["long"] * 30)]  # longer than the local window
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    ef.run(f"hf:{g.directory}", tmp_path / "in.txt", tmp_path / "out.npz", layers=[0, -1], batch_size=2,
           progress=False)
    out = np.load(tmp_path / "out.npz")
    ids, mask = out["input_ids"], out["input_mask"]
    assert (ids[:, 0] == 2001).all() and ids.shape[1] > 8 and (ids[mask == 0] == 2003).all()
    assert out["segment_ids"][1].max() == 1 and "pooled" not in out.files
    _, model = built("l3")
    enc = model.bert(jnp.asarray(ids), jnp.asarray(mask), jnp.zeros_like(jnp.asarray(ids)))
    real = mask.astype(bool)
    np.testing.assert_allclose(out["layer_-1"][real], np.asarray(enc.sequence_output)[real], atol=1e-5)


# The family's script (transformers loads each exported directory and runs it): its logits are ours to compare.
from tests.interop.test_export_transformers import FAMILY_SCRIPT  # noqa: E402


@pytest.mark.slow
def test_transformers_loads_our_export(golden, built, tmp_path):
    """Each golden model with every parameter moved, exported (token ids left to the default):
    transformers' ``from_pretrained`` finds every weight and computes our logits (1e-4, real positions)."""
    if not GOLDEN_PY.exists():
        pytest.skip(f"{GOLDEN_PY} missing: run `make golden`")
    ours, dirs = {}, []
    for i, name in enumerate(NAMES):
        g = golden(name)
        ckpt, model = built(name)
        model = nnx.clone(model)
        leaves, tree = jax.tree.flatten(nnx.state(model, nnx.Param))
        keys = jax.random.split(jax.random.key(i), len(leaves))
        nnx.update(model, jax.tree.unflatten(tree, [p + 0.1 * jax.random.normal(k, p.shape)
                                                    for p, k in zip(leaves, keys, strict=True)]))
        d = tmp_path / name
        convert.export_hf(model, ckpt.config, d)
        np.savez(d / "inputs.npz", input_ids=g.ids, attention_mask=g.mask)
        ours[name] = np.asarray(model(jnp.asarray(g.ids), jnp.asarray(g.mask), jnp.zeros_like(g.ids)).mlm_logits)
        dirs.append(str(d))
    run = subprocess.run([str(GOLDEN_PY), "-c", FAMILY_SCRIPT, *dirs], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    for name in NAMES:
        g = golden(name)
        info = json.loads((tmp_path / name / "loading_info.json").read_text())
        assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
        ref = np.load(tmp_path / name / "torch_out.npz")["logits"]
        np.testing.assert_allclose(ours[name][g.real], ref[g.real], atol=1e-4, err_msg=name)


def test_fine_tuning_model_and_server_take_a_modernbert_dir(golden, load_config):
    """The fine-tuning task's model (a ModernBERT word table padded past its tokenizer: 2,048 rows,
    2,005 ids) and the server's engine (``python -m bert_jax.serve --init hf:DIR``) take the directory;
    a BERT checkpoint with a tokenizer of another size is still refused."""
    from bert_jax.finetuning.task import model_config
    from bert_jax.resolve import resolve
    from bert_jax.serve.engine import load

    g = golden("l3")
    warm = open_init_checkpoint(f"hf:{g.directory}")
    config = resolve(load_config("sentiment", "runlocal"), "cpu")  # as the job resolves it
    cfg = model_config(config, warm, 2005, "classification")
    assert cfg.vocab_size == 2048 and cfg.rotary and cfg.use_pooler  # a fresh pooler for the classifier
    with pytest.raises(ValueError, match="has vocab_size=2048 but the vocabulary"):
        model_config(config, warm, 2049, "classification")
    engine = load(f"hf:{g.directory}", max_seq_length=32, max_batch=2)
    out = engine.run(engine.encode(["a short review", "another one"]))
    assert all(np.isfinite(v).all() for v in out.values())

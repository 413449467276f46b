"""ModernBERT's ``config.json`` in both of its forms, to and from `BertConfig`.

Hugging Face's released checkpoints (transformers 4.48) carry the attention pattern and the rotary
bases as plain keys::

    "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
    "local_attention": 128

transformers 5 (5.23 checked: tests/golden/modernbert_*/config.json) writes them per layer type::

    "layer_types": ["full_attention", "sliding_attention", ...], "local_attention": 128,
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}

`config_from_hf` reads either (``layer_types`` wins when both are there, as in transformers), with
transformers' defaults for absent keys; `config_to_hf` writes transformers 5's form, key for key
what ``save_pretrained`` writes (``transformers_version`` aside). Refused with one line, not converted
approximately: a pattern that is not "layer i global iff i % n == 0", a rope_type other than
"default", biases on only some of attention / MLP / head, no decoder bias or untied decoder, a head
activation other than the blocks', an activation bert-jax does not have.
"""

from __future__ import annotations

from bert_jax.model.config import BertConfig

FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' ModernBertConfig defaults (5.23), for keys a config.json leaves out
DEFAULTS = dict(intermediate_size=1152, hidden_activation="gelu", max_position_embeddings=8192, initializer_range=0.02,
                norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False, classifier_bias=False,
                attention_dropout=0.0, embedding_dropout=0.0, local_attention=128, decoder_bias=True,
                classifier_pooling="cls", classifier_activation="gelu", tie_word_embeddings=True,
                global_attn_every_n_layers=3, global_rope_theta=160_000.0, local_rope_theta=10_000.0)
# Released ModernBERT's special-token ids (its tokenizer's [CLS] [SEP] [PAD]); an export uses them
# when the vocabulary has them, none otherwise, unless told (`bert_jax.interop.convert.export_hf`).
TOKEN_IDS = dict(pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282)
# HF activation name <-> ours (ACT2FN: "gelu" is the erf form, "gelu_pytorch_tanh" the tanh one)
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def _global_every(layer_types: list, source: str) -> int:
    """The smallest n with layer i global iff i % n == 0 (n = 1: every layer global)."""
    bad = sorted({t for t in layer_types if t not in (FULL, SLIDING)})
    if bad:
        raise ValueError(f"{source}: layer_types {bad}: expected {FULL!r} or {SLIDING!r}")
    is_global = [t == FULL for t in layer_types]
    for n in range(1, len(is_global) + 1):
        if is_global == [i % n == 0 for i in range(len(is_global))]:
            return n
    raise ValueError(f"{source}: layer_types {layer_types} is not supported (bert-jax makes layer i global iff "
                     "i % global_every == 0, layer 0 included)")


def _thetas(d: dict, source: str) -> tuple[float, float]:
    """(global, local) rotary bases from ``rope_parameters`` or the released keys."""
    if d.get("rope_scaling"):
        raise ValueError(f"{source}: rope_scaling={d['rope_scaling']!r} is not supported (plain RoPE only)")
    rope = d.get("rope_parameters") or {}
    thetas = []
    for layer_type, key in ((FULL, "global_rope_theta"), (SLIDING, "local_rope_theta")):
        p = rope.get(layer_type) or {}
        if p.get("rope_type", "default") != "default" or set(p) - {"rope_type", "rope_theta"}:
            raise ValueError(f"{source}: rope_parameters[{layer_type!r}]={p!r} is not supported (rope_type "
                             "'default' with a rope_theta only)")
        thetas.append(float(p.get("rope_theta", d.get(key, DEFAULTS[key]))))
    return thetas[0], thetas[1]


def config_from_hf(d: dict, *, source: str, use_pooler: bool) -> BertConfig:
    """Our config from a ModernBERT config.json of either form (the module docstring)."""
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads") if k not in d]
    if missing:
        raise ValueError(f"{source}: missing ModernBERT config key(s) {missing}")
    c = DEFAULTS | d
    problems = []
    biases = {k: c[k] for k in ("attention_bias", "mlp_bias", "classifier_bias")}
    if len(set(biases.values())) > 1:
        problems.append(f"{biases} (bert-jax has one use_bias for the blocks and the head's dense)")
    if not c["decoder_bias"] or not c["tie_word_embeddings"]:
        problems.append(f"decoder_bias={c['decoder_bias']}, tie_word_embeddings={c['tie_word_embeddings']} (the "
                        "MLM decoder is the word table, tied, with a bias)")
    if c["classifier_activation"] != c["hidden_activation"]:
        problems.append(f"classifier_activation={c['classifier_activation']!r} with hidden_activation="
                        f"{c['hidden_activation']!r} (bert-jax's MLM head applies hidden_act)")
    if c["hidden_activation"] not in ACTIVATIONS:
        problems.append(f"hidden_activation={c['hidden_activation']!r} (expected one of {sorted(ACTIVATIONS)})")
    if c.get("head_dim") not in (None, d["hidden_size"] // d["num_attention_heads"]):
        problems.append(f"head_dim={c['head_dim']} (bert-jax's is hidden_size / num_attention_heads)")
    if problems:
        raise ValueError(f"{source}: ModernBERT with " + "; ".join(problems) + " is not supported")
    layers = d["num_hidden_layers"]
    if d.get("layer_types") is not None:
        if len(d["layer_types"]) != layers:
            raise ValueError(f"{source}: {len(d['layer_types'])} layer_types for num_hidden_layers={layers}")
        every = _global_every(d["layer_types"], source)
    else:
        every = c["global_attn_every_n_layers"]
    rope_theta, local_rope_theta = _thetas(d, source)
    try:
        return BertConfig(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_layers=layers,
            num_heads=d["num_attention_heads"], intermediate_size=c["intermediate_size"],
            max_position_embeddings=c["max_position_embeddings"], type_vocab_size=0, position_embedding="rotary",
            rope_theta=rope_theta, local_rope_theta=local_rope_theta, local_window=c["local_attention"],
            global_every=every, norm_position="pre", ffn="geglu", use_bias=c["attention_bias"],
            norm_bias=c["norm_bias"], hidden_act=ACTIVATIONS[c["hidden_activation"]], layer_norm_eps=c["norm_eps"],
            hidden_dropout_prob=c["embedding_dropout"], attention_dropout_prob=c["attention_dropout"],
            initializer_range=c["initializer_range"], classifier_pooling=c["classifier_pooling"],
            use_pooler=use_pooler)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: {e}") from e


def problems(cfg: BertConfig) -> list[str]:
    """What keeps ``cfg`` from being a Hugging Face ModernBERT (empty: nothing)."""
    expected = dict(position_embedding="rotary", norm_position="pre", ffn="geglu", type_vocab_size=0)
    return [f"{k}={getattr(cfg, k)!r} (HF ModernBERT's is {v!r})" for k, v in expected.items() if getattr(cfg, k) != v]


def config_to_hf(cfg: BertConfig, architectures: list[str], token_ids: dict | None = None) -> dict:
    """transformers 5's ModernBERT config.json for ``cfg``: the keys ``save_pretrained`` writes."""
    act = {ours: theirs for theirs, ours in ACTIVATIONS.items()}[cfg.hidden_act]
    if token_ids is None:
        fits = all(i < cfg.vocab_size for i in TOKEN_IDS.values())
        token_ids = TOKEN_IDS if fits else dict.fromkeys(TOKEN_IDS)
    specs = cfg.layer_specs()
    out = dict(
        architectures=architectures, attention_bias=cfg.use_bias, attention_dropout=cfg.attention_dropout_prob,
        classifier_activation=act, classifier_bias=cfg.use_bias, classifier_dropout=cfg.hidden_dropout_prob,
        classifier_pooling=cfg.classifier_pooling, decoder_bias=True, deterministic_flash_attn=False,
        dtype="float32", embedding_dropout=cfg.hidden_dropout_prob, hidden_activation=act,
        hidden_size=cfg.hidden_size, initializer_cutoff_factor=2.0, initializer_range=cfg.initializer_range,
        intermediate_size=cfg.intermediate_size, layer_types=[FULL if w == 0 else SLIDING for w in specs.window],
        local_attention=cfg.local_window or DEFAULTS["local_attention"],
        max_position_embeddings=cfg.max_position_embeddings, mlp_bias=cfg.use_bias,
        mlp_dropout=cfg.hidden_dropout_prob, model_type="modernbert", norm_bias=cfg.norm_bias,
        norm_eps=cfg.layer_norm_eps, num_attention_heads=cfg.num_heads, num_hidden_layers=cfg.num_layers,
        rope_parameters={FULL: {"rope_theta": cfg.rope_theta, "rope_type": "default"},
                         SLIDING: {"rope_theta": cfg.local_rope_theta, "rope_type": "default"}},
        sparse_pred_ignore_index=-100, sparse_prediction=False, tie_word_embeddings=True,
        vocab_size=cfg.vocab_size)
    return dict(sorted((out | {k: token_ids.get(k) for k in TOKEN_IDS}).items()))

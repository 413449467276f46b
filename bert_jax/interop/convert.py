"""Released BERT weights in and out: Hugging Face directories and Google's TF checkpoints.

The mapping is a table (`name_table`): each row names one of our parameters (a ``/`` path in the
model's state; per-layer rows add the layer index into the stacked ``layers`` axis), its Hugging Face
name, its Google TF name, and how the array is laid out (``kind``). Nothing is matched by guesswork.

    cfg, tensors = read_checkpoint("hf:/path/to/bert")       # or "tf:/path/bert_model.ckpt"
    model = build_for_checkpoint(cfg, tensors)                 # an encoder (+ heads it carries)
    load_tensors(model, tensors, cfg, source="hf")             # strict (model.weights.load_params)
    export_hf(model, cfg, "/tmp/out")                          # config.json + model.safetensors
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flax import nnx, traverse_util

from bert_jax.model.config import BertConfig
from bert_jax.model.weights import load_params

# (our path under the layer stack, HF suffix, TF suffix, kind)
_LAYER_ROWS = [
    *[
        (f"attention/{q}/{p}", f"attention.self.{q}.{hp}", f"attention/self/{q}/{tp}", k)
        for q in ("query", "key", "value")
        for p, hp, tp, k in (("kernel", "weight", "kernel", "qkv_kernel"), ("bias", "bias", "bias", "qkv_bias"))
    ],
    ("attention/output/kernel", "attention.output.dense.weight", "attention/output/dense/kernel", "out_kernel"),
    ("attention/output/bias", "attention.output.dense.bias", "attention/output/dense/bias", "copy"),
    ("attention_norm/scale", "attention.output.LayerNorm.weight", "attention/output/LayerNorm/gamma", "copy"),
    ("attention_norm/bias", "attention.output.LayerNorm.bias", "attention/output/LayerNorm/beta", "copy"),
    ("ffn/intermediate/kernel", "intermediate.dense.weight", "intermediate/dense/kernel", "linear"),
    ("ffn/intermediate/bias", "intermediate.dense.bias", "intermediate/dense/bias", "copy"),
    ("ffn/output/kernel", "output.dense.weight", "output/dense/kernel", "linear"),
    ("ffn/output/bias", "output.dense.bias", "output/dense/bias", "copy"),
    ("output_norm/scale", "output.LayerNorm.weight", "output/LayerNorm/gamma", "copy"),
    ("output_norm/bias", "output.LayerNorm.bias", "output/LayerNorm/beta", "copy"),
]
_ROWS = [
    *[
        (f"bert/embeddings/{e}/embedding", f"bert.embeddings.{e}.weight", f"bert/embeddings/{e}", "copy")
        for e in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    ],
    ("bert/embeddings/layer_norm/scale", "bert.embeddings.LayerNorm.weight", "bert/embeddings/LayerNorm/gamma", "copy"),
    ("bert/embeddings/layer_norm/bias", "bert.embeddings.LayerNorm.bias", "bert/embeddings/LayerNorm/beta", "copy"),
    ("bert/pooler/kernel", "bert.pooler.dense.weight", "bert/pooler/dense/kernel", "linear"),
    ("bert/pooler/bias", "bert.pooler.dense.bias", "bert/pooler/dense/bias", "copy"),
    ("mlm/transform/kernel", "cls.predictions.transform.dense.weight", "cls/predictions/transform/dense/kernel", "linear"),
    ("mlm/transform/bias", "cls.predictions.transform.dense.bias", "cls/predictions/transform/dense/bias", "copy"),
    ("mlm/layer_norm/scale", "cls.predictions.transform.LayerNorm.weight", "cls/predictions/transform/LayerNorm/gamma", "copy"),
    ("mlm/layer_norm/bias", "cls.predictions.transform.LayerNorm.bias", "cls/predictions/transform/LayerNorm/beta", "copy"),
    ("mlm/output_bias", "cls.predictions.bias", "cls/predictions/output_bias", "copy"),
    ("nsp/dense/kernel", "cls.seq_relationship.weight", "cls/seq_relationship/output_weights", "transposed"),
    ("nsp/dense/bias", "cls.seq_relationship.bias", "cls/seq_relationship/output_bias", "copy"),
    # Fine-tuned task heads (run_classifier / run_squad names on the TF side).
    ("classifier/dense/kernel", "classifier.weight", "output_weights", "transposed"),
    ("classifier/dense/bias", "classifier.bias", "output_bias", "copy"),
    ("qa_outputs/dense/kernel", "qa_outputs.weight", "cls/squad/output_weights", "transposed"),
    ("qa_outputs/dense/bias", "qa_outputs.bias", "cls/squad/output_bias", "copy"),
]
# Source tensors that carry no parameter of ours: buffers, tied copies, optimizer slots.
_IGNORED_SUFFIXES = (
    "embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
    "/adam_m", "/adam_v", "global_step", "bad_steps", "loss_scale", "good_steps",
)
_HF_CONFIG_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "hidden_act": "hidden_act", "hidden_dropout_prob": "hidden_dropout_prob",
    "attention_probs_dropout_prob": "attention_dropout_prob", "layer_norm_eps": "layer_norm_eps",
    "initializer_range": "initializer_range",
}


def name_table(cfg: BertConfig) -> list[tuple[str, int | None, str, str, str]]:
    """Rows (our path, layer index or None, HF name, TF name, kind)."""
    rows = [(p, None, hf, tf, k) for p, hf, tf, k in _ROWS]
    for i in range(cfg.num_layers):
        for p, hf, tf, k in _LAYER_ROWS:
            rows.append((f"bert/layers/{p}", i, f"bert.encoder.layer.{i}.{hf}", f"bert/encoder/layer_{i}/{tf}", k))
    return rows


def to_ours(kind: str, source: str, a: np.ndarray, cfg: BertConfig) -> np.ndarray:
    d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    hf = source == "hf"  # HF Linear weights are [out, in]; TF kernels are [in, out] like ours
    if kind == "linear":
        return a.T if hf else a
    if kind == "transposed":  # [labels, embed] on both sides
        return a.T
    if kind == "qkv_kernel":
        return (a.T if hf else a).reshape(d, n, h)
    if kind == "qkv_bias":
        return a.reshape(n, h)
    if kind == "out_kernel":
        return (a.T if hf else a).reshape(n, h, d)
    return a


def from_ours(kind: str, a: np.ndarray, cfg: BertConfig) -> np.ndarray:
    """Our layout → Hugging Face's."""
    d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    if kind in ("linear", "transposed"):
        return a.T
    if kind == "qkv_kernel":
        return a.reshape(d, n * h).T
    if kind == "qkv_bias":
        return a.reshape(n * h)
    if kind == "out_kernel":
        return a.reshape(n * h, d).T
    return a


def normalize_hf_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``BertModel`` checkpoints have no ``bert.`` prefix; old ones say LayerNorm.gamma/beta."""
    out = {}
    for k, v in tensors.items():
        if k.startswith(("embeddings.", "encoder.", "pooler.")):
            k = "bert." + k
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[k] = v
    return out


def config_from_hf(d: dict, *, source: str = "config.json", use_pooler: bool = True) -> BertConfig:
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{source}: position_embedding_type={d['position_embedding_type']!r} is not supported")
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads") if k not in d]
    if missing:
        raise ValueError(f"{source}: missing BERT config key(s) {missing}")
    kw = {ours: d[theirs] for theirs, ours in _HF_CONFIG_KEYS.items() if theirs in d}
    return BertConfig(**kw, use_pooler=use_pooler)


def config_to_hf(cfg: BertConfig, architectures: list[str]) -> dict:
    d = {theirs: getattr(cfg, ours) for theirs, ours in _HF_CONFIG_KEYS.items()}
    return {"architectures": architectures, "model_type": "bert", "pad_token_id": 0,
            "position_embedding_type": "absolute", **d}


def heads_in(tensors: dict[str, np.ndarray], source: str) -> dict[str, bool]:
    """Which optional parts a checkpoint carries: pooler, mlm, nsp."""
    sep = "." if source == "hf" else "/"
    names = set(tensors)
    return {
        "pooler": any(n.startswith(f"bert{sep}pooler") for n in names),
        "mlm": any(n.startswith(f"cls{sep}predictions") for n in names),
        "nsp": any(n.startswith(f"cls{sep}seq_relationship") for n in names),
    }


def _ignored(name: str) -> bool:
    return name.endswith(_IGNORED_SUFFIXES)


def to_our_names(tensors: dict[str, np.ndarray], cfg: BertConfig, *, source: str,
                 only: str | None = None) -> tuple[dict[str, np.ndarray], list[str], dict[str, str]]:
    """A checkpoint's tensors in our layout and names (per-layer tensors stacked on the layer axis).

    Returns ``(params, unmatched, names)``: ``params`` maps our full paths to arrays (only where
    every tensor of a parameter is present), ``unmatched`` lists the checkpoint's names that belong
    to no parameter (within ``only``, when given), and ``names`` gives each path's name(s) in the
    checkpoint, for error messages (the absent ones when only some layers are there).
    """
    col = 2 if source == "hf" else 3
    rows: dict[str, list] = {}
    for row in name_table(cfg):
        rows.setdefault(row[0], []).append(row)
    params, names, used = {}, {}, set()
    for path, table in rows.items():
        wanted = [r[col] for r in table]
        absent = [n for n in wanted if n not in tensors]
        used.update(n for n in wanted if n in tensors)
        if absent:
            names[path] = ", ".join(absent)
            continue
        parts = [to_ours(r[4], source, np.asarray(tensors[r[col]]), cfg) for r in table]
        layered = table[0][1] is not None
        names[path] = f"{wanted[0]} (stacked over {len(wanted)} layers)" if layered else wanted[0]
        params[path] = np.stack(parts) if layered else parts[0]
    sep = "." if source == "hf" else "/"
    mapped = {r[col]: r[0] for r in name_table(cfg)}  # checkpoint name -> our full path
    in_scope = (lambda n: True) if not only else (
        lambda n: mapped[n].startswith(only) if n in mapped else n.startswith("bert" + sep))
    unmatched = sorted(n for n in tensors if n not in used and not _ignored(n) and in_scope(n))
    return params, unmatched, names


def load_tensors(model: nnx.Module, tensors: dict[str, np.ndarray], cfg: BertConfig, *, source: str,
                 allow_missing: tuple[str, ...] = (), only: str | None = None,
                 where: str = "checkpoint") -> list[str]:
    """Copies a checkpoint's tensors into ``model`` in place; returns the parameters it left alone.

    ``only="bert"`` loads just the encoder (heads keep their initial values and the checkpoint's
    heads are ignored). ``allow_missing`` names path prefixes (e.g. ``("classifier",)``) that may be
    absent from the checkpoint (new heads). Anything else that is missing, extra or misshapen raises
    `CheckpointMismatchError` (from `bert_jax.model.weights.load_params`) listing every name.
    """
    params, unmatched, names = to_our_names(tensors, cfg, source=source, only=only)
    return load_params(model, params, where=where, only=only, allow_missing=allow_missing, unmatched=unmatched,
                       names=names)


def export_hf(model: nnx.Module, cfg: BertConfig, out_dir: str | Path) -> Path:
    """Writes ``config.json`` + ``model.safetensors`` that ``transformers`` loads."""
    from safetensors.numpy import save_file

    ours = traverse_util.flatten_dict(nnx.state(model, nnx.Param).to_pure_dict(), sep="/")
    prefix = "" if "bert/embeddings/word_embeddings/embedding" in ours else "bert/"
    out: dict[str, np.ndarray] = {}
    for path, layer, hf, _tf, kind in name_table(cfg):
        key = path[len(prefix):] if prefix and path.startswith(prefix) else path
        if key not in ours:
            continue
        a = np.asarray(ours[key], dtype=np.float32)
        out[hf] = np.ascontiguousarray(from_ours(kind, a[layer] if layer is not None else a, cfg))
    has = heads_in(out, "hf")
    if not (has["mlm"] or has["nsp"]):
        out = {k.removeprefix("bert."): v for k, v in out.items()}
        arch = ["BertModel"]
    else:
        arch = ["BertForPreTraining"]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / "model.safetensors.tmp"), metadata={"format": "pt"})
    (out_dir / "model.safetensors.tmp").replace(out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(config_to_hf(cfg, arch), indent=2) + "\n")
    return out_dir

"""Released weights in and out: Hugging Face BERT, ALBERT, ELECTRA, RoBERTa and ModernBERT
directories, Google's TF BERT checkpoints.

The mapping is a table (`name_table`, built from the `bert_jax.interop.families` entry of the
checkpoint's ``model_type``): each row names one of our parameters (a ``/`` path in the model's state;
per-layer rows add the layer index into the stacked ``layers`` axis), its Hugging Face name, its
Google TF name (BERT only), and how the array is laid out (``kind``). Nothing is matched by guesswork.

    ckpt = read_checkpoint("hf:/path/to/albert")              # bert_jax.interop.pretrained
    model = build_model(ckpt)                                  # the model the checkpoint holds
    load_tensors(model, tensors, cfg, source="hf", model_type="albert")   # strict (load_params)
    export_hf(model, cfg, "/tmp/out")                          # config.json + model.safetensors
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flax import nnx, traverse_util

from bert_jax.interop import modernbert
from bert_jax.interop.families import Family, family
from bert_jax.model import layer_layout
from bert_jax.model.config import BertConfig
from bert_jax.model.weights import CheckpointMismatchError, full_paths, load_params

# Source tensors that carry no parameter of ours (besides each family's tied copies): optimizer slots
# and counters of Google's TF checkpoints.
_IGNORED_SUFFIXES = ("/adam_m", "/adam_v", "global_step", "bad_steps", "loss_scale", "good_steps")
_HF_CONFIG_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "hidden_act": "hidden_act", "hidden_dropout_prob": "hidden_dropout_prob",
    "attention_probs_dropout_prob": "attention_dropout_prob", "layer_norm_eps": "layer_norm_eps",
    "initializer_range": "initializer_range",
}
HEADS = ("pooler", "mlm", "nsp", "rtd")
_HEAD_PATHS = {"pooler": "bert/pooler/", "mlm": "mlm/", "nsp": "nsp/", "rtd": "rtd/"}


def _family(model_type: str | Family) -> Family:
    return model_type if isinstance(model_type, Family) else family(model_type)


def _has(kind: str, cfg: BertConfig) -> bool:
    """Whether the config has the parameter of a row of this kind (the optional biases)."""
    if kind in ("bias", "geglu_bias") or kind.startswith("wqkv_bias"):
        return cfg.use_bias
    return cfg.norm_bias if kind == "norm_bias" else True


def name_table(cfg: BertConfig, model_type: str | Family = "bert") -> list[tuple[str, int | None, str, str | None, str]]:
    """Rows (our path, layer index or None, HF name, TF name or None, kind). A family with shared
    layers (ALBERT) has one block, index 0 of a layer axis of size 1. A parameter HF's first layer
    lacks (`Family.absent_in_first_layer`) has the HF name "" and the kind "ones" or "zeros" there."""
    fam = _family(model_type)
    rows = [(p, None, hf, tf, k) for p, hf, tf, k in fam.encoder if _has(k, cfg)]
    rows += [(p, None, hf, tf, k) for head in fam.heads.values() for p, hf, tf, k in head if _has(k, cfg)]
    for i in range(1 if fam.shared_layers else cfg.num_layers):
        pre = fam.layer_prefix.format(i=i)
        for p, hf, tf, k in fam.block:
            if not _has(k, cfg):
                continue
            if i == 0 and p in fam.absent_in_first_layer:
                rows.append((f"bert/layers/{p}", i, "", None, "ones" if p.endswith("/scale") else "zeros"))
            else:
                rows.append((f"bert/layers/{p}", i, pre + hf, tf and f"bert/encoder/layer_{i}/{tf}", k))
    return rows


def _part(kind: str) -> tuple[str, int | None]:
    """``"wqkv_kernel:1"`` → (``"qkv_kernel"``, 1): part 1 of 3 of HF's fused tensor; others (kind, None)."""
    base, sep, j = kind.partition(":")
    return (base.removeprefix("w"), int(j)) if sep else (kind, None)


def to_ours(kind: str, source: str, a: np.ndarray, cfg: BertConfig) -> np.ndarray:
    d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    hf = source == "hf"  # HF Linear weights are [out, in]; TF kernels are [in, out] like ours
    kind, part = _part(kind)
    if part is not None:  # ModernBERT's Wqkv: [3 * embed, ...], query rows first
        a = np.split(a, 3, axis=0)[part]
    if kind == "geglu_kernel":  # [2 * mlp, embed]: the activation's input rows, then the gate's
        return a.T.reshape(d, 2, cfg.intermediate_size)
    if kind == "geglu_bias":
        return a.reshape(2, cfg.intermediate_size)
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
    """Our layout → Hugging Face's (for a part of a fused tensor, that part: `write_hf` joins them)."""
    d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    kind, _ = _part(kind)
    if kind == "geglu_kernel":
        return a.reshape(d, 2 * cfg.intermediate_size).T
    if kind == "geglu_bias":
        return a.reshape(2 * cfg.intermediate_size)
    if kind in ("linear", "transposed"):
        return a.T
    if kind == "qkv_kernel":
        return a.reshape(d, n * h).T
    if kind == "qkv_bias":
        return a.reshape(n * h)
    if kind == "out_kernel":
        return a.reshape(n * h, d).T
    return a


def normalize_hf_names(tensors: dict[str, np.ndarray], model_type: str | Family = "bert") -> dict[str, np.ndarray]:
    """Base-model checkpoints (``BertModel``, ``AlbertModel``, ...) lack the ``bert.``/``albert.``
    prefix; old ones say LayerNorm.gamma/beta."""
    fam = _family(model_type)
    out = {}
    for k, v in tensors.items():
        if k.startswith(fam.bare_prefixes):
            k = f"{fam.base}.{k}"
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[k] = v
    return out


def config_from_hf(d: dict, *, source: str = "config.json", use_pooler: bool = True) -> BertConfig:
    """Our config from a Hugging Face config.json (``model_type`` picks the family; none: BERT)."""
    fam = family(d.get("model_type"), source=source)
    if fam.model_type == "modernbert":  # its own keys, in two forms (`bert_jax.interop.modernbert`)
        return modernbert.config_from_hf(d, source=source, use_pooler=use_pooler)
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{source}: position_embedding_type={d['position_embedding_type']!r} is not supported")
    needed = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"]
    needed += ["embedding_size"] if fam.model_type in ("albert", "electra") else []
    missing = [k for k in needed if k not in d]
    if missing:
        raise ValueError(f"{source}: missing {fam.name} config key(s) {missing}")
    kw = {ours: d[theirs] for theirs, ours in _HF_CONFIG_KEYS.items() if theirs in d}
    if "embedding_size" in needed:
        if fam.shared_layers and d["embedding_size"] == d["hidden_size"]:
            raise ValueError(f"{source}: ALBERT with embedding_size == hidden_size ({d['hidden_size']}) is not "
                             "supported: HF ALBERT always projects E -> H, bert-jax only when E != H")
        kw["embedding_size"] = None if d["embedding_size"] == d["hidden_size"] else d["embedding_size"]
    if fam.shared_layers:
        groups = (d.get("num_hidden_groups", 1), d.get("inner_group_num", 1))
        if groups != (1, 1):
            raise ValueError(f"{source}: ALBERT with num_hidden_groups={groups[0]}, inner_group_num={groups[1]} is "
                             "not supported (bert-jax shares one block across all layers: both must be 1)")
        kw["share_layers"] = True
    if fam.model_type == "roberta":  # positions count from pad + 1 (fairseq's make_positions)
        kw["position_offset"] = d.get("pad_token_id", 1) + 1
    try:
        return BertConfig(**kw, use_pooler=use_pooler)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: {e}") from e


def check_fits(cfg: BertConfig, model_type: str | Family, heads: dict[str, bool], *, where: str) -> None:
    """Raises ValueError (naming ``where``) when the model cannot be that family's HF model."""
    fam = _family(model_type)
    t, problems = fam.name, []
    if fam.model_type == "modernbert":
        problems += modernbert.problems(cfg)
    else:
        bert_like = dict(position_embedding="absolute", norm_position="post", ffn="dense", use_bias=True, norm_bias=True,
                         local_window=0)
        problems += [f"{k}={getattr(cfg, k)!r} (HF {t}'s is {v!r})" for k, v in bert_like.items() if getattr(cfg, k) != v]
        if not cfg.type_vocab_size:
            problems.append(f"type_vocab_size=0 (HF {t} has a token-type table)")
    if cfg.share_layers != fam.shared_layers:
        problems.append(f"share_layers={cfg.share_layers} (only ALBERT shares its layers, and it always does)")
    projects = cfg.embed_dim != cfg.hidden_size
    if (projects and fam.model_type not in ("albert", "electra")) or (not projects and fam.shared_layers):
        problems.append(f"embedding_size={cfg.embed_dim} with hidden_size={cfg.hidden_size} "
                        f"(HF {t} {'always' if fam.shared_layers else 'never'} projects embeddings)")
    if (cfg.position_offset > 0) != (fam.model_type == "roberta"):
        problems.append(f"position_offset={cfg.position_offset} (RoBERTa's is pad_token_id + 1 >= 1, others' 0)")
    if heads.get("mlm") and fam.fixed_mlm_act and cfg.hidden_act != fam.fixed_mlm_act:
        problems.append(f"hidden_act={cfg.hidden_act!r} with an MLM head (HF {t}'s MLM head always uses "
                        f"{fam.fixed_mlm_act!r}; bert-jax's uses hidden_act)")
    for head, present in heads.items():
        if present and head != "pooler" and head not in fam.heads:
            problems.append(f"a {head} head (HF {t} has none)")
    if heads.get("pooler") and not any(p.startswith("bert/pooler/") for p, *_ in fam.encoder):
        problems.append(f"a pooler (HF {t} has none: use_pooler=False)")
    if problems:
        raise ValueError(f"{where}: not a Hugging Face {t} model: " + "; ".join(problems))


def config_to_hf(cfg: BertConfig, architectures: list[str], model_type: str = "bert",
                 token_ids: dict | None = None) -> dict:
    """The config.json of ``cfg`` as a ``model_type`` model. ``token_ids`` (pad_token_id, ...) replace
    the family's defaults (BERT's pad 0, RoBERTa's from its positions, ModernBERT's
    `bert_jax.interop.modernbert.TOKEN_IDS` where they fit the vocabulary, else none)."""
    fam = family(model_type)
    if fam.model_type == "modernbert":
        return modernbert.config_to_hf(cfg, architectures, token_ids)
    d = {theirs: getattr(cfg, ours) for theirs, ours in _HF_CONFIG_KEYS.items()}
    out = {"architectures": architectures, "model_type": fam.model_type, "pad_token_id": 0,
           "position_embedding_type": "absolute", **d}
    if fam.model_type in ("albert", "electra"):
        out["embedding_size"] = cfg.embed_dim
    if fam.shared_layers:
        out |= {"num_hidden_groups": 1, "inner_group_num": 1}
    if fam.model_type == "roberta":
        out |= {"pad_token_id": cfg.position_offset - 1, "bos_token_id": 0, "eos_token_id": 2}
    return out | (token_ids or {})


def model_type_of(model: nnx.Module | None, cfg: BertConfig) -> str:
    """The family a model belongs to, from its config (and an ELECTRA discriminator head)."""
    if cfg.rotary or cfg.pre_norm or cfg.ffn == "geglu":
        return "modernbert"
    if cfg.share_layers:
        return "albert"
    if cfg.position_offset:
        return "roberta"
    if getattr(model, "rtd", None) is not None or cfg.embed_dim != cfg.hidden_size:
        return "electra"
    return "bert"


def heads_in(tensors: dict[str, np.ndarray], source: str, model_type: str | Family = "bert") -> dict[str, bool]:
    """Which optional parts a checkpoint carries: pooler, mlm, nsp (or sop), rtd."""
    fam, col = _family(model_type), 1 if source == "hf" else 2
    rows = [*fam.encoder, *(r for head in fam.heads.values() for r in head)]
    return {h: any(r[col] in tensors for r in rows if r[0].startswith(_HEAD_PATHS[h]) and r[col]) for h in HEADS}


def _stand_in(kind: str, cfg: BertConfig) -> np.ndarray:
    """The value of a block parameter HF's first layer lacks (a LayerNorm's initial scale or bias)."""
    return (np.ones if kind == "ones" else np.zeros)((cfg.hidden_size,), np.float32)


def _ignored(name: str, fam: Family) -> bool:
    return name.endswith(_IGNORED_SUFFIXES + fam.tied)


def to_our_names(tensors: dict[str, np.ndarray], cfg: BertConfig, *, source: str, only: str | None = None,
                 model_type: str | Family = "bert", where: str = "checkpoint",
                 ) -> tuple[dict[str, np.ndarray], list[str], dict[str, str]]:
    """A checkpoint's tensors in our layout and names (per-layer tensors stacked on the layer axis).

    Returns ``(params, unmatched, names)``: ``params`` maps our full paths to arrays (only where
    every tensor of a parameter is present), ``unmatched`` lists the checkpoint's names that belong
    to no parameter (within ``only``, when given), and ``names`` gives each path's name(s) in the
    checkpoint, for error messages (the absent ones when only some layers are there). Tensors that
    cannot take our layout at all (a reshape that does not fit, layers of different shapes) raise
    `CheckpointMismatchError` naming each with its shape (``where``: the file).
    """
    fam = _family(model_type)
    col = 2 if source == "hf" else 3
    table = [row for row in name_table(cfg, fam) if row[col] is not None]  # "": absent in HF by design
    rows: dict[str, list] = {}
    for row in table:
        rows.setdefault(row[0], []).append(row)
    params, names, used, misfits = {}, {}, set(), []
    for path, group in rows.items():
        wanted = [r[col] for r in group if r[col]]
        absent = [n for n in wanted if n not in tensors]
        used.update(n for n in wanted if n in tensors)
        if absent:
            names[path] = ", ".join(absent)
            continue
        layered = group[0][1] is not None
        names[path] = f"{(wanted or ['(none)'])[0]} (stacked over {len(group)} layers)" if layered else wanted[0]
        try:
            parts = [to_ours(r[4], source, np.asarray(tensors[r[col]]), cfg) if r[col] else _stand_in(r[4], cfg)
                     for r in group]
            params[path] = np.stack(parts) if layered else parts[0]
        except ValueError:
            misfits.append(", ".join(f"{n} {tuple(np.shape(tensors[n]))}" for n in wanted))
    if misfits:
        raise CheckpointMismatchError(f"shape mismatch in {where}: " + "; ".join(misfits) + " (do not fit "
                                      "the config's shapes)")
    base = f"{fam.base}." if source == "hf" else "bert/"
    mapped = {r[col]: r[0] for r in table}  # checkpoint name -> our full path
    in_scope = (lambda n: True) if not only else (
        lambda n: mapped[n].startswith(only) if n in mapped else n.startswith(base))
    unmatched = sorted(n for n in tensors if n not in used and not _ignored(n, fam) and in_scope(n))
    return params, unmatched, names


def load_tensors(model: nnx.Module, tensors: dict[str, np.ndarray], cfg: BertConfig, *, source: str,
                 allow_missing: tuple[str, ...] = (), only: str | None = None, where: str = "checkpoint",
                 model_type: str | Family = "bert") -> list[str]:
    """Copies a checkpoint's tensors into ``model`` in place; returns the parameters it left alone.

    ``only="bert"`` loads just the encoder (heads keep their initial values and the checkpoint's
    heads are ignored). ``allow_missing`` names path prefixes (e.g. ``("classifier",)``) that may be
    absent from the checkpoint (new heads). Anything else that is missing, extra or misshapen raises
    `CheckpointMismatchError` (from `bert_jax.model.weights.load_params`) listing every name.
    """
    params, unmatched, names = to_our_names(tensors, cfg, source=source, only=only, model_type=model_type,
                                            where=where)
    return load_params(model, params, where=where, only=only, allow_missing=allow_missing, unmatched=unmatched,
                       names=names)


def export_hf(model: nnx.Module, cfg: BertConfig, out_dir: str | Path, *, model_type: str | None = None,
              token_ids: dict | None = None) -> Path:
    """Writes ``config.json`` + ``model.safetensors`` that ``transformers`` loads. ``model_type``
    (bert, albert, electra, roberta, modernbert) defaults to the one `model_type_of` the model; a
    model that family cannot hold (e.g. a pooler for ELECTRA) raises ValueError naming what does not
    fit. ``token_ids``: the config's special-token ids (pad_token_id, bos_token_id, ...; see
    `config_to_hf`), which `BertConfig` does not hold."""
    flat = layer_layout.stack(traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)), sep="/"))
    if any(k.startswith("generator/") for k in flat):
        raise ValueError(f"export to {out_dir}: ELECTRA's two networks are two HF models: use export_electra")
    params = {full: flat[own] for full, own in full_paths(flat).items()}
    return write_hf(params, cfg, out_dir, model_type or model_type_of(model, cfg), token_ids=token_ids)


def export_electra(model: nnx.Module, cfg: BertConfig, out_dir: str | Path) -> tuple[Path, Path]:
    """Both networks of a `bert_jax.model.electra.ElectraForPreTraining` as HF's
    ``out_dir/discriminator`` (``ElectraForPreTraining``) and ``out_dir/generator``
    (``ElectraForMaskedLM``), each holding a copy of the shared embeddings."""
    flat = layer_layout.stack(traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(model, nnx.Param)), sep="/"))
    disc = {k: v for k, v in flat.items() if k.startswith(("bert/", "rtd/"))}
    gen = {k: v for k, v in flat.items() if k.startswith(("bert/embeddings/", "mlm/"))}
    gen |= {"bert/" + k.removeprefix("generator/"): v for k, v in flat.items() if k.startswith("generator/")}
    out_dir = Path(out_dir)
    return (write_hf(disc, cfg, out_dir / "discriminator", "electra"),
            write_hf(gen, model.generator.cfg, out_dir / "generator", "electra"))


def write_hf(params: dict[str, np.ndarray], cfg: BertConfig, out_dir: str | Path, model_type: str, *,
             token_ids: dict | None = None) -> Path:
    """Our parameters (flat, full paths) as a Hugging Face ``model_type`` directory (see `export_hf`)."""
    from safetensors.numpy import save_file

    fam = family(model_type)
    heads = {h: any(k.startswith(p) for k in params) for h, p in _HEAD_PATHS.items()}
    check_fits(cfg, fam, heads, where=f"export to {out_dir}")
    out: dict[str, np.ndarray] = {}
    fused: dict[str, dict[int, np.ndarray]] = {}  # ModernBERT's Wqkv: HF name -> {part: rows}
    for path, layer, hf, _tf, kind in name_table(cfg, fam):
        if path in params and hf:  # "": a parameter HF's first layer lacks (unused there)
            a = np.asarray(params[path], dtype=np.float32)
            a = from_ours(kind, a[layer] if layer is not None else a, cfg)
            if (part := _part(kind)[1]) is not None:
                fused.setdefault(hf, {})[part] = a
            else:
                out[hf] = np.ascontiguousarray(a)
    out |= {hf: np.ascontiguousarray(np.concatenate([parts[j] for j in sorted(parts)])) for hf, parts in fused.items()}
    if left := sorted(set(params) - {row[0] for row in name_table(cfg, fam)}):
        raise ValueError(f"export to {out_dir}: no Hugging Face {fam.name} name for {', '.join(left)}")
    kind = "rtd" if heads["rtd"] else "pretraining" if heads["nsp"] else "mlm" if heads["mlm"] else "encoder"
    if kind == "encoder":
        out = {k.removeprefix(f"{fam.base}."): v for k, v in out.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / "model.safetensors.tmp"), metadata={"format": "pt"})
    (out_dir / "model.safetensors.tmp").replace(out_dir / "model.safetensors")
    hf_cfg = config_to_hf(cfg, [fam.architectures[kind]], fam.model_type, token_ids)
    (out_dir / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    return out_dir

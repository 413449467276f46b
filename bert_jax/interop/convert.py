"""Released weights in and out: Hugging Face BERT, ALBERT, ELECTRA and RoBERTa directories, Google's
TF BERT checkpoints.

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

from bert_jax.interop.families import Family, family
from bert_jax.model import layer_layout
from bert_jax.model.config import BertConfig
from bert_jax.model.weights import full_paths, load_params

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


def name_table(cfg: BertConfig, model_type: str | Family = "bert") -> list[tuple[str, int | None, str, str | None, str]]:
    """Rows (our path, layer index or None, HF name, TF name or None, kind). A family with shared
    layers (ALBERT) has one block, index 0 of a layer axis of size 1."""
    fam = _family(model_type)
    rows = [(p, None, hf, tf, k) for p, hf, tf, k in fam.encoder]
    rows += [(p, None, hf, tf, k) for head in fam.heads.values() for p, hf, tf, k in head]
    for i in range(1 if fam.shared_layers else cfg.num_layers):
        pre = fam.layer_prefix.format(i=i)
        rows += [(f"bert/layers/{p}", i, pre + hf, tf and f"bert/encoder/layer_{i}/{tf}", k) for p, hf, tf, k in fam.block]
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


def config_to_hf(cfg: BertConfig, architectures: list[str], model_type: str = "bert") -> dict:
    fam = family(model_type)
    d = {theirs: getattr(cfg, ours) for theirs, ours in _HF_CONFIG_KEYS.items()}
    out = {"architectures": architectures, "model_type": fam.model_type, "pad_token_id": 0,
           "position_embedding_type": "absolute", **d}
    if fam.model_type in ("albert", "electra"):
        out["embedding_size"] = cfg.embed_dim
    if fam.shared_layers:
        out |= {"num_hidden_groups": 1, "inner_group_num": 1}
    if fam.model_type == "roberta":
        out |= {"pad_token_id": cfg.position_offset - 1, "bos_token_id": 0, "eos_token_id": 2}
    return out


def model_type_of(model: nnx.Module | None, cfg: BertConfig) -> str:
    """The family a model belongs to, from its config (and an ELECTRA discriminator head)."""
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


def _ignored(name: str, fam: Family) -> bool:
    return name.endswith(_IGNORED_SUFFIXES + fam.tied)


def to_our_names(tensors: dict[str, np.ndarray], cfg: BertConfig, *, source: str, only: str | None = None,
                 model_type: str | Family = "bert") -> tuple[dict[str, np.ndarray], list[str], dict[str, str]]:
    """A checkpoint's tensors in our layout and names (per-layer tensors stacked on the layer axis).

    Returns ``(params, unmatched, names)``: ``params`` maps our full paths to arrays (only where
    every tensor of a parameter is present), ``unmatched`` lists the checkpoint's names that belong
    to no parameter (within ``only``, when given), and ``names`` gives each path's name(s) in the
    checkpoint, for error messages (the absent ones when only some layers are there).
    """
    fam = _family(model_type)
    col = 2 if source == "hf" else 3
    table = [row for row in name_table(cfg, fam) if row[col]]
    rows: dict[str, list] = {}
    for row in table:
        rows.setdefault(row[0], []).append(row)
    params, names, used = {}, {}, set()
    for path, group in rows.items():
        wanted = [r[col] for r in group]
        absent = [n for n in wanted if n not in tensors]
        used.update(n for n in wanted if n in tensors)
        if absent:
            names[path] = ", ".join(absent)
            continue
        parts = [to_ours(r[4], source, np.asarray(tensors[r[col]]), cfg) for r in group]
        layered = group[0][1] is not None
        names[path] = f"{wanted[0]} (stacked over {len(wanted)} layers)" if layered else wanted[0]
        params[path] = np.stack(parts) if layered else parts[0]
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
    params, unmatched, names = to_our_names(tensors, cfg, source=source, only=only, model_type=model_type)
    return load_params(model, params, where=where, only=only, allow_missing=allow_missing, unmatched=unmatched,
                       names=names)


def export_hf(model: nnx.Module, cfg: BertConfig, out_dir: str | Path, *, model_type: str | None = None) -> Path:
    """Writes ``config.json`` + ``model.safetensors`` that ``transformers`` loads. ``model_type``
    (bert, albert, electra, roberta) defaults to the one `model_type_of` the model; a model that
    family cannot hold (e.g. a pooler for ELECTRA) raises ValueError naming what does not fit."""
    flat = layer_layout.stack(traverse_util.flatten_dict(nnx.state(model, nnx.Param).to_pure_dict(), sep="/"))
    if any(k.startswith("generator/") for k in flat):
        raise ValueError(f"export to {out_dir}: ELECTRA's two networks are two HF models: use export_electra")
    params = {full: flat[own] for full, own in full_paths(flat).items()}
    return write_hf(params, cfg, out_dir, model_type or model_type_of(model, cfg))


def export_electra(model: nnx.Module, cfg: BertConfig, out_dir: str | Path) -> tuple[Path, Path]:
    """Both networks of a `bert_jax.model.electra.ElectraForPreTraining` as HF's
    ``out_dir/discriminator`` (``ElectraForPreTraining``) and ``out_dir/generator``
    (``ElectraForMaskedLM``), each holding a copy of the shared embeddings."""
    flat = layer_layout.stack(traverse_util.flatten_dict(nnx.state(model, nnx.Param).to_pure_dict(), sep="/"))
    disc = {k: v for k, v in flat.items() if k.startswith(("bert/", "rtd/"))}
    gen = {k: v for k, v in flat.items() if k.startswith(("bert/embeddings/", "mlm/"))}
    gen |= {"bert/" + k.removeprefix("generator/"): v for k, v in flat.items() if k.startswith("generator/")}
    out_dir = Path(out_dir)
    return (write_hf(disc, cfg, out_dir / "discriminator", "electra"),
            write_hf(gen, model.generator.cfg, out_dir / "generator", "electra"))


def write_hf(params: dict[str, np.ndarray], cfg: BertConfig, out_dir: str | Path, model_type: str) -> Path:
    """Our parameters (flat, full paths) as a Hugging Face ``model_type`` directory (see `export_hf`)."""
    from safetensors.numpy import save_file

    fam = family(model_type)
    heads = {h: any(k.startswith(p) for k in params) for h, p in _HEAD_PATHS.items()}
    check_fits(cfg, fam, heads, where=f"export to {out_dir}")
    out: dict[str, np.ndarray] = {}
    for path, layer, hf, _tf, kind in name_table(cfg, fam):
        if path in params:
            a = np.asarray(params[path], dtype=np.float32)
            out[hf] = np.ascontiguousarray(from_ours(kind, a[layer] if layer is not None else a, cfg))
    if left := sorted(set(params) - {row[0] for row in name_table(cfg, fam)}):
        raise ValueError(f"export to {out_dir}: no Hugging Face {fam.name} name for {', '.join(left)}")
    kind = "rtd" if heads["rtd"] else "pretraining" if heads["nsp"] else "mlm" if heads["mlm"] else "encoder"
    if kind == "encoder":
        out = {k.removeprefix(f"{fam.base}."): v for k, v in out.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / "model.safetensors.tmp"), metadata={"format": "pt"})
    (out_dir / "model.safetensors.tmp").replace(out_dir / "model.safetensors")
    hf_cfg = config_to_hf(cfg, [fam.architectures[kind]], fam.model_type)
    (out_dir / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    return out_dir

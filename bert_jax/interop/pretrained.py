"""Opening a checkpoint by spec: a ``train.py`` workdir, ``hf:DIR``, ``tf:PREFIX`` or ``orbax:DIR``.

- ``WORKDIR`` (or ``orbax:WORKDIR``): a workdir of ``train.py``, pre-training or fine-tuning (one
  seed's ``WORKDIR/seed_<n>`` when it ran several), at its latest step; ``WORKDIR/checkpoints`` the
  same; ``WORKDIR/checkpoints/<step>`` that step. The model config comes from the checkpoint's
  metadata, the vocabulary from the workdir's ``config.json`` (pre-training: ``data.vocab``;
  fine-tuning: ``vocab``, else its ``init_checkpoint``'s). Only parameters are read, no optimizer
  state; networks the model asked for does not have (ELECTRA's generator, a fine-tuned task head)
  are left out.
- ``hf:DIR``: a Hugging Face BERT, ALBERT, ELECTRA, RoBERTa or ModernBERT directory (config.json,
  whose ``model_type`` picks the family, + model.safetensors or pytorch_model.bin; the vocabulary if
  present: vocab.txt, RoBERTa's vocab.json, ALBERT's spiece.model, ModernBERT's tokenizer.json).
  pytorch_model.bin is read without torch.
- ``tf:PREFIX``: Google's original checkpoint (``bert_model.ckpt`` prefix; bert_config.json and
  vocab.txt beside it), read with ``tf.train.load_checkpoint``.
- ``orbax:DIR``: parameters saved by `save_orbax` (bert_config.json + an Orbax ``params`` item).

In place of DIR or PREFIX, a package's data by name: ``hf:pkg:minilm`` (`read_checkpoint` locates it).
Without a prefix, a directory is recognised: a workdir, a ``save_orbax`` directory (bert_config.json)
or a Hugging Face one (config.json beside model.safetensors or pytorch_model.bin).

Every failure is one line naming the file and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from flax import nnx, traverse_util

from bert_jax.config_args import is_finetuning
from bert_jax.interop import convert
from bert_jax.interop.families import family
from bert_jax.model.config import BertConfig
from bert_jax.model.electra import ElectraDiscriminator, ElectraForPreTraining, electra_generator_config
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import BertForPreTraining, create_abstract
from bert_jax.model.weights import full_paths, load_params
from bert_jax.resolve import saved_model
from bert_jax.training.checkpoints import Checkpointer, read_params, read_tree, stored_param_shapes
from input_pipeline.files import path_or_url


@dataclasses.dataclass
class Checkpoint:
    config: BertConfig
    source: str  # "hf" | "tf" | "orbax" | "workdir"
    path: Path  # workdir: the step directory, checkpoints/<step>
    tensors: dict[str, np.ndarray] | None  # checkpoint names (hf/tf); None for orbax and workdirs
    heads: dict[str, bool]  # pooler / mlm / nsp / rtd present
    vocab_file: Path | str | None  # a workdir's may be a gs:// path
    model_type: str = "bert"  # the family (bert_jax.interop.families): bert, albert, electra, roberta, modernbert


def _json(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (expected the checkpoint's BERT config)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e


def _check_vocab(vocab: Path | None, cfg: BertConfig, config_file: Path) -> Path | None:
    if vocab is None or not vocab.exists():
        return None
    if vocab.name == "tokenizer.json":  # ModernBERT's: its table may be padded past the tokenizer's ids
        from tokenizers import Tokenizer

        try:
            n = max(Tokenizer.from_file(str(vocab)).get_vocab(with_added_tokens=True).values()) + 1
        except Exception as e:  # noqa: BLE001 - the tokenizers package raises a bare Exception
            raise ValueError(f"{vocab}: not a tokenizers tokenizer.json ({e})") from e
        if n > cfg.vocab_size:
            raise ValueError(f"{vocab} has {n} tokens but {config_file} says vocab_size={cfg.vocab_size}")
        return vocab
    if vocab.suffix == ".json":  # RoBERTa's byte-level BPE: {token: id}
        n = len(_json(vocab))
    elif vocab.suffix == ".model":  # ALBERT's SentencePiece model
        from sentencepiece import SentencePieceProcessor

        try:
            n = SentencePieceProcessor(model_file=str(vocab)).get_piece_size()
        except (OSError, RuntimeError) as e:
            raise ValueError(f"{vocab}: not a SentencePiece model ({e})") from e
    else:
        with open(vocab, "rb") as f:
            n = sum(1 for line in f if line.strip())
    if n != cfg.vocab_size:
        raise ValueError(f"{vocab} has {n} tokens but {config_file} says vocab_size={cfg.vocab_size}")
    return vocab


def check_vocab_size(cfg: BertConfig, size: int, vocab, where) -> None:
    """Raises ValueError unless a tokenizer of ``size`` ids (the file ``vocab``) fits the model of
    ``where``: exactly its ``vocab_size``, or, for ModernBERT (rotary positions), at most that: its word
    table is padded past its tokenizer's ids (to a multiple of 64)."""
    if size == cfg.vocab_size or (cfg.rotary and size < cfg.vocab_size):
        return
    padded = " (a ModernBERT table may be larger than its tokenizer, not smaller)" if cfg.rotary else ""
    raise ValueError(f"{vocab} has {size} tokens but {where}'s vocab_size is {cfg.vocab_size}{padded}")


def read_hf(directory: str | Path) -> Checkpoint:
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: not a directory (expected a Hugging Face BERT-family checkpoint)")
    st, bin_ = d / "model.safetensors", d / "pytorch_model.bin"
    if st.exists():
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            tensors = load_file(str(st))
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"{st}: cannot read safetensors file ({e})") from e
    elif bin_.exists():
        from bert_jax.interop.torch_pickle import load_state_dict

        tensors = load_state_dict(bin_)
    else:
        raise FileNotFoundError(f"{d}: has neither model.safetensors nor pytorch_model.bin")
    config_file = d / "config.json"
    hf_cfg = _json(config_file)
    fam = family(hf_cfg.get("model_type"), source=str(config_file))
    tensors = convert.normalize_hf_names(tensors, fam)
    heads = convert.heads_in(tensors, "hf", fam)
    cfg = convert.config_from_hf(hf_cfg, source=str(config_file), use_pooler=heads["pooler"])
    convert.check_fits(cfg, fam, heads, where=str(d))
    vocab = _check_vocab(d / fam.vocab_file if fam.vocab_file else None, cfg, config_file)
    return Checkpoint(cfg, "hf", d, tensors, heads, vocab, fam.model_type)


def read_tf(prefix: str | Path) -> Checkpoint:
    import tensorflow as tf

    prefix = Path(prefix)
    try:
        reader = tf.train.load_checkpoint(str(prefix))
    except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError) as e:
        raise FileNotFoundError(
            f"{prefix}: cannot open TF checkpoint (expected {prefix.name}.index and .data-* files): "
            f"{str(e).splitlines()[0]}"
        ) from e
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    heads = convert.heads_in(tensors, "tf")
    cfg_file = prefix.parent / "bert_config.json"
    cfg = convert.config_from_hf(_json(cfg_file), source=str(cfg_file), use_pooler=heads["pooler"])
    vocab = _check_vocab(prefix.parent / "vocab.txt", cfg, cfg_file)
    return Checkpoint(cfg, "tf", prefix, tensors, heads, vocab)


def read_orbax(directory: str | Path) -> Checkpoint:
    d = Path(directory)
    meta = _json(d / "bert_config.json")
    try:
        cfg = saved_model(meta["config"], d / "bert_config.json")  # as saved: resolved when written
        heads = {"rtd": False, **meta["heads"]}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{d / 'bert_config.json'}: not written by bert_jax save_orbax ({e})") from e
    if not (d / "params").exists():
        raise FileNotFoundError(f"{d / 'params'}: not found (expected an Orbax params checkpoint)")
    vocab = _check_vocab(d / "vocab.txt", cfg, d / "bert_config.json")
    return Checkpoint(cfg, "orbax", d, None, heads, vocab, convert.model_type_of(None, cfg))


def workdir_step(path: str | Path):
    """The step directory ``path`` names when it is a ``train.py`` workdir (its latest step), its
    ``checkpoints`` directory (the latest step) or one ``checkpoints/<step>``; None when it is none of
    these. A fine-tuning workdir of several seeds (``seed_<n>/checkpoints``) is an error naming them."""
    import orbax.checkpoint as ocp

    path = path_or_url(path)
    if path.name.isdigit() and (path / "state").is_dir():
        return path
    for root in (path / "checkpoints", path):
        if root.is_dir():  # committed steps only (in a bucket, one being written has no commit marker yet)
            steps = [int(p.name) for p in root.iterdir()
                     if p.name.isdigit() and (p / "state").is_dir() and ocp.step.is_path_finalized(p)]
            if steps:
                return root / str(max(steps))
    if path.is_dir() and (seeds := sorted(p.name for p in path.iterdir()
                                          if p.name.startswith("seed_") and (p / "checkpoints").is_dir())):
        raise ValueError(f"{path}: a fine-tuning workdir of {len(seeds)} seeds, each a run of its own: name one, "
                         f"e.g. {path / seeds[0]}")
    return None


def _workdir_config(checkpoints) -> tuple[dict, object] | None:
    """The ``config.json`` of the workdir holding ``checkpoints`` (a seed's run: the one above it)."""
    for d in (checkpoints.parent, checkpoints.parent.parent):
        if (d / "config.json").exists():
            try:
                return json.loads((d / "config.json").read_text(encoding="utf-8")), d / "config.json"
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{d / 'config.json'}: not valid JSON ({e})") from e
    return None


def vocab_of(spec: str):
    """The vocabulary file of the checkpoint ``spec`` names, without reading its weights, or None."""
    from input_pipeline.package_data import locate

    kind, sep, rest = spec.partition(":")
    kind, path = (kind, path_or_url(locate(rest))) if sep and kind in ("hf", "tf", "orbax") else \
        ("", path_or_url(locate(spec)))
    if kind in ("", "orbax") and (step := workdir_step(path)) is not None:
        return _workdir_vocab(step.parent)
    if kind == "tf":
        candidate = path.parent / "vocab.txt"
    elif (path / "bert_config.json").exists():
        candidate = path / "vocab.txt"
    elif (path / "config.json").exists():
        hf_cfg = _json(path / "config.json")
        name = family(hf_cfg.get("model_type"), source=str(path / "config.json")).vocab_file
        candidate = path / name if name else None
    else:
        return None
    return candidate if candidate is not None and candidate.exists() else None


def _workdir_vocab(checkpoints):
    """A workdir's vocabulary: pre-training's ``data.vocab``; fine-tuning's ``vocab``, else the one of
    its ``init_checkpoint``."""
    from input_pipeline.package_data import locate

    found = _workdir_config(checkpoints)
    if found is None:
        return None
    config, _ = found
    if is_finetuning(config):
        vocab = config.get("vocab") or (vocab_of(config["init_checkpoint"]) if config.get("init_checkpoint") else None)
    else:
        vocab = (config.get("data") or {}).get("vocab")
    return locate(str(vocab)) if vocab else None


def read_workdir(path: str | Path) -> Checkpoint:
    """A ``train.py`` workdir, its ``checkpoints`` directory or one step of it (the module docstring):
    the model config from the checkpoint's metadata, the heads from its parameters' names (no array
    is read here), the vocabulary from ``config.json``."""
    step_dir = workdir_step(path)
    if step_dir is None:
        raise FileNotFoundError(f"{path}: no checkpoint (expected a train.py workdir with checkpoints/<step>/state, "
                                f"or one checkpoints/<step>)")
    checkpoints = step_dir.parent
    ckpt = Checkpointer(checkpoints.parent, async_save=False)
    try:
        meta = ckpt.read_meta(int(step_dir.name))
    finally:
        ckpt.close()
    if "model" not in meta:
        raise ValueError(f"{step_dir}: checkpoint metadata has no model config (not written by bert_jax's trainer)")
    cfg = saved_model(meta["model"], checkpoints)  # as the job resolved it when it started
    names = stored_param_shapes(step_dir)
    heads = {"pooler": any(k.startswith("bert/pooler/") for k in names),
             **{h: any(k.startswith(f"{h}/") for k in names) for h in ("mlm", "nsp", "rtd")}}
    model_type = "electra" if heads["rtd"] else convert.model_type_of(None, cfg)
    return Checkpoint(cfg, "workdir", step_dir, None, heads, _workdir_vocab(checkpoints), model_type)


READERS = {"hf": read_hf, "tf": read_tf, "orbax": read_orbax}
FORMS = "a train.py workdir (or WORKDIR/checkpoints/STEP), hf:DIR, tf:PREFIX or orbax:DIR"


def read_checkpoint(spec: str) -> Checkpoint:
    """The checkpoint ``spec`` names (the module docstring); a package's data by name in place of the
    path (``hf:pkg:minilm``, `input_pipeline.package_data.locate`) is located here, for every tool."""
    from input_pipeline.package_data import locate

    kind, sep, rest = spec.partition(":")
    if sep and kind in READERS:
        if not rest:
            raise ValueError(f"checkpoint spec {spec!r}: expected {FORMS}")
        path = locate(rest) if rest.startswith("pkg:") else rest
        if kind == "orbax" and workdir_step(path) is not None:
            return read_workdir(path)
        return READERS[kind](path)
    if sep and "/" not in kind and not kind.startswith(".") and kind not in ("pkg", "gs", "s3", "file"):
        raise ValueError(f"checkpoint spec {spec!r}: unknown prefix {kind + ':'!r}; expected {FORMS}")
    path = path_or_url(locate(spec))
    if workdir_step(path) is not None:
        return read_workdir(path)
    if (path / "bert_config.json").exists():
        return read_orbax(path)
    if (path / "config.json").exists() and any((path / f).exists() for f in ("model.safetensors", "pytorch_model.bin")):
        return read_hf(path)
    if not path.exists():
        raise FileNotFoundError(f"{spec}: does not exist (expected {FORMS})")
    if (path / "checkpoints").is_dir() or (path / "config.json").exists():
        raise FileNotFoundError(f"{spec}: a workdir without a checkpoint yet (expected checkpoints/<step>/state)")
    raise FileNotFoundError(f"{spec}: neither a training workdir (checkpoints/<step>/state), a directory with "
                            f"bert_config.json (orbax:DIR), nor a Hugging Face one; expected {FORMS}")


def build_model(ckpt: Checkpoint, *, with_heads: bool = True, config: BertConfig | None = None) -> nnx.Module:
    """The encoder (plus the checkpoint's pre-training heads when ``with_heads``), loaded strictly:
    an ELECTRA discriminator (rtd head) is an `ElectraDiscriminator`; an MLM head makes a
    `BertForPreTraining` whose objective is "nsp" (BERT), "sop" (ALBERT) or "none" (no pair head:
    RoBERTa, an ELECTRA generator); otherwise a `BertEncoder`.

    ``config`` may override execution fields (dtype, scan_layers, dropout); the shapes must agree.
    The model is built abstractly and every parameter comes from the checkpoint: no random
    initialisation is compiled or run (all-MiniLM-L6-v2's encoder on 2 CPU cores, no compilation
    cache, 2026-11-26: 4.7-5.7 s to build and load with one, 0.6 s without).
    """
    cfg = config or ckpt.config
    if with_heads and ckpt.heads["rtd"]:
        model = create_abstract(ElectraDiscriminator, cfg)
    elif with_heads and ckpt.heads["mlm"]:
        objective = family(ckpt.model_type).pair_head if ckpt.heads["nsp"] else "none"
        model = create_abstract(BertForPreTraining, cfg, objective=objective)
    else:
        model = create_abstract(BertEncoder, cfg)
    _all_loaded(load_into(ckpt, model, only=None if with_heads else "bert"), ckpt.path)
    return model


def _all_loaded(untouched: list[str], where) -> None:
    """An abstractly built model must have had every parameter loaded."""
    if untouched:
        raise ValueError(f"{where}: parameters not in the checkpoint: {', '.join(sorted(untouched))}")


def build_electra(discriminator: Checkpoint, generator: Checkpoint, *,
                  config: BertConfig | None = None) -> ElectraForPreTraining:
    """Both ELECTRA networks (what pre-training trains) from HF's ``ElectraForPreTraining`` and
    ``ElectraForMaskedLM`` directories, loaded strictly. The generator's config must be
    `electra_generator_config` of the discriminator's (fraction = its hidden / the discriminator's),
    and its embeddings must equal the discriminator's: the model holds one shared copy."""
    where = f"{discriminator.path} + {generator.path}"
    if not (discriminator.heads["rtd"] and generator.heads["mlm"] and not generator.heads["rtd"]):
        raise ValueError(f"{where}: expected an ELECTRA discriminator (rtd head) and a generator (MLM head)")
    cfg, gen_cfg = config or discriminator.config, generator.config
    fraction = gen_cfg.hidden_size / cfg.hidden_size
    fields = ("hidden_size", "num_heads", "intermediate_size", "num_layers", "embed_dim", "vocab_size",
              "max_position_embeddings", "type_vocab_size", "hidden_act", "layer_norm_eps")
    expected = electra_generator_config(cfg, fraction)
    if bad := [f"{f}={getattr(gen_cfg, f)} (expected {getattr(expected, f)})" for f in fields
               if getattr(gen_cfg, f) != getattr(expected, f)]:
        raise ValueError(f"{generator.path}: not the generator of {discriminator.path} at fraction {fraction:g}: "
                         + ", ".join(bad))
    disc, disc_extra, disc_names = convert.to_our_names(discriminator.tensors, discriminator.config, source="hf",
                                                        model_type="electra")
    gen, gen_extra, gen_names = convert.to_our_names(generator.tensors, gen_cfg, source="hf", model_type="electra")
    differ = [k for k in disc if k.startswith("bert/embeddings/")
              and not (k in gen and np.array_equal(disc[k], gen[k]))]
    if differ:
        raise ValueError(f"{where}: the generator's embeddings are missing or differ from the discriminator's "
                         f"({', '.join(differ)}); ElectraForPreTraining shares one copy")
    params = {k: v for k, v in disc.items() if not k.startswith("mlm/")}
    params |= {("generator/" + k.removeprefix("bert/") if k.startswith("bert/") else k): v
               for k, v in gen.items() if not k.startswith("bert/embeddings/")}
    names = disc_names | {("generator/" + k.removeprefix("bert/") if k.startswith("bert/") else k): v
                          for k, v in gen_names.items() if not k.startswith("bert/embeddings/")}
    model = create_abstract(ElectraForPreTraining, cfg, generator_fraction=fraction)
    _all_loaded(load_params(model, params, where=where, unmatched=[*disc_extra, *gen_extra], names=names), where)
    return model


def load_into(ckpt: Checkpoint, model: nnx.Module, *, only: str | None = None,
              allow_missing: tuple[str, ...] = ()) -> list[str]:
    """Copies the checkpoint's weights into ``model`` in place (strict, see
    `bert_jax.model.weights.load_params`); returns the paths left as initialised."""
    if ckpt.source == "orbax":
        return load_params(model, read_tree(ckpt.path / "params"), where=str(ckpt.path / "params"), only=only,
                           allow_missing=allow_missing)
    if ckpt.source == "workdir":
        stored, where = read_params(ckpt.path)
        groups = {k.split("/")[0] for k in full_paths(traverse_util.flatten_dict(
            nnx.to_pure_dict(nnx.state(model, nnx.Param)), sep="/"))}
        stored = {k: v for k, v in stored.items() if k.split("/")[0] in groups}  # a generator, a task head: not here
        return load_params(model, stored, where=str(where), only=only, allow_missing=allow_missing)
    return convert.load_tensors(model, ckpt.tensors, ckpt.config, source=ckpt.source, only=only,
                                allow_missing=allow_missing, where=str(ckpt.path), model_type=ckpt.model_type)


def save_orbax(model: nnx.Module, cfg: BertConfig, directory: str | Path, *, vocab_file=None) -> Path:
    """Parameters as an Orbax checkpoint plus bert_config.json (readable as ``orbax:DIR``)."""
    import orbax.checkpoint as ocp

    d = Path(directory).absolute()
    d.mkdir(parents=True, exist_ok=True)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    heads = {"pooler": cfg.use_pooler, "mlm": hasattr(model, "mlm"),
             "nsp": getattr(model, "nsp", None) is not None, "rtd": getattr(model, "rtd", None) is not None}
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(d / "params", params, force=True)
    (d / "bert_config.json").write_text(json.dumps({"config": cfg.to_dict(), "heads": heads}, indent=2))
    if vocab_file is not None:
        (d / "vocab.txt").write_bytes(Path(vocab_file).read_bytes())
    return d

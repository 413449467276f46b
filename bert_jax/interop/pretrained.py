"""Opening a pre-trained checkpoint by spec: ``hf:DIR``, ``tf:PREFIX`` or ``orbax:DIR``.

- ``hf:DIR``: a Hugging Face BERT directory (config.json + model.safetensors or pytorch_model.bin;
  vocab.txt if present). pytorch_model.bin is read without torch.
- ``tf:PREFIX``: Google's original checkpoint (``bert_model.ckpt`` prefix; bert_config.json and
  vocab.txt beside it), read with ``tf.train.load_checkpoint``.
- ``orbax:DIR``: parameters saved by `save_orbax` (bert_config.json + an Orbax ``params`` item).

Every failure is one line naming the file and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from flax import nnx

from bert_jax.interop import convert
from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import BertForPreTraining, create
from bert_jax.model.weights import load_params
from bert_jax.training.checkpoints import read_tree


@dataclasses.dataclass
class Checkpoint:
    config: BertConfig
    source: str  # "hf" | "tf" | "orbax"
    path: Path
    tensors: dict[str, np.ndarray] | None  # checkpoint names (hf/tf); None for orbax
    heads: dict[str, bool]  # pooler / mlm / nsp present
    vocab_file: Path | None


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
    with open(vocab, "rb") as f:
        n = sum(1 for line in f if line.strip())
    if n != cfg.vocab_size:
        raise ValueError(f"{vocab} has {n} tokens but {config_file} says vocab_size={cfg.vocab_size}")
    return vocab


def read_hf(directory: str | Path) -> Checkpoint:
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: not a directory (expected a Hugging Face BERT checkpoint)")
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
    tensors = convert.normalize_hf_names(tensors)
    heads = convert.heads_in(tensors, "hf")
    cfg = convert.config_from_hf(_json(d / "config.json"), source=str(d / "config.json"),
                                 use_pooler=heads["pooler"])
    return Checkpoint(cfg, "hf", d, tensors, heads, _check_vocab(d / "vocab.txt", cfg, d / "config.json"))


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
        cfg = BertConfig.from_dict(meta["config"])
        heads = dict(meta["heads"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{d / 'bert_config.json'}: not written by bert_jax save_orbax ({e})") from e
    if not (d / "params").exists():
        raise FileNotFoundError(f"{d / 'params'}: not found (expected an Orbax params checkpoint)")
    vocab = _check_vocab(d / "vocab.txt", cfg, d / "bert_config.json")
    return Checkpoint(cfg, "orbax", d, None, heads, vocab)


def read_checkpoint(spec: str) -> Checkpoint:
    kind, sep, path = spec.partition(":")
    readers = {"hf": read_hf, "tf": read_tf, "orbax": read_orbax}
    if not sep or kind not in readers or not path:
        raise ValueError(f"checkpoint spec {spec!r}: expected hf:DIR, tf:PREFIX or orbax:DIR")
    return readers[kind](path)


def build_model(ckpt: Checkpoint, *, with_heads: bool = True, seed: int = 0,
                config: BertConfig | None = None) -> nnx.Module:
    """The encoder (plus the checkpoint's pre-training heads when ``with_heads``), loaded strictly.

    ``config`` may override execution fields (dtype, scan_layers, dropout); the shapes must agree.
    """
    cfg = config or ckpt.config
    if with_heads and ckpt.heads["mlm"]:
        objective = "nsp" if ckpt.heads["nsp"] else "none"
        model = create(BertForPreTraining, cfg, seed=seed, objective=objective)
    else:
        model = create(BertEncoder, cfg, seed=seed)
    load_into(ckpt, model, only=None if with_heads else "bert")
    return model


def load_into(ckpt: Checkpoint, model: nnx.Module, *, only: str | None = None,
              allow_missing: tuple[str, ...] = ()) -> list[str]:
    """Copies the checkpoint's weights into ``model`` in place (strict, see
    `bert_jax.model.weights.load_params`); returns the paths left as initialised."""
    if ckpt.source == "orbax":
        return load_params(model, read_tree(ckpt.path / "params"), where=str(ckpt.path / "params"), only=only,
                           allow_missing=allow_missing)
    return convert.load_tensors(model, ckpt.tensors, ckpt.config, source=ckpt.source, only=only,
                                allow_missing=allow_missing, where=str(ckpt.path))


def save_orbax(model: nnx.Module, cfg: BertConfig, directory: str | Path, *, vocab_file=None) -> Path:
    """Parameters as an Orbax checkpoint plus bert_config.json (readable as ``orbax:DIR``)."""
    import orbax.checkpoint as ocp

    d = Path(directory).absolute()
    d.mkdir(parents=True, exist_ok=True)
    params = nnx.state(model, nnx.Param).to_pure_dict()
    heads = {"pooler": cfg.use_pooler, "mlm": hasattr(model, "mlm"),
             "nsp": getattr(model, "nsp", None) is not None}
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(d / "params", params, force=True)
    (d / "bert_config.json").write_text(json.dumps({"config": cfg.to_dict(), "heads": heads}, indent=2))
    if vocab_file is not None:
        (d / "vocab.txt").write_bytes(Path(vocab_file).read_bytes())
    return d

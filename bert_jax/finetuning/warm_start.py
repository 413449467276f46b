"""Fine-tuning's ``init_checkpoint``: where the encoder's weights, model config and vocabulary come from.

Accepted specs (``pkg:`` names are located first, e.g. ``hf:pkg:minilm``):

* a pre-training workdir of ``train.py`` (or its ``checkpoints`` directory, or one step directory),
  optionally written ``orbax:WORKDIR``: the latest step's parameters; the model config from the
  checkpoint's metadata; the vocabulary from the workdir's ``config.json`` (``data.vocab``);
* ``orbax:DIR`` written by `bert_jax.interop.pretrained.save_orbax` (``bert_config.json`` + ``params``);
* ``hf:DIR`` (Hugging Face BERT, ALBERT, ELECTRA or RoBERTa: `bert_jax.interop.pretrained.read_hf`) and
  ``tf:PREFIX`` (Google's TF checkpoint).

Only the encoder (``bert/...``, pooler included) is restored; task heads start fresh. A checkpoint
without a pooler (e.g. trained with ``use_pooler=False``) leaves the pooler freshly initialised.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path

from flax import nnx

from bert_jax.interop import pretrained
from bert_jax.model.config import BertConfig
from bert_jax.resolve import saved_model
from bert_jax.training.checkpoints import Checkpointer, restore_params
from input_pipeline.files import path_or_url
from input_pipeline.package_data import locate

log = logging.getLogger(__name__)


@dataclasses.dataclass
class WarmStart:
    spec: str
    config: BertConfig  # the checkpoint's model config (shapes); execution fields may be replaced
    vocab_file: str | None  # the vocabulary it was trained with, when known
    has_pooler: bool
    _load: Callable[[nnx.Module], list[str]]

    def load_encoder(self, model: nnx.Module) -> list[str]:
        """Copies the encoder into ``model`` (its ``.bert``) in place; returns the paths left as
        initialised (the heads). A shape mismatch raises ValueError naming every parameter."""
        untouched = self._load(model)
        log.info("restored the encoder from %s; fresh: %s", self.spec, ", ".join(sorted(
            {p.split("/")[0] if not p.startswith("bert/") else p for p in untouched})) or "nothing")
        return untouched


def _workdir_root(path: Path) -> Path | None:
    """The checkpoints directory of a pre-training workdir / checkpoints dir / step dir, or None."""
    for candidate in (path / "checkpoints", path, path.parent):
        if candidate.is_dir() and any(p.name.isdigit() and (p / "state").is_dir() for p in candidate.iterdir()):
            return candidate
    return None


def _from_workdir(spec: str, checkpoints: Path, step_dir: Path | None) -> WarmStart:
    ckpt = Checkpointer(checkpoints.parent, async_save=False)
    try:
        step = int(step_dir.name) if step_dir is not None else None
        meta = ckpt.read_meta(step)
    finally:
        ckpt.close()
    if "model" not in meta:
        raise ValueError(f"{checkpoints}: checkpoint metadata has no model config "
                         "(not written by bert_jax.training.trainer)")
    # The model as the pre-training job saved it (resolved for its platform when it started); the
    # fine-tuning job's own resolved model section replaces the execution fields (trainer.model_config).
    cfg = saved_model(meta["model"], checkpoints)
    vocab = None
    config_json = checkpoints.parent / "config.json"
    if config_json.exists():
        vocab = json.loads(config_json.read_text()).get("data", {}).get("vocab") or None
    target = step_dir if step_dir is not None else checkpoints
    allow = () if cfg.use_pooler else ("bert/pooler",)  # e.g. ELECTRA's discriminator has none
    return WarmStart(spec, cfg, vocab, cfg.use_pooler,
                     lambda model: restore_params(target, model, only="bert", allow_missing=allow))


def open_init_checkpoint(spec: str) -> WarmStart:
    """Opens ``spec`` (see the module docstring) without loading any weights yet."""
    kind, sep, rest = spec.partition(":")
    if sep and kind in ("hf", "tf", "orbax"):
        path = path_or_url(locate(rest))
    else:
        kind, path = "", path_or_url(locate(spec))
    if kind in ("", "orbax"):
        root = _workdir_root(path)
        if root is not None:
            step_dir = path if path.parent == root and path.name.isdigit() else None
            return _from_workdir(spec, root, step_dir)
        if kind == "":
            if (path / "bert_config.json").exists():
                kind = "orbax"
            elif (path / "config.json").exists() and any((path / f).exists() for f in
                                                          ("model.safetensors", "pytorch_model.bin")):
                kind = "hf"
            else:
                raise FileNotFoundError(
                    f"init_checkpoint {spec!r}: {path} is neither a pre-training workdir (checkpoints/<step>/state)"
                    f", an orbax:DIR with bert_config.json, nor a Hugging Face directory; use hf:DIR, tf:PREFIX "
                    f"or orbax:DIR")
    ckpt = pretrained.read_checkpoint(f"{kind}:{path}")
    vocab = str(ckpt.vocab_file) if ckpt.vocab_file else None

    allow = () if ckpt.heads["pooler"] else ("bert/pooler",)
    return WarmStart(spec, ckpt.config, vocab, ckpt.heads["pooler"],
                     lambda model: pretrained.load_into(ckpt, model, only="bert", allow_missing=allow))

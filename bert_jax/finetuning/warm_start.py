"""Fine-tuning's ``init_checkpoint``: where the encoder's weights, model config and vocabulary come from.

Accepted specs (``pkg:`` names are located first, e.g. ``hf:pkg:minilm``):

* a workdir of ``train.py``, pre-training or fine-tuning (or its ``checkpoints`` directory, or one
  step directory), optionally written ``orbax:WORKDIR``: the latest step's parameters; the model
  config from the checkpoint's metadata; the vocabulary from the workdir's ``config.json``
  (`bert_jax.interop.pretrained.read_workdir`);
* ``orbax:DIR`` written by `bert_jax.interop.pretrained.save_orbax` (``bert_config.json`` + ``params``);
* ``hf:DIR`` (Hugging Face BERT, ALBERT, ELECTRA or RoBERTa: `bert_jax.interop.pretrained.read_hf`) and
  ``tf:PREFIX`` (Google's TF checkpoint).

Only the encoder (``bert/...``, pooler included) is restored; task heads start fresh. A checkpoint
without a pooler (e.g. trained with ``use_pooler=False``) leaves the pooler freshly initialised.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from flax import nnx

from bert_jax.interop import pretrained
from bert_jax.model.config import BertConfig

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


def open_init_checkpoint(spec: str) -> WarmStart:
    """Opens ``spec`` (see the module docstring) without loading any weights yet (a Hugging Face or
    TF checkpoint's tensors are read now; a workdir's and an Orbax directory's when loaded)."""
    ckpt = pretrained.read_checkpoint(spec)
    vocab = str(ckpt.vocab_file) if ckpt.vocab_file else None
    allow = () if ckpt.heads["pooler"] else ("bert/pooler",)  # e.g. ELECTRA's discriminator has none
    return WarmStart(spec, ckpt.config, vocab, ckpt.heads["pooler"],
                     lambda model: pretrained.load_into(ckpt, model, only="bert", allow_missing=allow))

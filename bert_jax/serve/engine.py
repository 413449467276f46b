"""The model side of the server: loads ``--init`` (a pre-trained checkpoint or a fine-tuning workdir),
tokenizes requests (truncating, and saying so), and runs fixed-shape batches through one jitted
forward pass that returns every pooling (and the classifier's probabilities).

Shapes: a batch is padded to the smallest length bucket (16, 32, 64, ... up to ``max_seq_length``)
and batch bucket (1, 2, 4, ... up to ``max_batch``) that hold it; `Engine.warm_up` compiles every
(batch, length) pair at start-up, so steady-state traffic never compiles. ``compiles`` counts the
traces of the forward pass (one per new shape), which /metrics reports.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax.config_args import is_finetuning
from bert_jax.finetuning import task as fs
from bert_jax.finetuning.warm_start import open_init_checkpoint
from bert_jax.interop.extract_features import truncate_pair
from bert_jax.interop.pretrained import check_vocab_size
from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.resolve import saved_model
from bert_jax.serve import pooling
from bert_jax.training.checkpoints import Checkpointer, load_into_model
from input_pipeline.package_data import locate
from input_pipeline.tokenizers.factory import load_tokenizer

log = logging.getLogger(__name__)
CLASSIFIER_KINDS = ("classification", "regression")


@dataclasses.dataclass
class Row:
    """One tokenized input: ids and segment ids (unpadded), and whether it was cut to fit."""

    ids: list[int]
    segments: list[int]
    truncated: bool


class Embedder(nnx.Module):
    """A bare encoder under ``.bert`` (the path prefix every warm start loads into)."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertEncoder(cfg, rngs=rngs)


def buckets(limit: int, first: int) -> list[int]:
    """first, 2·first, 4·first, ... below ``limit``, then ``limit`` itself."""
    out, b = [], first
    while b < limit:
        out.append(b)
        b *= 2
    return [*out, limit]


class Engine:
    def __init__(self, model: nnx.Module, cfg: BertConfig, tokenizer, *, max_seq_length: int, max_batch: int,
                 source: str, kind: str = "encoder", label_names: tuple[str, ...] = (),
                 default_pooling: str = "cls", default_normalize: bool = False):
        self.cfg, self.tokenizer, self.source, self.kind = cfg, tokenizer, source, kind
        self.label_names = tuple(label_names)
        self.default_pooling, self.default_normalize = default_pooling, default_normalize
        self.max_seq_length, self.max_batch = max_seq_length, max_batch
        self.length_buckets = buckets(max_seq_length, min(16, max_seq_length))
        self.batch_buckets = buckets(max_batch, 1)
        self.poolings = tuple(p for p in pooling.POOLINGS if p != "pooled" or cfg.use_pooler)
        self.compiles = 0  # traces of the forward pass: one per new (batch, length) shape
        self.compiled_shapes: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self.model = model  # the module (its .bert is the encoder), e.g. for an attention page
        graphdef, self._state = nnx.split(model)
        classifier = kind in CLASSIFIER_KINDS

        def forward(state, ids, mask, seg):  # ids, mask, seg [B, L] int32
            self.compiles += 1  # Python runs this only while tracing
            self.compiled_shapes.append(tuple(ids.shape))
            m = nnx.merge(graphdef, state)
            enc = m.bert(ids, mask, seg, deterministic=True, output_hidden_states=True)
            out = pooling.all_poolings(enc.hidden_states, enc.pooled_output, mask)
            if classifier:
                logits = m.classifier(enc.pooled_output, deterministic=True).astype(jnp.float32)  # [B, C]
                out["logits"] = logits
            return out

        self._forward = jax.jit(forward)

    # ------------------------------------------------------------------ tokenization

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> list[Row]:
        """Texts (and second segments) → rows in the tokenizer's layout, cut to ``max_seq_length``."""
        import tensorflow as tf

        tok = self.tokenizer
        pieces = tok.tokenize(tf.constant([*texts, *(pairs or [])], tf.string)).to_list()
        rows = []
        for i, a in enumerate(pieces[: len(texts)]):
            a, b = list(a), (list(pieces[len(texts) + i]) if pairs is not None else None)
            n = len(a) + (len(b) if b is not None else 0)
            truncate_pair(a, b, self.max_seq_length, tok.pair_separators)
            truncated = len(a) + (len(b) if b is not None else 0) < n
            ids = [tok.cls_id, *a, tok.sep_id]
            seg = [0] * len(ids)
            if b is not None:
                ids += [tok.sep_id] * (tok.pair_separators - 1) + [*b, tok.sep_id]
                seg += [tok.segment_b] * (len(ids) - len(seg))
            rows.append(Row(ids, seg, truncated))
        return rows

    def tokens(self, row: Row) -> list[str]:
        return self.tokenizer.id_to_token(row.ids)

    # ------------------------------------------------------------------ running

    def shape_for(self, rows: int, length: int) -> tuple[int, int]:
        """The compiled (batch, length) that holds ``rows`` rows of up to ``length`` tokens."""
        return (next(b for b in self.batch_buckets if b >= rows), next(n for n in self.length_buckets if n >= length))

    def run(self, rows: list[Row]) -> dict[str, np.ndarray]:
        """One batch (at most ``max_batch`` rows) → {output: [len(rows), ...]} numpy float32."""
        batch, length = self.shape_for(len(rows), max(len(r.ids) for r in rows))
        ids = np.full((batch, length), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((batch, length), np.int32)
        seg = np.zeros((batch, length), np.int32)
        for i, r in enumerate(rows):
            ids[i, : len(r.ids)], mask[i, : len(r.ids)], seg[i, : len(r.ids)] = r.ids, 1, r.segments
        with self._lock:  # one forward pass at a time (the batcher's thread; warm-up)
            out = self._forward(self._state, ids, mask, seg)
        return {k: np.asarray(v)[: len(rows)] for k, v in out.items()}

    def warm_up(self) -> int:
        """Compiles every (batch, length) bucket; returns the number of compiled programs."""
        for b in self.batch_buckets:
            for n in self.length_buckets:
                ids = [self.tokenizer.cls_id] * n
                self.run([Row(ids, [0] * n, False)] * b)
        return self.compiles


# ---------------------------------------------------------------------- loading


def _finetuning_config(path: Path) -> dict | None:
    """The fine-tuning workdir's config.json (one with a ``task`` section), or None."""
    f = path / "config.json"
    if not (path.is_dir() and f.is_file() and (path / "checkpoints").is_dir()):
        return None
    try:
        config = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from e
    return config if isinstance(config, dict) and is_finetuning(config) else None


def _check_length(max_seq_length: int, cfg: BertConfig) -> None:
    model_max = cfg.max_position_embeddings - cfg.position_offset
    if not 3 <= max_seq_length <= model_max:
        raise ValueError(f"--max_seq_length {max_seq_length}: expected 3..{model_max} for this checkpoint")


def _load_finetuned(path: Path, config: dict, vocab: str | None, **kw) -> Engine:
    from input_pipeline.tasks import make_task

    task = make_task(config["task"])
    if task.kind not in CLASSIFIER_KINDS:
        raise ValueError(f"{path}: a {task.kind} task ({task.name}); the server classifies only "
                         f"{' and '.join(CLASSIFIER_KINDS)} workdirs")
    ckpt = Checkpointer(path, async_save=False)
    try:
        meta = ckpt.read_meta()
    finally:
        ckpt.close()
    cfg = saved_model(meta["model"], path).deterministic()  # as the job resolved it: read, not resolved again
    _check_length(kw["max_seq_length"], cfg)
    vocab = vocab or config["vocab"] or None  # every fine-tuning config.json has vocab and init_checkpoint
    if not vocab and config["init_checkpoint"]:
        vocab = open_init_checkpoint(config["init_checkpoint"]).vocab_file
    if not vocab:
        raise ValueError(f"{path / 'config.json'}: names no vocabulary (vocab, init_checkpoint); pass --vocab")
    model = nnx.jit(lambda: fs.make_model(cfg, task.kind, task.num_labels, 0))()
    load_into_model(path, model, only=None)
    names = tuple(getattr(task, "label_names", ())) if task.kind == "classification" else ()
    return Engine(model, cfg, load_tokenizer(locate(vocab)), source=str(path), kind=task.kind,
                  label_names=names, **kw)


def load(init: str, *, max_seq_length: int = 128, max_batch: int = 64, vocab: str | None = None) -> Engine:
    """An engine for ``init``: a fine-tuning workdir (classifier), or any spec that
    `bert_jax.finetuning.warm_start.open_init_checkpoint` takes (hf:DIR, tf:PREFIX, orbax:DIR, a
    pre-training workdir; encoder only). Not warmed up yet."""
    if max_batch < 1:
        raise ValueError(f"--max_batch {max_batch}: expected at least 1")
    kw = dict(max_seq_length=max_seq_length, max_batch=max_batch)
    kind, sep, rest = init.partition(":")
    local = Path(locate(rest if sep and kind in ("hf", "tf", "orbax") else init))
    if not sep or kind not in ("hf", "tf", "orbax"):
        if (config := _finetuning_config(local)) is not None:
            return _load_finetuned(local, config, vocab, **kw)
        if not local.exists():
            raise FileNotFoundError(f"--init {init}: {local} does not exist (expected a fine-tuning workdir, "
                                    f"a pre-training workdir, hf:DIR, tf:PREFIX or orbax:DIR)")
    warm = open_init_checkpoint(init)
    cfg = dataclasses.replace(warm.config, use_pooler=warm.has_pooler).deterministic()
    _check_length(max_seq_length, cfg)
    vocab = vocab or warm.vocab_file
    if not vocab:
        raise ValueError(f"--init {init}: no vocabulary beside the checkpoint; pass --vocab")
    tokenizer = load_tokenizer(locate(vocab))
    check_vocab_size(cfg, tokenizer.vocab_size, vocab, "the checkpoint")
    model = nnx.jit(lambda: Embedder(cfg, rngs=nnx.Rngs(0)))()
    warm.load_encoder(model)
    defaults = pooling.sentence_transformers_defaults(local) if local.is_dir() else None
    pool, norm = defaults or ("cls", False)
    return Engine(model, cfg, tokenizer, source=init, default_pooling=pool, default_normalize=norm, **kw)

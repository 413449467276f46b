"""CoNLL-2003 named-entity recognition as a fine-tuning task (kind "tagging"), the BERT paper's recipe.

Sources, ``NerTask(source, data_dir=...)``:

* ``""`` (default): CoNLL files in ``data_dir`` (local or ``gs://``; or pass the directory as
  ``source``): ``train.txt``, ``valid.txt`` (or ``dev.txt``) and ``test.txt`` for the splits
  train, dev, test. One token per line, columns
  separated by spaces or tabs, the NER tag in the last column (``WORD POS CHUNK NER`` as released,
  or ``WORD TAG``); every token line of a file has the column count of its first one. Blank lines
  and ``-DOCSTART-`` lines end sentences; a ``-DOCSTART-`` is remembered (`NerExample.doc_start`).
* ``"tfds"`` or ``"tfds:conll2003"`` (or another TFDS builder with ``tokens`` and ``ner``
  features): the prepared TFDS dataset (``download=False``), ``data_dir`` being the TFDS data dir.

Tags: ``label_names`` default to CoNLL-2003's nine (`CONLL2003_LABELS`). Input may be IOB1 (the
original release, where ``I-X`` starts an entity unless it follows ``B-X``/``I-X``) or BIO; it is
converted to BIO (IOB2: every entity starts with ``B-``) on loading (`iob1_to_bio`), which leaves
the entities as conlleval reads them and BIO input unchanged. A token line with the wrong column
count, or a tag not in ``label_names``, is reported as ``file:line: ...``: with ``on_error="skip"``
its sentence is dropped, counted in ``report[split]`` and logged; with ``"raise"`` it raises
`TaskDataError`. A file that is not UTF-8 always raises.

Features: `ner_features.featurize_words` (each word tokenized alone, the label on its first
sub-token, a sentence longer than ``max_seq_length`` split into rows at word boundaries).

Evaluation: argmax over the tags at each first sub-token gives one tag per word; sentences are
scored by `input_pipeline.tasks.ner_metrics.ner_scores` (entity-level micro P/R/F1 with conlleval's chunk
rules, per-type scores, token accuracy; fractions). ``predictions_<split>.txt`` is conlleval's
input: ``WORD GOLD PRED`` per line, a blank line after each sentence, and ``-DOCSTART- O O``
(followed by a blank line) where the source had one: ``conlleval.pl < predictions_dev.txt``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path

import numpy as np
import tensorflow as tf

from input_pipeline.files import path_or_url, write_atomically
from input_pipeline.tasks.base import TaskDataError
from input_pipeline.tasks.ner_features import featurize_words
from input_pipeline.tasks.ner_metrics import ner_scores

log = logging.getLogger(__name__)

CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
SPLIT_FILES = {"train": ("train.txt",), "dev": ("valid.txt", "dev.txt"), "test": ("test.txt",)}
_COLUMNS = re.compile(r"[ \t]+")


@dataclasses.dataclass(frozen=True)
class NerExample:
    words: tuple[str, ...]
    tags: tuple[str, ...]  # BIO (IOB2), one per word
    doc_start: bool = False  # a -DOCSTART- line came before this sentence
    location: str = ""  # where its first word is: "file:line" or "tfds:NAME:SPLIT#i word 0"


def iob1_to_bio(tags: list[str] | tuple[str, ...]) -> list[str]:
    """IOB1 (or BIO) → BIO: an ``I-X`` that does not continue an X entity becomes ``B-X``."""
    out: list[str] = []
    prev_type = None
    for tag in tags:
        if tag.startswith("I-") and prev_type != tag[2:]:
            tag = "B-" + tag[2:]
        out.append(tag)
        prev_type = tag[2:] if tag[:2] in ("B-", "I-") else None
    return out


def _blocks(lines: list[str]):
    """(doc_start, [(line number, columns), ...]) per sentence of a CoNLL file."""
    block, doc_start = [], False
    for lineno, line in enumerate(lines, 1):
        text = line.strip(" \t\r\n")
        cols = _COLUMNS.split(text) if text else []
        if not cols or cols[0] == "-DOCSTART-":
            if block:
                yield doc_start, block
                block, doc_start = [], False
            doc_start |= bool(cols)
        else:
            block.append((lineno, cols))
    if block:
        yield doc_start, block


class NerTask:
    """CoNLL-2003 NER; see the module docstring. ``report[split]`` counts what `load` read/skipped."""

    kind = "tagging"
    splits = ("train", "dev", "test")
    eval_splits = ("dev", "test")  # the paper reports dev and test F1

    def __init__(self, source: str = "", *, data_dir: str | os.PathLike | None = None,
                 label_names: tuple[str, ...] | list[str] | None = None, on_error: str = "skip"):
        source = os.fspath(source).strip()
        if source and not source.startswith("tfds"):  # a directory of CoNLL files, as data_dir
            if data_dir is not None and os.fspath(data_dir) != source:
                raise ValueError(f"NerTask: CoNLL directory given twice: {source=}, {data_dir=}")
            source, data_dir = "", source
        if source and source != "tfds" and not source.startswith("tfds:"):
            raise ValueError(f"NerTask source must be a directory, 'tfds' or 'tfds:NAME', got {source!r}")
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        self.tfds_name = (source.partition(":")[2] or "conll2003") if source.startswith("tfds") else None
        if self.tfds_name is None and data_dir is None:
            raise ValueError("NerTask reads CoNLL files (train.txt, valid.txt, test.txt) from "
                             "data_dir: pass data_dir=..., or source='tfds'")
        self.label_names = tuple(label_names or CONLL2003_LABELS)
        if len(set(self.label_names)) != len(self.label_names):
            raise ValueError(f"label_names has duplicates: {self.label_names}")
        self.name = self.tfds_name or "conll2003"
        self.num_labels = len(self.label_names)
        self.source, self.data_dir, self.on_error = source, data_dir, on_error
        self.report: dict[str, dict] = {}

    # ---- loading ----

    def load(self, split: str) -> list[NerExample]:
        if split not in self.splits:
            raise ValueError(f"{self.name}: unknown split {split!r} (expected one of {self.splits})")
        rep = self.report[split] = {"sentences": 0, "skipped": 0, "first_error": None}
        raw = self._tfds_sentences(split) if self.tfds_name else self._file_sentences(split)
        examples, pending_doc = [], False
        for words, tags, wheres, doc_start, error in raw:
            pending_doc |= doc_start  # a dropped sentence hands its document break on
            bio = iob1_to_bio(tags)
            if error := error or self._tag_error(tags, bio, wheres):
                if self.on_error == "raise":
                    raise error
                rep["skipped"] += 1
                rep["first_error"] = rep["first_error"] or str(error)
                continue
            examples.append(NerExample(tuple(words), tuple(bio), pending_doc, wheres[0]))
            pending_doc = False
        rep["sentences"] = len(examples)
        if rep["skipped"]:
            log.warning("%s %s: skipped %d malformed sentences (first: %s)", self.name, split,
                        rep["skipped"], rep["first_error"])
        return examples

    def _tag_error(self, tags, bio, wheres) -> TaskDataError | None:
        known = set(self.label_names)
        for tag, new, where in zip(tags, bio, wheres, strict=True):
            if tag not in known:
                return TaskDataError(f"{where}: unknown tag {tag!r} (expected one of {self.label_names})")
            if new not in known:
                return TaskDataError(f"{where}: IOB1 tag {tag!r} starts an entity but {new!r} is not "
                                     f"in label_names {self.label_names}")
        return None

    def _path(self, split: str) -> str:
        names = SPLIT_FILES[split]
        for name in names:
            path = os.path.join(os.fspath(self.data_dir), name)
            if tf.io.gfile.exists(path):
                return path
        raise TaskDataError(f"{self.name} {split}: no {' or '.join(names)} in {self.data_dir}")

    def _file_sentences(self, split: str):
        """(words, tags, file:line per word, doc_start, the sentence's first TaskDataError or None)."""
        path = self._path(split)
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
        try:
            lines = data.decode("utf-8").split("\n")  # not splitlines: \x85, \x1c... are words
        except UnicodeDecodeError as e:
            lineno = data.count(b"\n", 0, e.start) + 1
            raise TaskDataError(f"{path}:{lineno}: not valid UTF-8 ({e.reason})") from e
        ncols = None  # (columns, line) of the file's first token line
        for doc_start, block in _blocks(lines):
            words, tags, wheres, error = [], [], [], None
            for lineno, cols in block:
                if ncols is None and len(cols) >= 2:
                    ncols = (len(cols), lineno)
                if error is None and (len(cols) < 2 or len(cols) != ncols[0]):
                    like = f" like line {ncols[1]}" if ncols else ""
                    error = TaskDataError(
                        f"{path}:{lineno}: expected {ncols[0] if ncols else 'at least 2'} columns "
                        f"(WORD ... TAG){like}, got {len(cols)}: {' '.join(cols)!r}")
                words.append(cols[0])
                tags.append(cols[-1])
                wheres.append(f"{path}:{lineno}")
            yield words, tags, wheres, doc_start, error

    def _tfds_sentences(self, split: str):
        import tensorflow_datasets as tfds  # slow to import; only for TFDS sources

        name = self.tfds_name
        try:
            builder = tfds.builder(name, data_dir=self.data_dir)
            ds = builder.as_dataset(split=split, shuffle_files=False)
            tag_names = builder.info.features["ner"].feature.names
        except Exception as e:  # not prepared, unknown name/split, no "ner" feature, ...
            raise TaskDataError(f"tfds:{name}: cannot load split {split!r} with tokens/ner "
                                f"features ({e}); prepare it first, e.g. `tfds build {name}`") from e
        for i, ex in enumerate(ds.as_numpy_iterator()):
            words = [w.decode("utf-8") for w in ex["tokens"]]
            if words:  # the TFDS builder can yield an empty last example
                where = f"tfds:{name}:{split}#{i}"
                wheres = [f"{where} word {j}" for j in range(len(words))]
                tags = [tag_names[t] for t in ex["ner"]]
                error = None if len(tags) == len(words) else TaskDataError(
                    f"{where}: {len(words)} tokens but {len(tags)} ner tags")
                yield words, tags, wheres, False, error

    # ---- features ----

    def featurize(self, examples: list[NerExample], tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
        """One word at a time, labels on first sub-tokens, long sentences split (`ner_features`)."""
        return featurize_words(examples, tokenizer, max_seq_length, self.label_names)

    # ---- predictions and metrics ----

    def predicted_tags(self, examples: list[NerExample], features: dict[str, np.ndarray],
                       outputs: dict[str, np.ndarray]) -> list[list[str]]:
        """One predicted tag per word of each example: argmax at the word's first sub-token."""
        logits, wi = np.asarray(outputs["logits"]), np.asarray(features["word_index"])
        if logits.ndim != 3 or logits.shape[:2] != wi.shape or logits.shape[2] != self.num_labels:
            raise ValueError(f"logits must be [N, L, {self.num_labels}] for word_index {wi.shape}, "
                             f"got {logits.shape}")
        lengths = np.array([len(ex.words) for ex in examples], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        rows, cols = np.nonzero(wi >= 0)
        ex_idx, word = np.asarray(features["example_index"])[rows], wi[rows, cols]
        if len(rows) and (ex_idx.max() >= len(examples) or (word >= lengths[ex_idx]).any()):
            raise ValueError("features do not come from these examples (example_index/word_index "
                             "out of range)")
        pred = np.full(offsets[-1], -1, np.int64)
        pred[offsets[ex_idx] + word] = logits[rows, cols].argmax(-1)
        if (missing := np.flatnonzero(pred < 0)).size:
            e = int(np.searchsorted(offsets, missing[0], side="right") - 1)
            raise ValueError(f"word {missing[0] - offsets[e]} of example {e} ({examples[e].location}) "
                             f"has no prediction: features do not come from these examples")
        names = self.label_names
        return [[names[i] for i in pred[offsets[e]:offsets[e + 1]]] for e in range(len(examples))]

    def evaluate(self, examples, features, outputs) -> dict[str, float]:
        pred = self.predicted_tags(examples, features, outputs)
        return ner_scores([ex.tags for ex in examples], pred)

    def write_predictions(self, examples, features, outputs, out_dir: Path, split: str) -> list[Path]:
        pred = self.predicted_tags(examples, features, outputs)
        lines = []
        for ex, tags in zip(examples, pred, strict=True):
            if ex.doc_start:
                lines.append("-DOCSTART- O O\n\n")
            lines.extend(f"{w} {g} {p}\n" for w, g, p in zip(ex.words, ex.tags, tags, strict=True))
            lines.append("\n")
        path = path_or_url(out_dir) / f"predictions_{split}.txt"
        return [write_atomically(path, "".join(lines).encode("utf-8"))]  # never a half-written file

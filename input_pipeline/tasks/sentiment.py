"""Binary sentiment classification of single sentences (the ``make demo`` fine-tuning task) as a `Task`.

Sources (``SentimentTask(source)``):

* ``""`` or ``pkg:movie_reviews``: the 10,605 movie-review sentences with human sentiment scores of
  Hutto & Gilbert (ICWSM 2014), ``movieReviewSnippets_GroundTruth.txt`` from the ``vaderSentiment``
  3.3.2 source distribution (MIT; fetched by `input_pipeline.package_data`);
* a file of the user's in either format below, auto-detected from its first data line;
* a directory holding ``train.tsv`` and ``dev.tsv`` (optionally ``test.tsv``) in either format:
  those are the splits, used as they are.

Formats (tab-separated, UTF-8, ``\\n`` or ``\\r\\n`` line ends, blank lines ignored):

* snippets: ``id<TAB>score<TAB>text``; label = sign of the score (``score > 0`` positive,
  ``< 0`` negative); sentences scored exactly 0 have no label and are dropped, counted in
  ``dropped[split]`` and logged (37 in the review file). With ``target="score"`` the task is a
  regression on the score itself (kind ``regression``: mean squared error; Pearson and Spearman
  correlations, their mean the headline ``score``), and no sentence is dropped;
* labelled: ``label<TAB>text`` with label ``0``/``1``, ``neg``/``pos`` or ``negative``/``positive``
  (any case); an optional header line whose first field is ``label`` is skipped.

Split of a single file (fixed, no randomness): data line k (k = 1, 2, ... counting non-blank lines
after any header) goes to ``dev`` when k is a multiple of ``dev_every`` (default 10), else to
``train``; zero-score rows are dropped after the split. For the review file, whose ids are its line
numbers, that is ``id % 10 == 0``: 9,514 train and 1,054 dev sentences (533 positive, 521 negative:
always answering "positive" scores 0.506 on dev).

Validation (``validation_every`` V > 0, default 0 = none): of the training lines, counted j = 1,
2, ... in file order (``train.tsv``'s lines for a directory source), those with j a multiple of V go
to ``validation`` instead of ``train``, so the choices of a recipe (learning rates) can be made on
sentences that are neither trained on nor the reported dev split. For the review file with V = 10:
8,563 train and 951 validation sentences (ids 11, 22, ..., 99, 111, ...), dev unchanged.
``eval_splits`` (comma-separated, default ``dev``) names the splits the trainer scores.

The training examples come back in a fixed shuffled order (numpy ``default_rng(0)`` permutation):
the review file lists ~5.3k mostly positive sentences before ~5.3k mostly negative ones (the order
of Pang & Lee's polarity data), so the first N of the file order, which ``max_train_examples``
keeps, would be nearly all positive. The dev and validation splits stay in file order.

A line with the wrong number of fields, an unparseable score, an unknown label, an empty text or
invalid UTF-8 is malformed: reported as ``file:line``, counted in ``skipped[split]`` and skipped with a
warning (``on_error="skip"``), or raised as `TaskDataError` (``on_error="raise"``). Features are
``[CLS] text [SEP]``, truncated to ``max_seq_length``; the metric is accuracy. Predictions are written
as ``<split>_sentiment.tsv``: ``id, prediction, p_positive, label, text`` under that header
(``target="score"``: ``id, prediction, score, text``, the prediction a score).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from input_pipeline.files import path_or_url, write_atomically
from input_pipeline.tasks.base import TaskDataError, feature_labels, tokenize_texts

log = logging.getLogger(__name__)

LABEL_NAMES = ("negative", "positive")
_LABELS = {"0": 0, "1": 1, "neg": 0, "pos": 1, "negative": 0, "positive": 1}
TRAIN_ORDER_SEED = 0
_MAX_REPORTED = 5  # malformed lines logged one by one; the rest only counted


TARGETS = ("sign", "score")  # what a scored file's score becomes: a class by its sign, or the value itself


@dataclasses.dataclass(frozen=True)
class SentimentExample:
    id: str  # the snippet file's id field, else the example's line number in its file
    text: str
    label: int | float | None  # 0 negative, 1 positive (target "score": the score); None: unlabelled (test)


class SentimentTask:
    """Two-class sentence sentiment, or a regression on a scored file's scores (``target="score"``);
    see the module docstring. ``skipped[split]``: malformed lines; ``dropped[split]``: zero-score
    sentences without a label."""

    def __init__(self, source: str = "", *, dev_every: int = 10, validation_every: int = 0,
                 eval_splits: str | tuple = "dev", on_error: str = "skip", name: str = "sentiment",
                 target: str = "sign"):
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        if target not in TARGETS:
            raise ValueError(f"target={target!r}: expected 'sign' (two classes by the score's sign) or 'score' "
                             "(a regression on the score)")
        self.target = target
        self.kind = "regression" if target == "score" else "classification"
        self.num_labels = 1 if target == "score" else 2
        self.label_names = () if target == "score" else LABEL_NAMES
        self.dropped: dict[str, int] = {}
        if dev_every < 2:
            raise ValueError(f"dev_every must be at least 2, got {dev_every}")
        if validation_every == 1 or validation_every < 0:
            raise ValueError(f"validation_every must be 0 (no validation split) or at least 2, got {validation_every}")
        self.name, self.on_error, self.dev_every = name, on_error, int(dev_every)
        self.validation_every = int(validation_every)
        self.source = source.strip() or "pkg:movie_reviews"
        self.skipped: dict[str, int] = {}
        self._files: dict[str, str] | None = None  # split -> file (directory sources)
        self._single: str | None = None  # the file a single-file source splits
        self.splits = ("train", "validation", "dev") if self.validation_every else ("train", "dev")
        names = eval_splits.split(",") if isinstance(eval_splits, str) else eval_splits
        self.eval_splits = tuple(n.strip() for n in names if n.strip())
        scorable = [s for s in self.splits if s != "train"]
        if not self.eval_splits or any(s not in scorable for s in self.eval_splits):
            raise ValueError(f"eval_splits={eval_splits!r}: expected some of {scorable}"
                             + ("" if self.validation_every else " (validation needs validation_every > 0)"))

    def __repr__(self) -> str:
        return f"SentimentTask({self.source!r})"

    def _resolve(self) -> None:
        if self._files is not None or self._single is not None:
            return
        from input_pipeline.package_data import locate

        path = locate(self.source)
        if tf.io.gfile.isdir(path):
            files = {s: os.path.join(path, f"{s}.tsv") for s in ("train", "dev", "test")}
            missing = [f for s, f in files.items() if s != "test" and not tf.io.gfile.exists(f)]
            if missing:
                raise FileNotFoundError(f"sentiment source {path} is a directory without {missing}; expected "
                                        f"train.tsv and dev.tsv (label<TAB>text or id<TAB>score<TAB>text)")
            if tf.io.gfile.exists(files["test"]):
                self.splits = (*self.splits, "test")
            self._files = {s: f for s, f in files.items() if s in self.splits}
        elif tf.io.gfile.exists(path):
            self._single = path
        else:
            raise FileNotFoundError(f"sentiment source {path!r} does not exist (expected a file of "
                                    f"label<TAB>text or id<TAB>score<TAB>text lines, or a directory with "
                                    f"train.tsv and dev.tsv)")

    # ------------------------------------------------------------------ loading

    def load(self, split: str) -> list[SentimentExample]:
        self._resolve()
        if split not in self.splits:
            raise ValueError(f"{self.name}: no split {split!r}; expected one of {self.splits}")
        self.skipped[split] = 0
        if self._files is not None:
            own = self._files["train" if split == "validation" else split]
            rows = self._read(own, split, (lambda k: self._train_line(k) == split) if split in ("train", "validation")
                              else (lambda k: True))
        else:
            rows = self._read(self._single, split, lambda k: (
                "dev" if k % self.dev_every == 0 else self._train_line(k - k // self.dev_every)) == split)
        examples = [ex for ex in rows if ex.label is not None or split == "test"]
        self.dropped[split] = len(rows) - len(examples)
        if self.dropped[split]:
            log.info("%s %s: %d sentence(s) scored exactly 0 dropped: no label, neither positive nor negative "
                     "(%d kept)", self.name, split, self.dropped[split], len(examples))
        if not examples:
            raise TaskDataError(f"{self.name} {split}: no usable examples in {self._files or self._single}")
        if split == "train":  # a fixed shuffle: the first N are a fair sample (max_train_examples)
            examples = [examples[i] for i in np.random.default_rng(TRAIN_ORDER_SEED).permutation(len(examples))]
        return examples

    def _train_line(self, j: int) -> str:
        """The split of the j-th training line (j = 1, 2, ...): validation or train."""
        return "validation" if self.validation_every and j % self.validation_every == 0 else "train"

    def _bad(self, split: str, where: str, what: str) -> None:
        if self.on_error == "raise":
            raise TaskDataError(f"{where}: {what}")
        self.skipped[split] += 1
        if self.skipped[split] <= _MAX_REPORTED:
            log.warning("%s: %s (skipped)", where, what)

    def _read(self, path: str, split: str, mine) -> list[SentimentExample]:
        """The well-formed data lines k (counted from 1) with ``mine(k)`` true; malformed ones among
        them are reported. Zero-score snippets come back with ``label=None``."""
        with tf.io.gfile.GFile(path, "rb") as f:
            raw_lines = f.read().split(b"\n")
        fmt, out, k = None, [], 0
        for number, raw in enumerate(raw_lines, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8").rstrip("\r")
            except UnicodeDecodeError:
                k += 1
                if mine(k):
                    self._bad(split, where, "not valid UTF-8")
                continue
            if not line.strip():
                continue
            if fmt is None:
                fmt = _detect_format(line.split("\t"), where)
                if fmt == "labelled" and self.target == "score":
                    raise TaskDataError(f"{where}: target=score needs a scored file (id<TAB>score<TAB>text lines); "
                                        f"this one is label<TAB>text")
                if fmt == "labelled" and line.split("\t")[0].strip().lower() == "label":
                    continue  # header
            k += 1
            if not mine(k):
                continue
            expected = 3 if fmt == "snippets" else 2
            fields = line.split("\t", expected - 1)  # the text may hold tabs
            if len(fields) != expected:
                self._bad(split, where, f"{len(fields)} tab-separated field(s), expected {expected} "
                                        f"({'id, score, text' if fmt == 'snippets' else 'label, text'})")
                continue
            text = fields[-1].strip()
            if not text:
                self._bad(split, where, "empty text")
                continue
            if fmt == "snippets":
                try:
                    score = float(fields[1])
                except ValueError:
                    score = math.nan
                if not math.isfinite(score):
                    self._bad(split, where, f"score {fields[1]!r} is not a finite number")
                    continue
                label = score if self.target == "score" else None if score == 0 else int(score > 0)
                out.append(SentimentExample(fields[0].strip(), text, label))
            else:
                value = fields[0].strip().lower()
                if value not in _LABELS and not (split == "test" and value == ""):
                    self._bad(split, where, f"unknown label {fields[0]!r} (expected 0/1, neg/pos or "
                                            f"negative/positive)")
                    continue
                out.append(SentimentExample(str(number), text, _LABELS.get(value)))
        if self.skipped.get(split):
            log.warning("%s: skipped %d malformed line(s)", path, self.skipped[split])
        return out

    # ------------------------------------------------------------------ features

    def featurize(self, examples: list[SentimentExample], tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
        """``[CLS] text [SEP]``, the text truncated to ``max_seq_length - 2`` tokens, padded with ``pad_id``."""
        if max_seq_length < 3:
            raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
        n, length = len(examples), max_seq_length
        flat, lengths = tokenize_texts(tokenizer, [e.text for e in examples])
        kept = np.minimum(lengths, length - 2)
        ids = np.full((n, length), tokenizer.pad_id, np.int32)
        ids[:, 0] = tokenizer.cls_id
        rows = np.repeat(np.arange(n), kept)
        within = np.arange(len(rows)) - np.repeat(np.cumsum(kept) - kept, kept)
        ids[rows, 1 + within] = flat[(np.cumsum(lengths) - lengths)[rows] + within]
        ids[np.arange(n), 1 + kept] = tokenizer.sep_id
        mask = (np.arange(length)[None, :] < (kept + 2)[:, None]).astype(np.int32)
        dtype = np.float32 if self.target == "score" else np.int32
        labels = np.asarray([0 if e.label is None else e.label for e in examples], dtype).reshape(n)
        return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros((n, length), np.int32),
                "example_index": np.arange(n, dtype=np.int32), "label": labels}

    # ------------------------------------------------------------------ outputs

    def _logits(self, features, outputs) -> np.ndarray:
        n = len(features["example_index"])
        logits = np.asarray(outputs["logits"], np.float64)
        if logits.shape != (n, 2):
            raise ValueError(f"{self.name}: logits of shape {logits.shape}, expected [{n}, 2]")
        return logits

    def evaluate(self, examples, features, outputs) -> dict[str, float]:
        from input_pipeline.tasks.glue_metrics import accuracy, pearson_spearman

        labels = feature_labels(self.name, examples, features)
        if self.target == "score":
            predicted = np.asarray(outputs["predictions"], np.float64)
            gold = np.asarray(labels, np.float64)
            pearson, spearman = pearson_spearman(gold, predicted)
            return {"pearson": pearson, "spearman": spearman, "mse": float(np.mean((predicted - gold) ** 2)),
                    "score": (pearson + spearman) / 2}
        acc = accuracy(labels, self._logits(features, outputs).argmax(-1))
        return {"accuracy": acc, "score": acc}

    def write_predictions(self, examples, features, outputs, out_dir: Path, split: str) -> list[Path]:
        if self.target == "score":
            lines = ["id\tprediction\tscore\ttext"]
            for i, value in zip(features["example_index"], np.asarray(outputs["predictions"]), strict=True):
                ex = examples[i]
                gold = "" if ex.label is None else f"{ex.label:g}"
                lines.append(f"{ex.id}\t{float(value):.4f}\t{gold}\t{ex.text}")
            path = path_or_url(out_dir) / f"{split}_sentiment.tsv"
            return [write_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))]
        logits = self._logits(features, outputs)
        p_pos = 1.0 / (1.0 + np.exp(logits[:, 0] - logits[:, 1]))
        lines = ["id\tprediction\tp_positive\tlabel\ttext"]
        for i, p in zip(features["example_index"], p_pos, strict=True):
            ex = examples[i]
            gold = "" if ex.label is None else LABEL_NAMES[ex.label]
            lines.append(f"{ex.id}\t{LABEL_NAMES[int(p > 0.5)]}\t{p:.4f}\t{gold}\t{ex.text}")
        path = path_or_url(out_dir) / f"{split}_sentiment.tsv"
        return [write_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))]  # never a half-written file


def _detect_format(fields: list[str], where: str) -> str:
    """``snippets`` (id, score, text) when the second of three or more fields is a number, else
    ``labelled`` (label, text)."""
    if len(fields) >= 3:
        try:
            float(fields[1])
            return "snippets"
        except ValueError:
            pass
    if len(fields) >= 2:
        return "labelled"
    raise TaskDataError(f"{where}: no tab in the first data line; expected id<TAB>score<TAB>text or "
                        f"label<TAB>text lines")



"""The contract between a fine-tuning task (GLUE, SQuAD, NER) and the fine-tuning loop.

A task turns files (or a TFDS dataset) into *examples* (Python objects, kept for post-processing)
and fixed-length *features* (numpy arrays, one row per model input; a SQuAD example can give several
rows, one per window). The trainer (`bert_jax.training.trainer` with `bert_jax.finetuning.task`)
trains on the features, runs the model over a split and hands the raw outputs back to the task,
which turns them into metrics and prediction files.

Feature arrays, all with N rows:

| key | shape | kinds |
|---|---|---|
| input_ids, input_mask, segment_ids | [N, L] int32 | all |
| example_index | [N] int32 (row → index into the examples list) | all |
| label | [N] int32 (classification) / float32 (regression) | classification, regression |
| label_ids, label_mask | [N, L] int32 (label of each first sub-token; mask 1 there) | tagging |
| start_positions, end_positions | [N] int32 (0 = [CLS]: no answer in this window) | span |

Model outputs handed to `evaluate` / `write_predictions` (numpy, N rows in feature order):
``{"logits": [N, C]}`` (classification), ``{"predictions": [N]}`` (regression),
``{"logits": [N, L, C]}`` (tagging), ``{"start_logits": [N, L], "end_logits": [N, L]}`` (span).
Test splits may have no labels; their label features are then zeros and `evaluate` is not called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

KINDS = ("classification", "regression", "tagging", "span")
FEATURE_KEYS = {
    "classification": ("label",),
    "regression": ("label",),
    "tagging": ("label_ids", "label_mask"),
    "span": ("start_positions", "end_positions"),
}
MODEL_KEYS = ("input_ids", "input_mask", "segment_ids")


def feature_shapes(kind: str, rows: int, length: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``{key: (shape, dtype)}`` of ``rows`` features of a task of ``kind`` (the table above, without
    ``example_index``): what a fine-tuning step is compiled for."""
    if kind not in FEATURE_KEYS:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {KINDS}")
    int32, per_token = np.dtype(np.int32), ("label_ids", "label_mask")
    out = {k: ((rows, length), int32) for k in MODEL_KEYS}
    for k in FEATURE_KEYS[kind]:
        dtype = np.dtype(np.float32) if kind == "regression" else int32
        out[k] = ((rows, length) if k in per_token else (rows,), dtype)
    return out


class TaskDataError(ValueError):
    """A malformed task file: the message names the file, line and what was expected."""


def tokenize_texts(tokenizer, texts: list[str], batch: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """Texts → (all ids concatenated, ids per text), tokenized ``batch`` texts at a time."""
    import tensorflow as tf

    flats, lengths = [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
    for start in range(0, len(texts), batch):
        ragged = tokenizer.tokenize(tf.constant(texts[start:start + batch], tf.string))
        flats.append(ragged.flat_values.numpy().astype(np.int32))
        lengths.append(ragged.row_lengths().numpy().astype(np.int64))
    return np.concatenate(flats), np.concatenate(lengths)


def feature_labels(name: str, examples, features) -> list:
    """The label of each feature row's example (``features["example_index"]``); a clear error for an
    unlabelled split (a test split), which ``evaluate`` cannot score."""
    labels = [examples[i].label for i in features["example_index"]]
    if any(label is None for label in labels):
        raise ValueError(f"{name}: evaluate needs a labelled split (test splits have no labels)")
    return labels


class Task(Protocol):
    name: str  # e.g. "mrpc", "squad1.1", "conll2003"
    kind: str  # one of KINDS
    num_labels: int  # classes (1 for regression; 2 unused for span)
    label_names: tuple[str, ...]  # class / tag names ((), for regression and span)
    splits: tuple[str, ...]  # e.g. ("train", "dev", "test") or GLUE MNLI's ("train", "dev_matched", ...)
    eval_splits: tuple[str, ...]  # the splits scored after training (e.g. ("dev",))

    def load(self, split: str) -> list[Any]:
        """The examples of a split; malformed rows reported (file:line) and skipped or fatal."""

    def featurize(self, examples: list[Any], tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
        """Examples → the feature arrays above (every array has the same N rows)."""

    def evaluate(self, examples: list[Any], features: dict[str, np.ndarray],
                 outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """Official metrics of this task on a labelled split."""

    def write_predictions(self, examples: list[Any], features: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], out_dir: Path, split: str) -> list[Path]:
        """Prediction files in the format users submit; returns their paths."""

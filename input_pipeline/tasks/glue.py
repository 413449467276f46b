"""GLUE tasks (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI and the AX diagnostic) as `Task`s.

Sources (``GlueTask(name, source)``):

* a local directory (or ``gs://``) laid out as the official ``download_glue_data.py`` leaves it:
  ``<dir>/CoLA/train.tsv``, ``<dir>/MNLI/dev_matched.tsv``, ``<dir>/diagnostic/diagnostic.tsv``
  (AX), ...; or a directory that holds the task's ``train.tsv``/``dev.tsv``/``test.tsv`` itself.
* ``"tfds"`` or ``""`` (TFDS ``glue/<task>``), or ``"tfds:NAME"`` (e.g. ``tfds:glue/mrpc``), read from
  ``data_dir`` without downloading; our ``dev*`` splits are TFDS's ``validation*``. Examples are
  sorted by TFDS's ``idx`` (the row number in the original file) so both sources give one order.

The TSVs are read as the originals are (tab-separated, ``csv.QUOTE_NONE``). Columns are found by
header name, as TFDS does; on the official files these are the indices of Google BERT's and Hugging
Face's processors: CoLA train/dev have no header (source, label, original label, sentence: label
column 1, sentence 3), CoLA/SST-2 test ``index, sentence``; SST-2 ``sentence, label``; MRPC
``Quality, #1 ID, #2 ID, #1 String, #2 String`` (test: ``index`` first); STS-B sentence1/sentence2 at
7/8, ``score`` last (absent in test); QQP ``id, qid1, qid2, question1, question2, is_duplicate`` (test:
``id, question1, question2``); MNLI sentence1/sentence2 at 8/9, ``gold_label`` last; QNLI ``index,
question, sentence, label``; RTE/WNLI/AX ``index, sentence1, sentence2[, label]``. Test splits carry
no labels (``label=None``; zeros in the features). A row whose column count differs from the header's,
with an unknown label, a non-numeric STS-B score or invalid UTF-8 is malformed: reported as
``file:line``, counted in ``task.skipped[split]`` and skipped with a warning (``on_error="skip"``), or
raised as `TaskDataError` (``on_error="raise"``). A header that lacks a needed column always raises.

Labels are indices into ``label_names``, which are the files' own label strings in Google's/HF's
processor order (MNLI: contradiction, entailment, neutral; TFDS's order is mapped onto it); STS-B
labels are float scores. ``ax`` is test-only and has MNLI's labels: predict it with an MNLI model,
i.e. as MNLI's split ``"ax"`` (``--config.predict_splits='("test_matched","test_mismatched","ax")'``).

Prediction files are the GLUE server's: ``index<TAB>prediction`` under that header, named
CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv, QQP.tsv, MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, RTE.tsv,
WNLI.tsv, AX.tsv for the test splits (zip them for a submission); other splits get the same format
with the split's first word as prefix (``dev_MRPC.tsv``, ``dev_MNLI-mm.tsv``, ``train_CoLA.tsv``) so
they never mix with a submission. STS-B predictions are clipped to [0, 5] with 3 decimals.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from input_pipeline.files import path_or_url, write_atomically
from input_pipeline.tasks.base import TaskDataError, feature_labels
from input_pipeline.tasks.glue_features import featurize_pairs

log = logging.getLogger(__name__)

_MNLI = ("contradiction", "entailment", "neutral")
_TFDS_MNLI = ("entailment", "neutral", "contradiction")
_BIN, _NLI = ("0", "1"), ("entailment", "not_entailment")
_COLA_COLUMNS = ("source", "label", "original_label", "sentence")  # CoLA train/dev: no header
_MAX_REPORTED = 5  # malformed rows logged one by one; the rest only counted


@dataclasses.dataclass(frozen=True)
class _Spec:
    folder: str  # directory in the GLUE download; also the submission file's stem
    columns: tuple[str, str | None, str]  # header names: text_a, text_b (None: single), label
    labels: tuple[str, ...]  # label strings as in the files, in class-index order (() regression)
    tfds: tuple[str, str | None, tuple[str, ...]]  # TFDS text_a, text_b fields, TFDS label order


_SPECS = {
    "cola": _Spec("CoLA", ("sentence", None, "label"), _BIN, ("sentence", None, _BIN)),
    "sst2": _Spec("SST-2", ("sentence", None, "label"), _BIN, ("sentence", None, _BIN)),
    "mrpc": _Spec("MRPC", ("#1 String", "#2 String", "Quality"), _BIN, ("sentence1", "sentence2", _BIN)),
    "stsb": _Spec("STS-B", ("sentence1", "sentence2", "score"), (), ("sentence1", "sentence2", ())),
    "qqp": _Spec("QQP", ("question1", "question2", "is_duplicate"), _BIN, ("question1", "question2", _BIN)),
    "mnli": _Spec("MNLI", ("sentence1", "sentence2", "gold_label"), _MNLI, ("premise", "hypothesis", _TFDS_MNLI)),
    "qnli": _Spec("QNLI", ("question", "sentence", "label"), _NLI, ("question", "sentence", _NLI)),
    "rte": _Spec("RTE", ("sentence1", "sentence2", "label"), _NLI, ("sentence1", "sentence2", _NLI)),
    "wnli": _Spec("WNLI", ("sentence1", "sentence2", "label"), _BIN, ("sentence1", "sentence2", _BIN)),
    "ax": _Spec("diagnostic", ("sentence1", "sentence2", ""), _MNLI, ("premise", "hypothesis", _TFDS_MNLI)),
}
GLUE_TASKS = tuple(_SPECS)
_MNLI_SPLITS = ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched")


@dataclasses.dataclass(frozen=True)
class GlueExample:
    index: str  # the file's index/id column (test: the submission key), else the 0-based data-row number
    text_a: str
    text_b: str | None  # None for single-sentence tasks (CoLA, SST-2)
    label: int | float | None  # class index into label_names, STS-B score, None for test splits


class GlueTask:
    """One GLUE task; see the module docstring. ``skipped[split]``: malformed rows skipped by `load`."""

    def __init__(self, name: str, source: str = "", *, data_dir: str | None = None, on_error: str = "skip"):
        key = name.lower().replace("-", "")
        if key not in _SPECS:
            raise ValueError(f"unknown GLUE task {name!r}; expected one of {', '.join(GLUE_TASKS)}")
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        self.name, self._spec, self.on_error, self.data_dir = key, _SPECS[key], on_error, data_dir
        self.kind = "regression" if key == "stsb" else "classification"
        self.label_names = self._spec.labels
        self.num_labels = len(self.label_names) or 1
        # MNLI also predicts "ax" (the diagnostic set needs an MNLI classifier, head included).
        self.splits = ("test",) if key == "ax" else (*_MNLI_SPLITS, "ax") if key == "mnli" else ("train", "dev", "test")
        self.eval_splits = () if key == "ax" else ("dev_matched", "dev_mismatched") if key == "mnli" else ("dev",)
        self.skipped: dict[str, int] = {}
        source = source.strip()
        self._tfds_name = None
        if source in ("", "tfds") or source.startswith("tfds:"):
            self._tfds_name = source[len("tfds:"):] if source.startswith("tfds:") else f"glue/{key}"
        elif not tf.io.gfile.isdir(source):
            raise FileNotFoundError(f"GLUE source {source!r} is not a directory (expected the GLUE download's "
                                    f"root holding {self._spec.folder}/, or 'tfds[:glue/{key}]')")
        self.source = source

    def __repr__(self) -> str:
        return f"GlueTask({self.name!r}, {self.source!r})"

    # ------------------------------------------------------------------ loading

    def load(self, split: str) -> list[GlueExample]:
        if split not in self.splits:
            raise ValueError(f"{self.name}: no split {split!r}; expected one of {self.splits}")
        if self.name == "mnli" and split == "ax":
            source = "tfds:glue/ax" if self._tfds_name else self.source
            return GlueTask("ax", source, data_dir=self.data_dir, on_error=self.on_error).load("test")
        return self._load_tfds(split) if self._tfds_name else self._read_tsv(self.tsv_path(split), split)

    def tsv_path(self, split: str) -> str:
        """The split's file under ``source`` (official layout first, then the directory itself)."""
        file = "diagnostic.tsv" if self.name == "ax" else f"{split}.tsv"
        names = [f"{self._spec.folder}/{file}", file] + (["AX.tsv"] if self.name == "ax" else [])
        candidates = [os.path.join(self.source, n) for n in names]
        for path in candidates:
            if tf.io.gfile.exists(path):
                return path
        raise FileNotFoundError(f"{self.name} {split}: none of {candidates} exists; expected the layout of the "
                                f"official download_glue_data.py (<dir>/{names[0]}) or a directory holding {file}")

    def _bad(self, split: str, where: str, what: str) -> None:
        if self.on_error == "raise":
            raise TaskDataError(f"{where}: {what}")
        self.skipped[split] = self.skipped.get(split, 0) + 1
        if self.skipped[split] <= _MAX_REPORTED:
            log.warning("%s: %s (skipped)", where, what)

    def _label(self, value: str, split: str, where: str, column: str):
        if self.kind == "regression":
            try:
                score = float(value)
            except ValueError:
                score = math.nan
            if not math.isfinite(score):
                return self._bad(split, where, f"{column} {value!r} is not a finite number")
            return score
        if value not in self.label_names:
            return self._bad(split, where, f"unknown label {value!r} in column {column!r} "
                                           f"(expected one of {list(self.label_names)})")
        return self.label_names.index(value)

    def _read_tsv(self, path: str, split: str) -> list[GlueExample]:
        labelled = not split.startswith("test")
        a_col, b_col, label_col = self._spec.columns
        self.skipped[split] = 0
        examples = []
        with tf.io.gfile.GFile(path, "rb") as f:
            reader = csv.reader((raw.decode("utf-8", "surrogateescape") for raw in f),
                                delimiter="\t", quoting=csv.QUOTE_NONE)
            header = _COLA_COLUMNS if self.name == "cola" and labelled else next(reader, None)
            if header is None:
                raise TaskDataError(f"{path}: empty file; expected the official GLUE {self._spec.folder} "
                                    f"{split} file with its header line")
            needed = [a_col] + ([b_col] if b_col else []) + ([label_col] if labelled else [])
            missing = [c for c in needed if c not in header]
            if missing:
                raise TaskDataError(f"{path}:1: header {header} lacks column(s) {missing}; expected the "
                                    f"official GLUE {self._spec.folder} {split} file")
            col = {c: header.index(c) for c in needed}
            idx_col = next((header.index(c) for c in ("index", "id") if c in header), None)
            n = -1
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as e:
                    n += 1
                    self._bad(split, f"{path}:{reader.line_num}", f"unparseable row ({e})")
                    continue
                if not row:  # a blank line
                    continue
                n += 1
                where = f"{path}:{reader.line_num}"
                if len(row) != len(header):
                    self._bad(split, where, f"{len(row)} columns, expected {len(header)} ({', '.join(header)})")
                    continue
                try:
                    "".join(row).encode("utf-8")
                except UnicodeEncodeError:
                    self._bad(split, where, "not valid UTF-8")
                    continue
                label = self._label(row[col[label_col]], split, where, label_col) if labelled else None
                if labelled and label is None:
                    continue
                examples.append(GlueExample(row[idx_col] if idx_col is not None else str(n), row[col[a_col]],
                                            row[col[b_col]] if b_col else None, label))
        if self.skipped[split]:
            log.warning("%s: skipped %d malformed row(s) of %d", path, self.skipped[split], n + 1)
        return examples

    def _load_tfds(self, split: str) -> list[GlueExample]:
        import tensorflow_datasets as tfds  # slow to import; only for TFDS sources

        tfds_split = split.replace("dev", "validation")
        where = f"tfds:{self._tfds_name}:{tfds_split}"
        try:
            ds = tfds.load(self._tfds_name, split=tfds_split, data_dir=self.data_dir, download=False,
                           shuffle_files=False)
        except Exception as e:  # DatasetNotFoundError, unknown split or config, ...
            raise FileNotFoundError(f"{where}: cannot load ({e}); prepare it with `tfds build {self._tfds_name}` "
                                    f"(data_dir={self.data_dir!r}) or pass a local GLUE directory as the source "
                                    f"(--config.task.source=DIR)") from e
        a_key, b_key, tfds_labels = self._spec.tfds
        labelled = not split.startswith("test")
        self.skipped[split] = 0
        rows = []
        for batch in ds.batch(4096).as_numpy_iterator():
            for i, idx in enumerate(batch["idx"]):
                a = batch[a_key][i].decode("utf-8")
                b = batch[b_key][i].decode("utf-8") if b_key else None
                label, raw = None, batch["label"][i]
                if labelled and self.kind == "regression":
                    label = self._label(str(raw), split, f"{where}#{idx}", "label")
                elif labelled:
                    ok = 0 <= raw < len(tfds_labels)
                    label = self._label(tfds_labels[raw] if ok else str(raw), split, f"{where}#{idx}", "label")
                if not labelled or label is not None:
                    rows.append((int(idx), GlueExample(str(idx), a, b, label)))
        if self.skipped[split]:
            log.warning("%s: skipped %d malformed example(s)", where, self.skipped[split])
        return [ex for _, ex in sorted(rows, key=lambda r: r[0])]

    # ------------------------------------------------------------------ features

    def featurize(self, examples: list[GlueExample], tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
        """``[CLS] a [SEP] (b [SEP])``, truncated as Google BERT does (`glue_features.featurize_pairs`)."""
        return featurize_pairs(examples, tokenizer, max_seq_length, regression=self.kind == "regression")

    # ------------------------------------------------------------------ outputs

    def predictions(self, features: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> np.ndarray:
        """[N] class indices (argmax of ``logits``) or regression scores (``predictions``)."""
        n = len(features["example_index"])
        if self.kind == "regression":
            pred = np.asarray(outputs["predictions"], np.float64)
            pred = pred.reshape(n) if pred.size == n else pred
            expected = f"[{n}]"
        else:
            logits = np.asarray(outputs["logits"])
            pred = logits.argmax(-1) if logits.shape == (n, self.num_labels) else None
            expected = f"logits [{n}, {self.num_labels}]"
        if pred is None or pred.shape != (n,):
            shapes = {k: np.shape(v) for k, v in outputs.items()}
            raise ValueError(f"{self.name}: model outputs {shapes} do not match {expected} for {n} feature rows")
        return pred

    def evaluate(self, examples, features, outputs) -> dict[str, float]:
        from input_pipeline.tasks.glue_metrics import glue_metrics

        labels = feature_labels(self.name, examples, features)
        dtype = np.float64 if self.kind == "regression" else np.int64
        return glue_metrics(self.name, np.asarray(labels, dtype), self.predictions(features, outputs))

    def prediction_file(self, split: str) -> str:
        """The GLUE server's file name for a test split; ``<first word of split>_<name>`` otherwise."""
        if self.name == "ax" or split == "ax":
            return "AX.tsv"
        stem = self._spec.folder
        if self.name == "mnli" and split != "train":
            stem += "-mm" if split.endswith("mismatched") else "-m"
        return f"{stem}.tsv" if split.startswith("test") else f"{split.split('_')[0]}_{stem}.tsv"

    def write_predictions(self, examples, features, outputs, out_dir: Path, split: str) -> list[Path]:
        pred = self.predictions(features, outputs)
        if self.kind == "regression":
            values = [f"{v:.3f}" for v in np.clip(pred, 0.0, 5.0)]
        else:
            values = [self.label_names[int(p)] for p in pred]
        lines = ["index\tprediction"] + [f"{examples[i].index}\t{v}" for i, v in zip(features["example_index"],
                                                                                    values, strict=True)]
        path = path_or_url(out_dir) / self.prediction_file(split)
        return [write_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))]  # never a half-written file

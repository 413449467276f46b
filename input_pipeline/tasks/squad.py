"""SQuAD v1.1 and v2.0 as a span task (the `Task` contract of base.py), following Google BERT's
run_squad.py: read_squad_examples here, convert_examples_to_features in squad_features.py and
write_predictions (n-best search, get_final_text, null threshold) in squad_postprocess.py; the
official metrics are input_pipeline/tasks/squad_metrics.py.

Sources (``SquadTask(version, source, data_dir=...)``):

* ``source=""`` and ``data_dir=DIR``, or ``source=DIR``: the official files ``train-v1.1.json``,
  ``dev-v1.1.json`` (``-v2.0`` for 2.0) in that directory;
* explicit files: ``source={"train": path, "dev": path}`` or the string ``"train=PATH,dev=PATH"``;
* ``source="tfds"``: TFDS ``squad/v1.1`` / ``squad/v2.0`` (splits train / validation;
  ``data_dir`` is TFDS's data directory); ``"tfds:NAME"`` names another builder with SQuAD's features.

Reading: the context is split on whitespace (space, tab, CR, LF, U+202F, as run_squad.py) into
``doc_tokens``; the answer's character offset gives its first/last word. For the ``train`` split an
answer whose whitespace-normalised text is not found in those words, an offset outside the context,
an empty answer, or an answerable question without answers is a malformed example: with
``on_error="skip"`` it is left out, counted in ``task.skipped[split]`` and logged with the file and
question id; with ``on_error="raise"`` it is a `TaskDataError` naming them. v2.0 ``is_impossible``
questions have no answer (start/end → [CLS]). Other splits keep every question (the official
scores count all of them); their answer positions are found the same way where possible, else -1.

Deviations from run_squad.py: a training question with several answers uses the first (run_squad
raises); answer positions are also computed for non-training splits (features then carry gold
start/end positions for an evaluation loss); a question whose context is only whitespace is
malformed in every split (run_squad would make no feature for it and fail in post-processing).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from input_pipeline.tasks.base import TaskDataError
from input_pipeline.tasks.squad_features import convert_examples_to_features
from input_pipeline.tasks.squad_postprocess import compute_predictions, write_prediction_files

log = logging.getLogger(__name__)

VERSIONS = ("1.1", "2.0")
_TFDS_SPLITS = {"train": "train", "dev": "validation"}
_WHITESPACE = frozenset(" \t\r\n\u202f")  # run_squad.py's is_whitespace
POSTPROCESS_KEYS = ("input_ids", "example_index", "token_to_orig", "token_is_max_context")


@dataclasses.dataclass(frozen=True, eq=False)
class SquadExample:
    """One question. ``doc_tokens`` is shared by the questions of a paragraph."""

    qas_id: str
    question_text: str
    doc_tokens: list[str]
    orig_answer_text: str = ""  # the first answer ("" when none)
    start_position: int = -1  # word index of its first word; -1: impossible or not located
    end_position: int = -1
    is_impossible: bool = False
    answers: tuple[str, ...] = ()  # every gold answer text (evaluation)


def split_context(text: str) -> tuple[list[str], list[int]]:
    """run_squad's whitespace split: (words, char → index of the word holding it / the word before)."""
    doc_tokens: list[str] = []
    char_to_word: list[int] = []
    prev_ws = True
    for c in text:
        if c in _WHITESPACE:
            prev_ws = True
        else:
            if prev_ws:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_ws = False
        char_to_word.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word


def _parse_source(source, data_dir, version) -> dict[str, Path] | None:
    """Split → file (None for TFDS)."""
    if isinstance(source, Mapping):
        return {k: Path(v) for k, v in source.items()}
    if source == "tfds" or source.startswith("tfds:"):
        return None
    if "=" in source:
        files = {}
        for part in source.split(","):
            split, sep, path = part.partition("=")
            if not sep or not split.strip() or not path.strip():
                raise ValueError(f"SQuAD source {source!r}: expected 'train=PATH,dev=PATH', got {part!r}")
            files[split.strip()] = Path(path.strip())
        return files
    directory = source or data_dir
    if not directory:
        raise ValueError("SQuAD needs a source: a directory with the official JSON files (source= or data_dir=), "
                         "'train=PATH,dev=PATH', or 'tfds'")
    return {split: Path(directory) / f"{split}-v{version}.json" for split in ("train", "dev")}


class SquadTask:
    """SQuAD v1.1 / v2.0 (kind ``span``); see the module docstring.

    `featurize` remembers what post-processing needs of the tokenizer (its vocabulary, whether it
    lower-cases), so `evaluate` / `write_predictions` / `predict` must follow a `featurize` call on
    the same task with the same tokenizer.
    """

    kind = "span"
    num_labels = 2
    label_names: tuple[str, ...] = ()

    def __init__(self, version: str = "1.1", source: str | Mapping[str, str] = "", *, data_dir: str | None = None,
                 doc_stride: int = 128, max_query_length: int = 64, max_answer_length: int = 30,
                 n_best_size: int = 20, null_score_diff_threshold: float = 0.0, on_error: str = "skip"):
        if version not in VERSIONS:
            raise ValueError(f"SQuAD version must be one of {VERSIONS}, got {version!r}")
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        for name, value in (("doc_stride", doc_stride), ("max_query_length", max_query_length),
                            ("max_answer_length", max_answer_length), ("n_best_size", n_best_size)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.version, self.name = version, f"squad{version}"
        self.data_dir = data_dir
        self.files = _parse_source(source, data_dir, version)
        self.tfds_name = None if self.files is not None else (
            source.partition(":")[2] if source.startswith("tfds:") else f"squad/v{version}")
        self.splits = ("train", "dev") if self.files is None else tuple(self.files)
        self.eval_splits = ("dev",) if "dev" in self.splits else ()
        self.doc_stride, self.max_query_length = doc_stride, max_query_length
        self.max_answer_length, self.n_best_size = max_answer_length, n_best_size
        self.null_score_diff_threshold = float(null_score_diff_threshold)
        self.on_error = on_error
        self.skipped: dict[str, int] = {}
        self._tokens: dict[str, Any] | None = None  # set by featurize: what post-processing needs

    def __repr__(self) -> str:
        where = f"tfds:{self.tfds_name}" if self.files is None else {k: os.fspath(v) for k, v in self.files.items()}
        return f"SquadTask(version={self.version!r}, source={where!r})"

    # -- reading ---------------------------------------------------------------------------------
    def load(self, split: str) -> list[SquadExample]:
        if split not in self.splits:
            raise ValueError(f"{self.name}: unknown split {split!r} (have {self.splits})")
        records = self._tfds_records(split) if self.files is None else self._json_records(self.files[split])
        examples, bad = [], []
        contexts: dict[str, tuple[list[str], list[int]]] = {}
        for where, qa, context in records:
            try:
                examples.append(self._example(where, qa, context, contexts, split == "train"))
            except TaskDataError as e:
                if self.on_error == "raise":
                    raise
                bad.append(str(e))
        self.skipped[split] = len(bad)
        if bad:
            log.warning("%s %s: skipped %d malformed questions, e.g. %s", self.name, split, len(bad), bad[0])
        if not examples:
            raise TaskDataError(f"{self.name} {split}: no usable questions" + (f" (e.g. {bad[0]})" if bad else ""))
        return examples

    def _json_records(self, path: Path) -> Iterator[tuple[str, dict, str]]:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: SQuAD file not found (expected the official "
                                    f"train-v{self.version}.json / dev-v{self.version}.json format)")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TaskDataError(f"{path}: not a SQuAD JSON file ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise TaskDataError(f"{path}: expected a JSON object with a 'data' list of articles")
        for a, article in enumerate(data["data"]):
            for p, paragraph in enumerate(_field(article, "paragraphs", list, f"{path}: data[{a}]")):
                where = f"{path}: data[{a}].paragraphs[{p}]"
                context = _field(paragraph, "context", str, where)
                for qa in _field(paragraph, "qas", list, where):
                    yield f"{path}: question {qa.get('id') if isinstance(qa, dict) else qa!r}", qa, context

    def _tfds_records(self, split: str) -> Iterator[tuple[str, dict, str]]:
        import tensorflow_datasets as tfds

        name = self.tfds_name
        try:
            ds = tfds.load(name, split=_TFDS_SPLITS[split], data_dir=self.data_dir, download=False)
        except Exception as e:  # DatasetNotFoundError, unknown split or config, ...
            raise FileNotFoundError(f"tfds:{name} {split}: cannot load ({e}); prepare it with `tfds build {name}` "
                                    f"(data_dir={self.data_dir!r}) or pass a directory of the official JSON files "
                                    f"(--config.task.source=DIR)") from e
        for ex in tfds.as_numpy(ds):
            qid = ex["id"].decode()
            answers = [{"text": t.decode(), "answer_start": int(s)}
                       for t, s in zip(ex["answers"]["text"], ex["answers"]["answer_start"], strict=True)]
            qa = {"id": qid, "question": ex["question"].decode(), "answers": answers,
                  "is_impossible": bool(ex.get("is_impossible", False))}
            yield f"tfds {name} {split}: question {qid!r}", qa, ex["context"].decode()

    def _example(self, where: str, qa: Any, context: str, contexts: dict, is_training: bool) -> SquadExample:
        if not isinstance(qa, dict):
            raise TaskDataError(f"{where}: expected a JSON object")
        qid = _field(qa, "id", str, where)
        question = _field(qa, "question", str, where)
        answers = _field(qa, "answers", list, where)
        for i, ans in enumerate(answers):
            _field(ans, "text", str, f"{where}: answers[{i}]")
            _field(ans, "answer_start", int, f"{where}: answers[{i}]")
        impossible = self.version == "2.0" and bool(qa.get("is_impossible", False))
        if context not in contexts:
            contexts[context] = split_context(context)
        doc_tokens, char_to_word = contexts[context]
        if not doc_tokens:
            raise TaskDataError(f"{where}: the context is empty")
        texts = tuple(a["text"] for a in answers)
        if impossible or not answers:
            if is_training and not impossible:
                raise TaskDataError(f"{where}: no answers (a training question needs one"
                                    f"{'' if self.version == '1.1' else ' unless is_impossible'})")
            return SquadExample(qid, question, doc_tokens, is_impossible=impossible, answers=texts)
        text, offset = answers[0]["text"], answers[0]["answer_start"]
        start = end = -1
        if not text.strip():
            problem = "an empty answer text"
        elif not 0 <= offset or offset + len(text) > len(context):
            problem = f"answer_start {offset} + len {len(text)} outside the context ({len(context)} chars)"
        else:
            start, end = char_to_word[offset], char_to_word[offset + len(text) - 1]
            actual = " ".join(doc_tokens[max(start, 0):end + 1])
            problem = None if actual.find(" ".join(text.split())) != -1 else (
                f"answer {text!r} not found at answer_start {offset} (context there: {actual!r})")
            start = max(start, 0)
        if problem is not None:
            if is_training:
                raise TaskDataError(f"{where}: {problem}")
            start = end = -1
        return SquadExample(qid, question, doc_tokens, text, start, end, False, texts)

    # -- features and predictions ----------------------------------------------------------------
    def featurize(self, examples: list[SquadExample], tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
        features, self._tokens = convert_examples_to_features(
            examples, tokenizer, max_seq_length, doc_stride=self.doc_stride, max_query_length=self.max_query_length)
        return features

    def predict(self, examples, features, outputs) -> tuple[dict, dict, dict | None]:
        """(predictions id → text, n-best id → list of dicts, null odds id → float (v2.0; else None))."""
        if self._tokens is None:
            raise RuntimeError(f"{self.name}: call featurize() before post-processing (it needs the tokenizer's "
                               "vocabulary)")
        for what, have, need in (("model outputs", outputs, ("start_logits", "end_logits")),
                                 ("features", features, POSTPROCESS_KEYS)):
            missing = [k for k in need if k not in have]
            if missing:
                raise KeyError(f"{self.name}: {what} lack {missing} (have {sorted(have)})")
        return compute_predictions(
            examples, features, outputs["start_logits"], outputs["end_logits"], **self._tokens,
            n_best_size=self.n_best_size, max_answer_length=self.max_answer_length,
            version_2_with_negative=self.version == "2.0", null_score_diff_threshold=self.null_score_diff_threshold)

    def evaluate(self, examples, features, outputs) -> dict[str, float]:
        from input_pipeline.tasks import squad_metrics

        preds, _, null_odds = self.predict(examples, features, outputs)
        gold = {ex.qas_id: list(ex.answers) for ex in examples}
        if self.version == "1.1":
            return squad_metrics.evaluate_v1(gold, preds)
        # exact/f1 score predictions.json as written: the script's na_prob_thresh (1.0, meant for
        # probabilities) would turn answers with null odds in (1.0, threshold] into "no answer".
        out = squad_metrics.evaluate_v2(gold, preds, null_odds, na_prob_thresh=self.null_score_diff_threshold)
        return {k: float(v) for k, v in out.items()}

    def write_predictions(self, examples, features, outputs, out_dir: Path, split: str) -> list[Path]:
        preds, nbest, null_odds = self.predict(examples, features, outputs)
        return write_prediction_files(out_dir, split, preds, nbest, null_odds)


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    """obj[key], checked to be a ``kind``; a `TaskDataError` naming ``where`` and the key otherwise."""
    if not isinstance(obj, dict) or key not in obj:
        raise TaskDataError(f"{where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TaskDataError(f"{where}: {key!r} should be a {kind.__name__}, got {type(value).__name__}")
    return value

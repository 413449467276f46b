"""SQuAD's official evaluation: evaluate-v1.1.py and evaluate-v2.0.py, as functions.

Same normalisation (lower-case, drop ASCII punctuation, drop the words a/an/the, collapse
whitespace), exact match and bag-of-tokens F1 taking the best gold answer, and percentages 0-100 as
the official scripts print them:

* `evaluate_v1` → ``{"exact_match", "f1"}``; a question without a prediction scores 0 (the script
  prints "Unanswered question" and counts it).
* `evaluate_v2` → ``exact, f1, total`` over all questions, ``HasAns_*`` / ``NoAns_*`` for the
  answerable / unanswerable ones, and with ``na_probs`` (run_squad's null_odds.json) the
  ``best_exact``/``best_f1`` reachable by one threshold on ``na_probs`` and those thresholds
  (``find_best_thresh``). As in the script, when ``na_probs`` is given a question whose
  ``na_probs`` exceeds ``na_prob_thresh`` (default 1.0) counts as answered "no answer" in
  ``exact``/``f1``. Gold answers that normalise to "" are dropped; a question with none left has
  gold "" (answered correctly only by an empty prediction), and an empty prediction against an
  empty gold has F1 1 (v1.1 gives 0 there).

Deviation: the v2.0 script prints "Missing prediction" and then fails with a KeyError; here a
missing prediction is a ValueError naming the question ids.

``python -m input_pipeline.tasks.squad_metrics DATA.json PREDICTIONS.json [--na-prob-file NULL_ODDS.json]``
prints the scores as the official scripts do (v2.0 if the data has ``is_impossible`` questions or
``--version 2.0``).
"""

from __future__ import annotations

import collections
import json
import re
import string
from collections.abc import Mapping, Sequence

from input_pipeline import command_line as cli

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, remove punctuation, articles (a, an, the) and extra whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str, *, empty_match: bool = False) -> float:
    """Token F1 of the normalised strings. ``empty_match=True`` is v2.0's rule: if either side has
    no tokens, 1.0 when both have none and 0.0 otherwise (v1.1 gives 0.0 whenever nothing is shared)."""
    pred, gold = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    if empty_match and (not pred or not gold):
        return float(pred == gold)
    num_same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if num_same == 0:
        return 0.0
    precision, recall = num_same / len(pred), num_same / len(gold)
    return 2 * precision * recall / (precision + recall)


def evaluate_v1(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: ``gold`` maps question id → its answer texts; percentages."""
    if not gold:
        raise ValueError("no gold questions to evaluate")
    em = f1 = 0.0
    for qid, answers in gold.items():
        if qid not in predictions:
            continue  # the official script scores an unanswered question 0
        if not answers:
            raise ValueError(f"question {qid!r} has no gold answers (SQuAD v1.1 needs at least one)")
        pred = predictions[qid]
        em += max(exact_match_score(pred, a) for a in answers)
        f1 += max(f1_score(pred, a) for a in answers)
    return {"exact_match": 100.0 * em / len(gold), "f1": 100.0 * f1 / len(gold)}


def _find_best_thresh(preds, scores, na_probs, has_ans) -> tuple[float, float]:
    """The official find_best_thresh: best total score over thresholds on na_probs (percent) and it."""
    cur = best = sum(1 for v in has_ans.values() if not v)
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            cur += scores[qid]
        else:
            cur += -1 if preds[qid] else 0
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), float(best_thresh)


def evaluate_v2(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """evaluate-v2.0.py: ``gold`` maps question id → answer texts ([] = unanswerable)."""
    if not gold:
        raise ValueError("no gold questions to evaluate")
    missing = [qid for qid in gold if qid not in predictions]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} of {len(gold)} questions (e.g. {missing[:3]})")
    has_ans = {qid: bool(answers) for qid, answers in gold.items()}
    exact_raw, f1_raw = {}, {}
    for qid, answers in gold.items():
        golds = [a for a in answers if normalize_answer(a)] or [""]
        pred = predictions[qid]
        exact_raw[qid] = max(exact_match_score(pred, a) for a in golds)
        f1_raw[qid] = max(f1_score(pred, a, empty_match=True) for a in golds)
    probs = {qid: 0.0 for qid in predictions} if na_probs is None else na_probs
    lacking = [qid for qid in gold if qid not in probs]
    if lacking:
        raise ValueError(f"no null odds for {len(lacking)} questions (e.g. {lacking[:3]})")

    def thresholded(raw):
        return {qid: float(not has_ans[qid]) if probs[qid] > na_prob_thresh else s for qid, s in raw.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    out: dict[str, float] = {}

    def add(prefix, qids):
        out[f"{prefix}exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
        out[f"{prefix}f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
        out[f"{prefix}total"] = len(qids)

    add("", list(gold))
    for prefix, want in (("HasAns_", True), ("NoAns_", False)):
        qids = [q for q, v in has_ans.items() if v == want]
        if qids:
            add(prefix, qids)
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _find_best_thresh(predictions, exact_raw, probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = _find_best_thresh(predictions, f1_raw, probs, has_ans)
    return out


def gold_from_dataset(data: Mapping) -> dict[str, list[str]]:
    """Question id → answer texts from an official-format dataset (the parsed JSON file)."""
    return {qa["id"]: [a["text"] for a in qa["answers"]]
            for article in data["data"] for p in article["paragraphs"] for qa in p["qas"]}


def _read_json(path: str, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON {what} ({e})") from e


def main(argv: Sequence[str] | None = None) -> None:
    parser = cli.ArgumentParser(prog="python -m input_pipeline.tasks.squad_metrics",
                                description=__doc__.splitlines()[0])
    parser.add_argument("data_file", help="the official-format dataset (dev-v1.1.json or dev-v2.0.json)")
    parser.add_argument("pred_file", help="predictions: a JSON object of question id -> answer text")
    parser.add_argument("--na-prob-file", default=None, help="SQuAD 2.0: question id -> no-answer probability")
    parser.add_argument("--na-prob-thresh", type=float, default=1.0,
                        help="SQuAD 2.0: predict no answer above this probability")
    parser.add_argument("--version", choices=("1.1", "2.0"), default=None,
                        help="default: 2.0 if any question is impossible, else 1.1")
    args = parser.parse_args(argv)
    data = _read_json(args.data_file, "SQuAD dataset")
    preds = _read_json(args.pred_file, "predictions file")
    try:
        questions = [qa for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{args.data_file}: not a SQuAD dataset (expected data[].paragraphs[].qas[]; "
                         f"{type(e).__name__}: {e})") from e
    if not isinstance(preds, dict):
        raise ValueError(f"{args.pred_file}: expected a JSON object of question id -> answer text")
    version = args.version or ("2.0" if any(qa.get("is_impossible") for qa in questions) else "1.1")
    if version == "1.1":
        print(json.dumps(evaluate_v1(gold_from_dataset(data), preds)))
        return
    na_probs = _read_json(args.na_prob_file, "no-answer probability file") if args.na_prob_file else None
    print(json.dumps(evaluate_v2(gold_from_dataset(data), preds, na_probs, args.na_prob_thresh), indent=2))


if __name__ == "__main__":
    cli.run(main)

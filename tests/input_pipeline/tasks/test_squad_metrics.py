"""The official SQuAD metrics (input_pipeline/tasks/squad_metrics.py): normalisation, F1/EM, v2.0
thresholds by hand, and its command line on our prediction files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from input_pipeline.tasks import squad_metrics as sm


def test_files_match_official_cli(squad, tmp_path, capsys, squad_json):
    task, data = squad
    examples, f = data["dev"]
    rng = np.random.default_rng(0)
    outputs = {k: rng.normal(size=f["input_ids"].shape).astype(np.float32) for k in ("start_logits", "end_logits")}
    paths = task.write_predictions(examples, f, outputs, tmp_path, "dev")
    gold = tmp_path / "gold.json"
    gold.write_text(json.dumps(squad_json(task.version)))
    sm.main([str(gold), str(paths[0])] + (["--na-prob-file", str(paths[2])] if task.version == "2.0" else []))
    printed = json.loads(capsys.readouterr().out)
    assert printed == pytest.approx(task.evaluate(examples, f, outputs))


def test_normalize_and_scores():
    assert sm.normalize_answer("The  Cat!") == "cat"
    assert sm.normalize_answer("an Apple, a pear and THE end.") == "apple pear and end"
    assert sm.normalize_answer("theater") == "theater"
    assert sm.f1_score("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)  # P 1, R 1/2
    assert sm.f1_score("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)  # counts clip: 2 shared of 3
    assert sm.f1_score("", "the") == 0.0 and sm.f1_score("", "the", empty_match=True) == 1.0
    assert sm.exact_match_score("The Cat.", "cat") == 1.0
    v1 = sm.evaluate_v1({"a": ["the mat", "a red mat"], "b": ["1888"], "c": ["x"]},
                        {"a": "red mat", "b": "in 1888"})  # c unanswered → 0
    assert v1["exact_match"] == pytest.approx(100 / 3)
    assert v1["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)


def test_evaluate_v2_best_threshold():
    gold = {"a": ["cat"], "b": ["dog house"], "c": [], "d": []}
    preds = {"a": "cat", "b": "house", "c": "", "d": "bird"}
    odds = {"a": -1.0, "b": 0.5, "c": 2.0, "d": 0.2}
    out = sm.evaluate_v2(gold, preds)
    assert out["exact"] == 50.0 and out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 4)
    assert out["HasAns_exact"] == 50.0 and out["NoAns_exact"] == 50.0 and out["total"] == 4
    out = sm.evaluate_v2(gold, preds, odds)  # odds > 1.0 count as "no answer": only c, already ""
    assert out["exact"] == 50.0
    # thresholds by hand, sorted odds a -1.0, d 0.2, b 0.5, c 2.0; start = 2 (no-answer questions)
    # exact: +1 (a) → 3 best at -1.0; -1 (d, "bird") → 2; +0 (b) → 2; +0 (c) → 2
    assert out["best_exact"] == 75.0 and out["best_exact_thresh"] == -1.0
    # f1: 3 at -1.0; 2 at 0.2; 2 + 2/3 at 0.5: best stays 3 at -1.0
    assert out["best_f1"] == 75.0 and out["best_f1_thresh"] == -1.0
    out = sm.evaluate_v2(gold, preds, {**odds, "d": 1.5})  # d's odds > na_prob_thresh 1.0: "bird" → no answer
    assert out["exact"] == 75.0 and out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 1) / 4)
    # f1: a +1 → 3 at -1.0; b +2/3 → 3 2/3 at 0.5 (best); d -1; c 0.  exact: 3 at -1.0, b adds 0
    assert out["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 4) and out["best_f1_thresh"] == 0.5
    assert out["best_exact"] == 75.0 and out["best_exact_thresh"] == -1.0
    with pytest.raises(ValueError, match="no prediction for 1"):
        sm.evaluate_v2(gold, {"a": "cat", "b": "", "c": ""})

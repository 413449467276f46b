"""GLUE metrics and the summary over seeds (input_pipeline/tasks/glue_metrics.py), computed by hand."""

import math

import pytest

from input_pipeline.tasks.glue_metrics import glue_metrics, summarize_seeds


def test_glue_metrics_by_hand():
    labels, preds = [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 1]  # TP 3, FN 1, TN 1, FP 1
    assert glue_metrics("cola", labels, preds) == {"matthews_corr": pytest.approx(0.25), "score": pytest.approx(0.25)}
    m = glue_metrics("mrpc", labels, preds)  # precision = recall = 3/4
    assert m == pytest.approx({"f1": 0.75, "accuracy": 4 / 6, "score": (0.75 + 4 / 6) / 2})
    assert glue_metrics("qqp", labels, preds) == m
    assert glue_metrics("rte", labels, preds) == pytest.approx({"accuracy": 4 / 6, "score": 4 / 6})
    assert glue_metrics("mnli", [0, 1, 2, 2], [0, 1, 1, 2]) == {"accuracy": 0.75, "score": 0.75}
    r = 9 / math.sqrt(84)  # labels 1,2,3 vs 1,2,4: cov 3, variances 2 and 42/9
    assert glue_metrics("stsb", [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]) == pytest.approx(
        {"pearson": r, "spearman": 1.0, "score": (r + 1) / 2})
    assert glue_metrics("cola", [0, 1, 1], [1, 1, 1])["matthews_corr"] == 0.0  # constant prediction
    assert glue_metrics("mrpc", [1, 1], [0, 0])["f1"] == 0.0
    assert math.isnan(glue_metrics("stsb", [1.0, 2.0], [3.0, 3.0])["pearson"])
    with pytest.raises(ValueError, match="unknown GLUE task"):
        glue_metrics("squad", [1], [1])
    with pytest.raises(ValueError, match="equal-length"):
        glue_metrics("rte", [1, 0], [1])
    with pytest.raises(ValueError, match="class indices"):
        glue_metrics("rte", [1.0, 0.0], [0.5, 0.2])


def test_summarize_seeds():
    assert summarize_seeds([0.5, 0.9, 0.7, float("nan")]) == pytest.approx(
        {"median": 0.7, "mean": 0.7, "min": 0.5, "max": 0.9, "n": 3, "n_nan": 1})
    assert summarize_seeds([1, 2, 3, 4])["median"] == 2.5
    with pytest.raises(ValueError, match="no values"):
        summarize_seeds([])

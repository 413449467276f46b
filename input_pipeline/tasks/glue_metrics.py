"""GLUE metrics (scikit-learn / scipy) and a multi-seed summary.

`glue_metrics(task, labels, predictions)` gives the metrics the GLUE paper and leaderboard report
for one task on one labelled split, plus ``"score"``, the task's headline number on the leaderboard:

| task | metrics | score |
|---|---|---|
| cola | matthews_corr | matthews_corr |
| sst2, qnli, rte, wnli | accuracy | accuracy |
| mrpc, qqp | f1 (of the positive class 1), accuracy | (f1 + accuracy) / 2 |
| stsb | pearson, spearman | (pearson + spearman) / 2 |
| mnli | accuracy (of the split given: call once for matched, once for mismatched) | accuracy |
| ax | matthews_corr (3-class R3, as the leaderboard's diagnostic) | matthews_corr |

Values are fractions (0.85), not the leaderboard's percentages (85.0). Classification labels and
predictions are class indices (the task's label order; class 1 is the positive class of MRPC/QQP);
STS-B takes float scores. Degenerate inputs follow the libraries: MCC of a constant prediction is 0,
F1 with no predicted positive is 0, Pearson/Spearman of a constant vector is NaN.
"""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np

GLUE_METRIC_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax")


def accuracy(labels, predictions) -> float:
    return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1_positive(labels, predictions) -> float:
    """F1 of class 1 (0 when nothing is predicted or labelled positive)."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0))


def matthews_corr(labels, predictions) -> float:
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, predictions))


def pearson_spearman(labels, predictions) -> tuple[float, float]:
    from scipy import stats

    with warnings.catch_warnings():  # a constant input gives NaN, which is the answer
        warnings.simplefilter("ignore")
        return (float(stats.pearsonr(predictions, labels)[0]),
                float(stats.spearmanr(predictions, labels)[0]))


def glue_metrics(task_name: str, labels, predictions) -> dict[str, float]:
    """The metrics of ``task_name`` (see the module table) with its headline ``"score"``."""
    task = task_name.lower()
    if task not in GLUE_METRIC_TASKS:
        raise ValueError(f"unknown GLUE task {task_name!r}; expected one of {', '.join(GLUE_METRIC_TASKS)}")
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.ndim != 1 or labels.shape != predictions.shape or labels.size == 0:
        raise ValueError(f"{task}: labels and predictions must be equal-length non-empty vectors, got "
                         f"shapes {labels.shape} and {predictions.shape}")
    if task == "stsb":
        if not (np.all(np.isfinite(labels)) and np.all(np.isfinite(predictions))):
            raise ValueError("stsb: labels and predictions must be finite numbers")
        pearson, spearman = pearson_spearman(labels.astype(np.float64), predictions.astype(np.float64))
        return {"pearson": pearson, "spearman": spearman, "score": (pearson + spearman) / 2}
    if labels.dtype.kind not in "iub" or predictions.dtype.kind not in "iub":
        raise ValueError(f"{task}: labels and predictions must be class indices (integers), got "
                         f"{labels.dtype} and {predictions.dtype}")
    if task in ("cola", "ax"):
        mcc = matthews_corr(labels, predictions)
        return {"matthews_corr": mcc, "score": mcc}
    acc = accuracy(labels, predictions)
    if task in ("mrpc", "qqp"):
        f1 = f1_positive(labels, predictions)
        return {"f1": f1, "accuracy": acc, "score": (f1 + acc) / 2}
    return {"accuracy": acc, "score": acc}


def summarize_seeds(values: list[float]) -> dict[str, float]:
    """Median (the usual report for noisy small tasks), mean, min, max and count over seeds.

    A NaN (a diverged seed, or STS-B correlation of a constant prediction) is left out of the
    statistics and counted in ``"n_nan"``; ``"n"`` counts the values used (all NaN: NaN stats).
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("summarize_seeds: no values")
    used = [v for v in values if not math.isnan(v)]
    if not used:
        return {"median": math.nan, "mean": math.nan, "min": math.nan, "max": math.nan, "n": 0,
                "n_nan": len(values)}
    return {"median": statistics.median(used), "mean": statistics.fmean(used), "min": min(used),
            "max": max(used), "n": len(used), "n_nan": len(values) - len(used)}

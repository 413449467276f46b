"""Fine-tuning evaluation: model outputs over a split (padded rows, cut lengths and the by-length
order undone), the task's metrics, prediction files."""

from __future__ import annotations

import json
import logging

import jax
import numpy as np

from bert_jax.finetuning import lengths
from bert_jax.training import sharding as sh

log = logging.getLogger(__name__)

MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")
LABEL_KEYS = ("label", "label_ids", "label_mask", "start_positions", "end_positions")
PER_TOKEN = ("input_ids", "input_mask", "segment_ids", "label_ids", "label_mask")


def cut_rows(features: dict, idx: np.ndarray, length_multiple: int, max_len: int) -> dict:
    """Rows ``idx`` of the features, cut to the longest row's length (rounded up)."""
    batch = {k: v[idx] for k, v in features.items()}
    longest = int(batch["input_mask"].sum(1).max()) if len(idx) else 1
    length = min(max_len, max(length_multiple, -(-longest // length_multiple) * length_multiple))
    return {k: v[:, :length] if k in PER_TOKEN else v for k, v in batch.items()}


def predict(eval_fn, params, features: dict, kind: str, batch_size: int, length_multiple: int,
            mesh, rules, *, by_length: bool = False, unpad_multiple: int = 0) -> tuple[dict, dict]:
    """Outputs for every row (feature order, padded back to the full length) and the loss sums.
    ``by_length``: batches of rows longest first; ``unpad_multiple``: blocks on the real tokens only
    (`bert_jax.finetuning.lengths`); the outputs are the same either way."""
    n, max_len = features["input_ids"].shape
    keep = [k for k in features if k in MODEL_INPUTS or k in LABEL_KEYS]
    order = lengths.eval_order(features, by_length)
    shards = sh.batch_shards(mesh, rules)
    outputs: dict[str, list] = {}
    totals = None
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        batch = cut_rows({k: features[k] for k in keep}, idx, length_multiple, max_len)
        pad = batch_size - len(idx)
        batch = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}
        batch["weight"] = (np.arange(batch_size) < len(idx)).astype(np.float32)
        batch = lengths.unpadded(batch, unpad_multiple, shards)
        out, sums = eval_fn(params, sh.global_batch_from_host(batch, mesh, rules))
        if jax.process_count() > 1:  # every process gets every row's outputs
            from jax.experimental import multihost_utils

            out = multihost_utils.process_allgather(out, tiled=True)
        out, sums = jax.device_get((out, sums))
        totals = sums if totals is None else {k: totals[k] + sums[k] for k in sums}
        for k, v in out.items():
            v = np.asarray(v)[: len(idx)]
            if kind in ("tagging", "span") and v.shape[1] < max_len:  # per-token output of a cut batch
                fill = -1e9 if kind == "span" else 0.0
                v = np.concatenate([v, np.full((len(v), max_len - v.shape[1], *v.shape[2:]), fill, v.dtype)], 1)
            outputs.setdefault(k, []).append(v)
    return lengths.restore_order({k: np.concatenate(v) for k, v in outputs.items()}, order), totals



def evaluate_splits(task, params, data, eval_fn, config, mesh, rules, writer, step, pred_dir) -> dict:
    """Scores every eval split (and writes prediction files for eval + predict splits if pred_dir)."""
    results = {}
    for split in (*task.eval_splits, *config.predict_splits):
        if split not in data or split == "train":
            continue
        examples, feats = data[split]["examples"], data[split]["features"]
        outputs, sums = predict(eval_fn, params, feats, task.kind, config.eval_batch_size,
                                config.length_multiple, mesh, rules, by_length=config.eval_by_length,
                                unpad_multiple=config.unpad_multiple)
        if split in task.eval_splits:
            metrics = {k: float(v) for k, v in task.evaluate(examples, feats, outputs).items()}
            metrics["loss"] = float(sums["loss_sum"] / max(sums["count"], 1e-9))
            writer.write(step, metrics, split)
            results[split] = metrics
            if jax.process_index() == 0:
                shown = json.dumps({k: round(v, 4) for k, v in metrics.items()})
                print(f"{task.name} {split} at step {step}: {shown}", flush=True)
        if pred_dir is not None:
            pred_dir.mkdir(parents=True, exist_ok=True)
            for path in task.write_predictions(examples, feats, outputs, pred_dir, split):
                log.info("wrote %s", path)
    return results

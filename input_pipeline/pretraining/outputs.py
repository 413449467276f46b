"""What a `create_pretraining_data` output directory holds besides its shards, for either engine
(the local process pool or the Beam pipeline): the clean start (`prepare_output`), and at the end
``config.json`` (the settings, so a reader knows max_seq_length and P) and ``summary.json`` (counts,
skipped input, speed), each written whole under a temporary name and renamed. ``summary.json`` is
written last: a directory without it is incomplete and training refuses it
(`input_pipeline.pretraining.dataset`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid

import tensorflow as tf

from input_pipeline.corpora import sources
from input_pipeline.pretraining.shards import PREFIX, Settings

log = logging.getLogger(__name__)


BEAM_TEMP = ".beam-temp-"  # the Beam pipeline's shards before they are renamed into place


def prepare_output(output_dir: str) -> None:
    """Creates ``output_dir``; removes an earlier run's ``summary.json``, ``config.json``, shards
    and a failed Beam run's temporary directory first (a half-rewritten directory must not look
    done; nothing is reused)."""
    tf.io.gfile.makedirs(output_dir)
    for name in ("summary.json", "config.json"):
        if tf.io.gfile.exists(os.path.join(output_dir, name)):
            tf.io.gfile.remove(os.path.join(output_dir, name))
    for stale in tf.io.gfile.glob(os.path.join(output_dir, f"{PREFIX}-*")):
        log.info("removing %s from an earlier run", stale)
        tf.io.gfile.remove(stale)
    for stale in tf.io.gfile.glob(os.path.join(output_dir, f"{BEAM_TEMP}*")):
        log.info("removing %s from an earlier run", stale)
        tf.io.gfile.rmtree(stale)


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def merge_reports(reports: list[sources.SourceReport]) -> sources.SourceReport:
    total = sources.SourceReport()
    for r in reports:
        total.files += r.files
        total.documents += r.documents
        total.sentences += r.sentences
        total.skipped.update(r.skipped)
        total.filtered.update(r.filtered)
        total.first_error = total.first_error or r.first_error
    return total


def check_text(input_spec, read: list[dict]) -> None:
    """Raises ValueError when stage 1 found no sentence at all (before the output is touched)."""
    if not sum(r.get("sentences", 0) for r in read):
        raise ValueError(f"{input_spec}: no text to make examples of "
                         f"({merge_reports([r['report'] for r in read]).summary()})")


def finish(output_dir: str, input_spec, s: Settings, *, read: list[dict], written: list[dict],
           input_files: int, vocab_file: str, vocab_size: int, lower_case: bool, seconds: float,
           engine: dict) -> dict:
    """Writes ``config.json`` then ``summary.json`` from stage 1's per-input counts (``read``) and
    stage 2's per-shard counts (``written``, in shard order); returns the summary. ``engine``:
    what ran it (``num_workers``, or the Beam ``runner``)."""
    totals = {k: sum(r[k] for r in written) for k in written[0]}
    report = merge_reports([r["report"] for r in read])
    source = report.as_dict()
    summary = {
        **totals,
        "empty_documents": sum(r.get("empty_documents", 0) for r in read),
        "sentences": sum(r.get("sentences", 0) for r in read),
        "next_sentence_label_1_fraction": totals["next_sentence_label_1"] / max(1, totals["examples"]),
        "mean_tokens_per_example": totals["tokens"] / max(1, totals["examples"]),
        "skipped_input": sum(source["skipped"].values()),
        "source": source,
        "input_files": input_files,
        "shards": [os.path.basename(s.shard_path(output_dir, i)) for i in range(s.num_shards)],
        **engine,
        "seconds": round(seconds, 3),
        "examples_per_second": round(totals["examples"] / seconds, 1),
        "tokens_per_second": round(totals["tokens"] / seconds, 1),
    }
    config = dataclasses.asdict(s) | {
        "input": input_spec if isinstance(input_spec, str) else list(input_spec),
        "vocab_file": vocab_file, "vocab_size": vocab_size,
        "lower_case": lower_case, "masked": s.masking == "static",
        "shard_pattern": os.path.basename(s.shard_path(output_dir, 0)).replace("00000-of", "*-of"),
    }
    write_json(os.path.join(output_dir, "config.json"), config)
    write_json(os.path.join(output_dir, "summary.json"), summary)
    log.info("wrote %d examples (%d tokens, %d masked) from %d documents to %d shards in %.1fs; %s",
             totals["examples"], totals["tokens"], totals["masked_tokens"], totals["documents"],
             s.num_shards, seconds, report.summary())
    return summary

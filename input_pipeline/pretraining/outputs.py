"""What a `create_pretraining_data` output directory holds besides its shards, for either engine
(the local process pool or the Beam pipeline): the clean start (`prepare_output`), and at the end
``config.json`` (the settings, so a reader knows max_seq_length and P) and ``summary.json`` (counts,
skipped input, speed, and `shape_warnings`: text of the wrong shape for the examples asked for),
each written whole under a temporary name and renamed. ``summary.json`` is written last: a
directory without it is incomplete and training refuses it (`input_pipeline.pretraining.dataset`).
With ``heldout_every`` the held-out shards' directory gets its own pair, written first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
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


# Text of the wrong shape (`shape_warnings`): a handful of documents with this many sentences each or
# more; a pair label's fraction of 1 this far from 0.5 or more (3 standard deviations, if wider); padding
# over this fraction of the rows.
FEW_DOCUMENTS, SENTENCES_PER_DOCUMENT = 10, 20
LABEL_TOLERANCE = 0.1
PADDING_LIMIT = 0.5


def shape_warnings(s: Settings, summary: dict, input_documents: int, input_sentences: int) -> list[str]:
    """One line for each way the text does not fit the examples asked for: the input read as a
    handful of long documents (one post per line read with the default format, where a blank line
    separates documents), an NSP or SOP label fraction far from 0.5 (a model learns the imbalance
    alone), most of every row padding (compute spent on nothing)."""
    out = []
    per_doc = input_sentences / max(1, input_documents)
    if s.format == "bert" and 0 < input_documents <= FEW_DOCUMENTS and per_doc >= SENTENCES_PER_DOCUMENT:
        out.append(f"the input was read as {input_documents} document(s) of {per_doc:.0f} sentences on average "
                   "(--format bert: a blank line ends a document); if each line is a document of its own "
                   "(one post per line), use --format doc_per_line")
    n = summary["examples"]
    if s.objective in ("nsp", "sop") and n:
        fraction = summary["next_sentence_label_1"] / n
        if abs(fraction - 0.5) > max(LABEL_TOLERANCE, 3 * 0.5 / math.sqrt(n)):
            one = "NotNext" if s.objective == "nsp" else "swapped"
            hint = (f"; the documents average {per_doc:.1f} sentences, too few for pairs from one document: "
                    "--objective none trains without the pair task" if s.objective == "nsp" and per_doc < 3 else "")
            out.append(f"{fraction:.0%} of the {s.objective.upper()} labels are 1 ({one}), expected about 50%: "
                       f"the task can be learnt from that imbalance alone{hint}")
    padding = summary["padding_fraction"]
    if n and padding > PADDING_LIMIT:
        mean = summary["tokens"] / n
        out.append(f"{padding:.0%} of the rows are padding at --max_seq_length {s.max_seq_length} ({mean:.0f} real "
                   "tokens an example on average): a shorter --max_seq_length, or --objective none (rows filled "
                   "with sentences across documents)")
    return out


def _write(output_dir: str, input_spec, s: Settings, written: list[dict], read: list[dict], report, *,
           input_files: int, vocab: dict, seconds: float, engine: dict, extra_config: dict,
           check_shape: bool, extra_summary: dict | None = None) -> dict:
    """``config.json`` then ``summary.json`` of one output directory; returns the summary."""
    totals = {k: sum(r[k] for r in written) for k in written[0]}
    source = report.as_dict()
    rows = totals["examples"] * s.max_seq_length
    summary = {
        **totals,
        "empty_documents": sum(r.get("empty_documents", 0) for r in read),
        "sentences": sum(r.get("sentences", 0) for r in read),
        "next_sentence_label_1_fraction": totals["next_sentence_label_1"] / max(1, totals["examples"]),
        "mean_tokens_per_example": totals["tokens"] / max(1, totals["examples"]),
        "padding_fraction": 1 - totals["tokens"] / rows if rows else 0.0,
        "skipped_input": sum(source["skipped"].values()),
        "source": source,
        "input_files": input_files,
        "shards": [os.path.basename(s.shard_path(output_dir, i)) for i in range(s.num_shards)],
        "examples_per_shard": [r["examples"] for r in written],
        **engine,
        "seconds": round(seconds, 3),
        "examples_per_second": round(totals["examples"] / seconds, 1),
        "tokens_per_second": round(totals["tokens"] / seconds, 1),
    }
    summary["warnings"] = shape_warnings(s, summary, report.documents if check_shape else 0, report.sentences)
    summary.update(extra_summary or {})
    config = dataclasses.asdict(s) | {
        "input": input_spec if isinstance(input_spec, str) else list(input_spec),
        **vocab, "masked": s.masking == "static",
        "shard_pattern": os.path.basename(s.shard_path(output_dir, 0)).replace("00000-of", "*-of"),
        **extra_config,
    }
    write_json(os.path.join(output_dir, "config.json"), config)
    write_json(os.path.join(output_dir, "summary.json"), summary)
    log.info("wrote %d examples (%d tokens, %d masked) from %d documents to %d shards in %s in %.1fs",
             totals["examples"], totals["tokens"], totals["masked_tokens"], totals["documents"],
             s.num_shards, output_dir, seconds)
    for warning in summary["warnings"]:
        log.warning("%s: %s", output_dir, warning)
    return summary


def finish(output_dir: str, input_spec, s: Settings, *, read: list[dict], written: list[dict],
           input_files: int, vocab_file: str, vocab_size: int, lower_case: bool, seconds: float,
           engine: dict, heldout_output: str = "") -> dict:
    """Writes ``config.json`` then ``summary.json`` from stage 1's per-input counts (``read``) and
    stage 2's per-shard counts (``written``, in shard order: the training shards, then the held-out
    ones, whose directory ``heldout_output`` is written first); returns the training summary (with
    the held-out one under ``held_out``). ``engine``: what ran it (``num_workers``, or the Beam
    ``runner``)."""
    report = merge_reports([r["report"] for r in read])
    vocab = {"vocab_file": vocab_file, "vocab_size": vocab_size, "lower_case": lower_case}
    common = dict(input_files=input_files, vocab=vocab, seconds=seconds, engine=engine)
    held = {}
    if s.held_out:
        held = _write(heldout_output, input_spec, s.heldout_settings(), written[s.num_shards:], read, report,
                      extra_config={"held_out_of": {"output": output_dir, "every": s.heldout_every}},
                      check_shape=False, **common)
    held_out = {"output": heldout_output, "every": s.heldout_every}
    summary = _write(output_dir, input_spec, s, written[: s.num_shards], read, report, check_shape=True,
                     extra_config={"held_out": held_out} if held else {},
                     extra_summary={"held_out": held_out | {k: held[k] for k in ("documents", "examples", "tokens")}}
                     if held else None, **common)
    log.info("input: %s", report.summary())
    return summary

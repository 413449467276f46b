"""The work of `create_pretraining_data`, one input file or one output shard at a time.

`Settings` decide the output. Stage 1 (`read_unit`): one input file (or a TFDS spec) → documents,
tokenized in batches in-graph, each routed to a shard (`route`) and spilled to a local temporary
file per (shard, file). Stage 2 (`write_shard`): one shard's spilled documents, in file order →
instances (seeded with `shard_seed`) → static masks → a TFRecord file written under a temporary
name and renamed when complete. `init_worker` and `in_worker` run either stage in a spawned worker.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import random
from collections.abc import Iterator

from input_pipeline import hide_accelerators_from_tf
from input_pipeline.corpora import sources
from input_pipeline.pretraining import examples, featurize
from input_pipeline.tokenizers.factory import open_tokenizer

PREFIX = "pretrain"
COMPRESSIONS = {"none": (None, ".tfrecord"), "gzip": ("GZIP", ".tfrecord.gz")}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that decides the output (and a worker needs); written to config.json."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    dupe_factor: int = 10
    objective: str = "nsp"
    packing: str = "full"
    whole_word_mask: bool = False
    ngram: int = 0  # N > 0: ALBERT's n-gram masking, spans of n <= N whole words (masking.MaskingConfig)
    short_seq_prob: float = 0.1
    random_seed: int = 12345
    num_shards: int = 1
    masking: str = "static"
    format: str = "bert"
    on_error: str = "skip"
    compression: str = "none"
    text_field: str = "text"
    max_documents_per_file: int | None = None  # for smoke tests: only the first N of each file
    heldout_every: int = 0  # N > 0: document j of each input with j % N == 0 goes to the held-out shards
    heldout_shards: int = 0  # the held-out shard files (0: as many as num_shards)

    def check(self) -> None:
        """Raises a one-line ValueError naming each setting out of range (``key=value: expected ...``)."""
        problems = [
            (self.objective in examples.OBJECTIVES, "objective", f"one of {examples.OBJECTIVES}"),
            (self.packing in examples.PACKINGS, "packing", f"one of {examples.PACKINGS}"),
            (self.masking in ("static", "none"), "masking", "'static' or 'none'"),
            (self.format in sources.FORMATS, "format", f"one of {sources.FORMATS}"),
            (self.on_error in ("skip", "raise"), "on_error", "'skip' or 'raise'"),
            (self.compression in COMPRESSIONS, "compression", f"one of {tuple(COMPRESSIONS)}"),
            (self.num_shards >= 1, "num_shards", ">= 1"),
            (self.dupe_factor >= 1, "dupe_factor", ">= 1"),
            (self.max_seq_length >= 5, "max_seq_length", ">= 5"),
            (self.max_predictions_per_seq >= 1, "max_predictions_per_seq", ">= 1"),
            (isinstance(self.ngram, int) and not isinstance(self.ngram, bool) and self.ngram >= 0,
             "ngram", "an int >= 0 (0: off)"),
            (0 <= self.short_seq_prob <= 1, "short_seq_prob", "a probability in [0, 1]"),
            (0 <= self.masked_lm_prob <= 1, "masked_lm_prob", "a probability in [0, 1]"),
            (self.heldout_every == 0 or self.heldout_every >= 2, "heldout_every", "0 (none held out) or >= 2"),
            (self.heldout_shards >= 0, "heldout_shards", ">= 0 (0: as many as num_shards)"),
        ]
        bad = [f"{key}={getattr(self, key)!r}: expected {what}" for ok, key, what in problems if not ok]
        if bad:
            raise ValueError(f"create_pretraining_data: {'; '.join(bad)}")

    def shard_path(self, output_dir: str, shard: int) -> str:
        suffix = COMPRESSIONS[self.compression][1]
        return os.path.join(output_dir, f"{PREFIX}-{shard:05d}-of-{self.num_shards:05d}{suffix}")

    @property
    def held_out(self) -> int:
        """The number of held-out shards (0: nothing held out)."""
        return (self.heldout_shards or self.num_shards) if self.heldout_every else 0

    def heldout_settings(self) -> Settings:
        """The held-out shards' settings: the same examples, each held-out document used once
        (``dupe_factor`` 1), in `held_out` files."""
        return dataclasses.replace(self, num_shards=self.held_out, dupe_factor=1, heldout_every=0, heldout_shards=0)

    def shard_output(self, job_output: str, heldout_output: str, shard: int) -> tuple[Settings, str]:
        """(settings, file) of shard ``shard`` of a job: 0 .. num_shards - 1 are the training shards,
        the held-out ones follow."""
        if shard < self.num_shards:
            return self, self.shard_path(job_output, shard)
        held = self.heldout_settings()
        return held, held.shard_path(heldout_output, shard - self.num_shards)


@dataclasses.dataclass(frozen=True)
class ShardingJob:
    """What either stage needs, in the parent process or a worker."""

    settings: Settings
    units: tuple[str, ...]  # input files, or a single TFDS spec
    output_dir: str
    spill_dir: str
    vocab_file: str  # the tokenizer's file (`input_pipeline.tokenizers.factory.source_file`): any kind
    lower_case: bool
    heldout_output: str = ""  # the held-out shards' directory (settings.heldout_every > 0)


def shard_seed(random_seed: int, shard: int) -> int:
    """Seed of shard ``shard``'s ``random.Random`` (documents shuffle, instances, their shuffle)."""
    return random_seed * 1_000_003 + shard


def route(unit: int, doc: int, num_units: int, num_shards: int) -> int:
    """The shard of document ``doc`` of input ``unit``: with at least as many inputs as shards,
    input ``i`` goes whole to shard ``i % num_shards``; with fewer, document ``j`` of input ``i``
    goes to shard ``i + num_units * (j % k)`` (``k`` = the shards input ``i`` feeds)."""
    if num_units >= num_shards:
        return unit % num_shards
    return unit + num_units * (doc % len(range(unit, num_shards, num_units)))


def route_document(s: Settings, unit: int, doc: int, num_units: int) -> int:
    """The shard of document ``doc`` of input ``unit`` among the job's ``num_shards + held_out``:
    with ``heldout_every`` N, the documents with ``doc % N == 0`` go to the held-out shards (numbered
    from ``num_shards`` on), the rest to the training shards, each spread by `route` in their order."""
    n = s.heldout_every
    if n and doc % n == 0:
        return s.num_shards + route(unit, doc // n, num_units, s.held_out)
    before = (doc - 1) // n + 1 if n else 0  # held-out documents before this one in its input
    return route(unit, doc - before, num_units, s.num_shards)


def _spill_path(job: ShardingJob, shard: int, unit: int) -> str:
    return os.path.join(job.spill_dir, f"s{shard:05d}-u{unit:05d}.bin")


def unit_documents(job: ShardingJob, unit: int, tokenizer, report: sources.SourceReport,
                   counts: collections.Counter, notify=lambda n: None) -> Iterator[tuple[int, int, list]]:
    """Stage 1's reading: ``(j, shard, document)`` for each non-empty tokenized document ``j`` of
    input ``unit``, in order (`route_document` picks the shard); counts ``empty_documents`` and
    ``sentences`` into ``counts`` and bad input into ``report``. The local pool spills what it
    yields, the Beam pipeline (`input_pipeline.pretraining.beam_pipeline`) emits it keyed by shard."""
    s = job.settings
    docs = sources.read_documents(job.units[unit], format=s.format, on_error=s.on_error,
                                  text_field=s.text_field, report=report)
    if s.max_documents_per_file is not None:
        docs = (d for _, d in zip(range(s.max_documents_per_file), docs, strict=False))
    seen = 0
    for j, doc in enumerate(featurize.tokenize_documents(docs, tokenizer)):
        seen = j + 1
        if seen % 64 == 0:
            notify(64)
        if not doc:
            counts["empty_documents"] += 1
            continue
        counts["sentences"] += len(doc)
        yield j, route_document(s, unit, j, len(job.units)), doc
    notify(seen % 64)


def read_unit(job: ShardingJob, unit: int, tokenizer, notify) -> dict:
    """Stage 1: one input file → tokenized documents spilled per shard; returns counts."""
    report, counts, spills = sources.SourceReport(), collections.Counter(), {}
    try:
        for _, shard, doc in unit_documents(job, unit, tokenizer, report, counts, notify):
            if shard not in spills:
                spills[shard] = open(_spill_path(job, shard, unit), "wb")  # noqa: SIM115
            featurize.spill_document(spills[shard], doc)
    finally:
        for f in spills.values():
            f.close()
    return {"report": report, **counts}


def shard_examples(s: Settings, shard: int, documents: list, tokenizer) -> tuple[dict, dict]:
    """Stage 2 without the file: one shard's documents (in file order) → instances (seeded with
    `shard_seed`) → static masks → (features [N, ...] as `featurize.build_examples` returns them,
    counts for the summary)."""
    rng = random.Random(shard_seed(s.random_seed, shard))
    feats = featurize.build_examples(
        documents, tokenizer, objective=s.objective, packing=s.packing,
        max_seq_length=s.max_seq_length, short_seq_prob=s.short_seq_prob,
        dupe_factor=s.dupe_factor, seed=rng)
    if s.masking == "static":
        cfg = featurize.masking_config(tokenizer, masked_lm_prob=s.masked_lm_prob,
                                         max_predictions_per_seq=s.max_predictions_per_seq,
                                         whole_word=s.whole_word_mask, ngram=s.ngram)
        feats = featurize.mask_features(feats, tokenizer, cfg, seed=s.random_seed, stream=shard)
    return feats, {
        "documents": len(documents),
        "examples": len(feats["input_ids"]),
        "tokens": int(feats["input_mask"].sum()),
        "masked_tokens": int(feats["masked_lm_weights"].sum()) if s.masking == "static" else 0,
        "next_sentence_label_1": int(feats["next_sentence_labels"].sum()),
    }


def write_shard(job: ShardingJob, shard: int, tokenizer, notify) -> dict:
    """Stage 2: one shard's spilled documents → `shard_examples` → a complete TFRecord file (a
    training shard, or a held-out one: `Settings.shard_output`)."""
    settings, path = job.settings.shard_output(job.output_dir, job.heldout_output, shard)
    spilled = glob.glob(os.path.join(job.spill_dir, f"s{shard:05d}-u*.bin"))
    feats, counts = shard_examples(settings, shard, featurize.read_spilled(sorted(spilled)), tokenizer)
    featurize.write_records(path, featurize.serialize_features(feats), COMPRESSIONS[settings.compression][0])
    notify(0)
    return counts


_WORKER: dict = {}  # per worker process: its tokenizer and progress queue (set by init_worker)


def init_worker(vocab_file: str, lower_case: bool, queue) -> None:
    hide_accelerators_from_tf()
    _WORKER.update(tokenizer=open_tokenizer(vocab_file, lower_case), queue=queue)


def in_worker(args):
    stage, job, index = args
    fn = read_unit if stage == "read" else write_shard
    return index, fn(job, index, _WORKER["tokenizer"], _WORKER["queue"].put)

"""The training input: ``make_pretraining_dataset(config, ...)`` → fixed-shape numpy batches.

``config.data.input`` is either

* TFRecord shards (a glob, a list, or a directory written by ``create_pretraining_data``), masked
  (``data.masking="static"``: the paper's dupe_factor copies) or unmasked (``"dynamic"``: masked
  here, a new mask every epoch, RoBERTa style); Google's create_pretraining_data.py files work too;
* anything else `sources.read_documents` reads (text files, Wikipedia dumps, ``tfds:...``, and
  ``pkg:wikipedia``): examples are built in memory at start-up (small corpora; prepare shards with
  ``create_pretraining_data`` for big ones).

Every process reads its own share: TFRecord files ``[process_index::process_count]`` (what it
reads depends on the number of processes), or, for in-memory examples, its block of rows of each
global batch (the global batches are the same for any number of processes). Order is a pure
function of (seed, epoch): epoch e shuffles the file order and the examples with seeds derived
from e, and dynamic masks use ``masking.example_seed(seed, e, i)``.
The position is (epoch, batches consumed), so ``restore(state())`` replays exactly the batches an
uninterrupted run would see (by skipping, before parsing and masking, the records already used).
With ``config.data.pack_examples`` K > 0 the masked examples are packed, up to K per row
(`input_pipeline.pretraining.packing.PackedPretrainingData`; the position is then the next example).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from input_pipeline.corpora import sources
from input_pipeline.package_data import locate
from input_pipeline.pretraining import featurize, masking

log = logging.getLogger(__name__)
RECORD_SUFFIXES = (".tfrecord", ".tfrecord.gz", ".tfrecords")


def held_out_every(fraction: float) -> int:
    """``data.eval_fraction`` as the text input's held-out rule: every n-th document is held out."""
    return max(int(round(1 / fraction)), 2)


def check_shards(spec: str, d) -> list[str] | None:
    """The TFRecord files ``spec`` names, checked against the data config ``d`` (lengths, masking),
    or None when ``spec`` names text input."""
    files = _record_files(spec)
    if files:
        _check_shapes(files[0], d, "GZIP" if files[0].endswith(".gz") else None)
    return files


def _record_files(spec: str) -> list[str] | None:
    """The shard files if ``spec`` names TFRecords (or a create_pretraining_data directory)."""
    spec = locate(spec)
    if tf.io.gfile.isdir(spec) and tf.io.gfile.exists(spec.rstrip("/") + "/summary.json"):
        spec = spec.rstrip("/") + "/*.tfrecord*"
    elif tf.io.gfile.isdir(spec) and tf.io.gfile.glob(spec.rstrip("/") + "/pretrain-*.tfrecord*"):
        raise ValueError(f"data.input {spec}: create_pretraining_data's output without summary.json, so its "
                         "run did not finish (killed?); run it again (it starts over)")
    parts = [p for p in spec.split(",") if p]
    if not parts or not all(p.endswith(RECORD_SUFFIXES) or p.endswith(RECORD_SUFFIXES[0] + "*") for p in parts):
        return None
    # Never a shard still being written (create_pretraining_data's "<shard>.tmp-XXXXXXXX").
    files = sorted(f for p in parts for f in tf.io.gfile.glob(p) if ".tmp-" not in f.rsplit("/", 1)[-1])
    if not files:
        raise FileNotFoundError(f"data.input {spec!r} matches no TFRecord files")
    return files


def shards_summary(spec: str) -> dict | None:
    """The ``summary.json`` of the create_pretraining_data output ``spec`` names (its directory, or a
    glob of its files), or None (text input, files without one)."""
    spec = locate(spec)
    if "," in spec:
        return None
    directory = spec.rstrip("/") if tf.io.gfile.isdir(spec) else spec.rsplit("/", 1)[0]
    path = directory + "/summary.json"
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def examples_per_process(spec: str, processes: int = 1) -> list[int] | None:
    """The examples each of ``processes`` processes reads from the shards ``spec`` names (process i
    reads files i, i + n, ...), from their ``summary.json``; None when unknown."""
    summary = shards_summary(spec)
    files = _record_files(spec) if summary is not None else None
    if not files:
        return None
    per_file = dict(zip(summary.get("shards", []), summary.get("examples_per_shard", []), strict=False))
    counts = [per_file.get(f.rsplit("/", 1)[-1]) for f in files]
    if None in counts:  # an older summary without per-shard counts: an even share of the total
        if len(files) != len(summary.get("shards", [])):
            return None
        counts = [summary["examples"] / len(files)] * len(files)
    return [int(sum(counts[i::processes])) for i in range(processes)]


def eval_repeats(config, processes: int = 1) -> str | None:
    """A warning when the held-out shards hold fewer examples than one evaluation reads
    (``eval_steps`` batches of ``batch_size`` rows, each process ``batch_size / processes`` of them
    from its own files): the evaluation would read some rows more than once. None when they suffice
    or their size is unknown."""
    d = config.data
    if not (d.eval_input and config.eval_every and config.eval_steps):
        return None
    counts = examples_per_process(d.eval_input, processes)
    if counts is None:
        return None
    rows = config.batch_size // processes  # each process's rows of a batch
    need, fewest = config.eval_steps * rows, min(counts)
    if fewest >= need:
        return None
    hosts = f" ({fewest:,} on the host with fewest, {need:,} rows each)" if processes > 1 else ""
    fix = (f"--config.eval_steps={fewest // rows} reads each at most once" if fewest >= rows else
           "they do not fill one batch")
    return (f"{d.eval_input}: {sum(counts):,} held-out examples, fewer than an evaluation reads "
            f"({config.eval_steps} batches of {config.batch_size} = {config.eval_steps * config.batch_size:,} rows"
            f"{hosts}): rows repeat, some {-(-need // max(fewest, 1))} times; {fix}; or hold more out "
            "(create_pretraining_data --heldout_every)")


@dataclasses.dataclass(frozen=True)
class _Recipe:
    """How `PretrainingData` makes its tf.data pipeline, without its position: the functions the
    pipeline runs capture this, never the reader, so a reader and its iterator form no reference
    cycle and the iterator (its buffers, its threads) goes when the reader does, not at some later
    full garbage collection."""

    make_epoch: Callable
    batch_size: int
    mask_cfg: masking.MaskingConfig | None
    parse: Callable | None
    continuation: Callable
    seed: int
    shuffle_buffer: int
    block: tuple[int, int]

    def one_epoch(self, epoch, skip_examples, whole: bool) -> tf.data.Dataset:
        """(epoch, index [batch], records [batch]) of one epoch, its first ``skip_examples`` left
        out; ``whole``: keep the epoch's last, short batch (for `chunks`) instead of dropping it."""
        ds = self.make_epoch(epoch)
        if self.shuffle_buffer > 1:
            ds = ds.shuffle(self.shuffle_buffer, seed=self.seed * 7919 + epoch, reshuffle_each_iteration=False)
        # Skip what was consumed before parsing and masking; index i keeps naming the same example.
        i, n = self.block
        ds = ds.enumerate().skip(skip_examples).batch(self.batch_size * n, drop_remainder=not whole)
        if n > 1:  # this reader's rows of the global batch, before parsing and masking
            lo, hi = i * self.batch_size, (i + 1) * self.batch_size
            ds = ds.map(lambda index, x: (index[lo:hi], tf.nest.map_structure(lambda v: v[lo:hi], x)))
        return ds.map(lambda index, x: (epoch, index, x))

    def dataset(self, epoch: int, skip_examples: int, num_epochs: int, whole: bool = False) -> tf.data.Dataset:
        first = tf.constant(epoch, tf.int64)
        ds = self.one_epoch(first, skip_examples, whole)
        if num_epochs > 1:
            ds = ds.concatenate(tf.data.Dataset.range(epoch + 1, epoch + num_epochs).flat_map(
                lambda e: self.one_epoch(e, 0, whole)))
        ds = ds.map(self.prepare, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.prefetch(tf.data.AUTOTUNE)

    def prepare(self, epoch, index, x):
        """epoch: scalar; index: [batch] int64 (position in the epoch); x: [batch] records or dict."""
        features = self.parse(x) if self.parse is not None else x
        cfg = self.mask_cfg
        if cfg is not None:  # dynamic masking: row i gets example_seed(seed, epoch, i)
            seeds = masking.example_seed(self.seed, epoch, index)  # [batch, 2]
            ids = features["input_ids"]  # [batch, L]
            features = masking.mask_example(features, seeds, cfg, self.continuation(ids) if cfg.word_level else None)
        return epoch, index, features


class PretrainingData:
    """An iterator of numpy batches (the `input_pipeline.pretraining.batch` layout) with ``state()`` /
    ``restore(state)``.

    One tf.data iterator runs through ``EPOCHS_PER_ITERATOR`` epochs (each batch carries its
    epoch): building an iterator traces and optimises the masking graph, ~2 s on 2 cores, which
    must not be paid at every epoch boundary of a small corpus. ``make_epoch(epoch)`` gets the epoch
    as a scalar int64 tensor and returns that epoch's records (or feature dicts) in file order.
    """

    EPOCHS_PER_ITERATOR = 100

    def __init__(self, make_epoch, *, batch_size: int, mask_cfg: masking.MaskingConfig | None,
                 continuation, seed: int, shuffle_buffer: int, parse=None, block: tuple[int, int] = (0, 1)):
        """``block`` (i, n): batches of ``batch_size * n`` examples are formed and this reader keeps
        their rows ``[i * batch_size, (i + 1) * batch_size)`` (process i of n: the same global
        batches for any n); (0, 1): every row."""
        self._recipe = _Recipe(make_epoch, batch_size, mask_cfg, parse, continuation, seed, shuffle_buffer, block)
        self.epoch, self.batch = 0, 0
        self._it, self._it_end, self._it_batches = None, 0, 0

    batch_size = property(lambda self: self._recipe.batch_size)
    mask_cfg = property(lambda self: self._recipe.mask_cfg)
    block = property(lambda self: self._recipe.block)

    def state(self) -> dict:
        return {"kind": "pretraining", "epoch": self.epoch, "batch": self.batch}

    def restore(self, state: dict) -> None:
        if state.get("kind", "pretraining") != "pretraining":
            raise ValueError(f"input state {state} was saved with config.data.pack_examples > 0; "
                             "set it again to resume (unpacked input cannot resume from a packed position)")
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self._it = None

    def chunks(self, epoch: int, skip_examples: int):
        """Every example from (epoch, skip_examples) on, epoch after epoch, none dropped: yields
        (epoch, index [n] int64, features {key: [n, ...]}) with n <= batch_size (an epoch's last
        chunk may be short). For `input_pipeline.pretraining.packing.PackedPretrainingData`."""
        size = self.batch_size * self.block[1]
        while True:
            found = False
            # From the start of the global batch that holds example ``skip_examples``, so that every
            # block keeps its rows; this reader's examples before ``skip_examples`` are dropped.
            for e, index, features in self._recipe.dataset(epoch, skip_examples // size * size,
                                                           self.EPOCHS_PER_ITERATOR, whole=True):
                found = True
                index = index.numpy()
                keep = index >= (skip_examples if int(e) == epoch else 0)
                yield int(e), index[keep], {k: v.numpy()[keep] for k, v in features.items()}
            if not found and skip_examples == 0:
                raise ValueError(f"no examples in {self.EPOCHS_PER_ITERATOR} epochs of the input")
            epoch, skip_examples = epoch + self.EPOCHS_PER_ITERATOR, 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        while True:
            if self._it is None:
                n = self.EPOCHS_PER_ITERATOR
                self._it = iter(self._recipe.dataset(self.epoch, self.batch * self.batch_size * self.block[1], n))
                self._it_end, self._it_batches = self.epoch + n, 0
            try:
                epoch, _, batch = next(self._it)
                break
            except StopIteration:
                if self._it_batches == 0 and self.batch == 0:
                    raise ValueError(f"not enough examples for one batch of {self.batch_size} per process "
                                     f"({self.batch_size * self.block[1]} in all)") from None
                self.epoch, self.batch, self._it = self._it_end, 0, None
        epoch = int(epoch)
        if epoch != self.epoch:
            self.epoch, self.batch = epoch, 0
        self.batch += 1
        self._it_batches += 1
        return {k: v.numpy() for k, v in batch.items()}


def _in_memory_examples(spec: str, tokenizer, d, split: str, objective: str) -> dict[str, np.ndarray]:
    """Text / Wikipedia / TFDS → example arrays (eval: every n-th document, n = 1/eval_fraction)."""
    report = sources.SourceReport()
    docs = list(sources.read_documents(locate(spec), format=d.format, report=report))
    log.info("read %s: %s", spec, report.summary())
    if d.eval_fraction and not d.eval_input:
        every = held_out_every(d.eval_fraction)
        docs = [doc for i, doc in enumerate(docs) if (i % every == 0) == (split == "eval")]
    tokenized = list(featurize.tokenize_documents(docs, tokenizer))
    return featurize.build_examples(tokenized, tokenizer, objective=objective,
                                      packing=d.packing, max_seq_length=d.max_seq_length,
                                      short_seq_prob=d.short_seq_prob, seed=d.seed + (1 if split == "eval" else 0))


def make_pretraining_dataset(config, *, split: str = "train", batch_size: int, process_index: int = 0,
                             process_count: int = 1):
    """This process's batches of ``batch_size`` rows: a `PretrainingData`, or with
    ``config.data.pack_examples`` K > 0 a `PackedPretrainingData` (up to K examples per row)."""
    from input_pipeline.tokenizers.factory import load_tokenizer

    d = config.data
    spec = d.eval_input if split == "eval" and d.eval_input else d.input
    if not spec:
        raise ValueError("config.data.input is empty: set --config.data.input=... (see docs/data.md)")
    if split == "eval" and not d.eval_input and not d.eval_fraction:
        raise ValueError("evaluation needs config.data.eval_input or data.eval_fraction > 0 (or eval_every=0)")
    ngram = d.ngram_mask
    if isinstance(ngram, bool) or not isinstance(ngram, int) or ngram < 0:
        raise ValueError(f"config.data.ngram_mask={ngram!r}: expected an int >= 0 (0: off; ALBERT used 3)")
    tokenizer = load_tokenizer(locate(d.vocab))
    mask_cfg = None
    if d.masking == "dynamic":
        mask_cfg = featurize.masking_config(tokenizer, masked_lm_prob=d.masked_lm_prob,
                                              max_predictions_per_seq=d.max_predictions_per_seq,
                                              whole_word=d.whole_word_mask, ngram=ngram)
    elif d.masking != "static":
        raise ValueError(f"config.data.masking={d.masking!r}: expected 'static' or 'dynamic'")
    files = _record_files(spec)
    seed = d.seed + (10_007 if split == "eval" else 0)
    if files is not None:
        if split == "eval" and not d.eval_input:  # eval_fraction holds out documents of text input only
            raise ValueError(f"config.data.eval_fraction={d.eval_fraction} cannot split TFRecord shards "
                             f"({spec}): set config.data.eval_input to held-out shards, or eval_every=0")
        mine = files[process_index::process_count]
        if not mine:
            raise ValueError(f"{len(files)} TFRecord files cannot feed {process_count} processes")
        p = None if d.masking == "dynamic" else d.max_predictions_per_seq
        compression = "GZIP" if mine[0].endswith(".gz") else None
        _check_shapes(files[0], d, "GZIP" if files[0].endswith(".gz") else None)

        def make_epoch(epoch: tf.Tensor) -> tf.data.Dataset:  # epoch: scalar int64
            order = tf.numpy_function(lambda e: np.random.default_rng([seed, int(e)]).permutation(len(mine)),
                                      [epoch], tf.int64, stateful=False)
            return tf.data.TFRecordDataset(tf.gather(tf.constant(mine), order), compression_type=compression)

        def parse(records):  # [batch] serialized tf.train.Example
            return featurize.parse_examples(records, d.max_seq_length, p)
    else:
        if d.masking == "static":
            log.info("static masking of text input: examples are masked once, with epoch-0 seeds")
        # ELECTRA's replaced-token detection ("rtd") reads single-segment examples, as objective "none".
        objective = "none" if config.objective == "rtd" else config.objective
        rows = _in_memory_examples(spec, tokenizer, d, split, objective)  # all of them: see `block`
        if len(rows["input_ids"]) < batch_size * process_count:  # fails here, not after building tf.data
            raise ValueError(f"{spec}: {len(rows['input_ids'])} {split} examples, fewer than one batch of "
                             f"{batch_size * process_count} (config.batch_size)")
        reads = config.eval_steps * batch_size * process_count if "eval_steps" in config else 0
        if split == "eval" and process_index == 0 and len(rows["input_ids"]) < reads:
            which = f" (every {held_out_every(d.eval_fraction)}th document)" if not d.eval_input else ""
            log.warning("%s: %d held-out examples%s, fewer than an evaluation reads (%d batches of %d = %d rows): "
                        "rows repeat; lower config.eval_steps to %d, or hold out more", spec, len(rows["input_ids"]),
                        which, config.eval_steps, batch_size * process_count, reads,
                        len(rows["input_ids"]) // (batch_size * process_count))
        if d.masking == "static":
            cfg = featurize.masking_config(tokenizer, masked_lm_prob=d.masked_lm_prob,
                                             max_predictions_per_seq=d.max_predictions_per_seq,
                                             whole_word=d.whole_word_mask, ngram=ngram)
            rows = featurize.mask_features(rows, tokenizer, cfg, seed=seed)

        def make_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
            return tf.data.Dataset.from_tensor_slices(rows)
        parse = None
    data = PretrainingData(make_epoch, batch_size=batch_size, mask_cfg=mask_cfg, parse=parse,
                           continuation=tokenizer.is_continuation, seed=seed, shuffle_buffer=d.shuffle_buffer,
                           block=(0, 1) if files is not None else (process_index, process_count))
    if d.pack_examples:  # K examples per row at most: rows of examples, not padding
        from input_pipeline.pretraining.packing import PackedPretrainingData

        return PackedPretrainingData(data, batch_size, max_examples=d.pack_examples)
    return data


def _check_shapes(first_file: str, d, compression: str | None = None) -> None:
    """The shards must agree with the training config: lengths and masked-or-not, from the data
    directory's config.json when there is one, then from the first record (Google's files)."""
    static = d.masking == "static"
    meta = first_file.rsplit("/", 1)[0] + "/config.json"
    if tf.io.gfile.exists(meta):
        with tf.io.gfile.GFile(meta) as f:
            written = json.load(f)
        for key in ("max_seq_length", "max_predictions_per_seq"):
            if key in written and written[key] != d[key] and (key != "max_predictions_per_seq" or static):
                raise ValueError(f"{meta}: {key}={written[key]} but config.data.{key}={d[key]}")
        if "masked" in written and bool(written["masked"]) != static:
            raise ValueError(_masking_mismatch(meta, f'"masked": {str(written["masked"]).lower()}', d.masking))
    record = next(iter(tf.data.TFRecordDataset(first_file, compression_type=compression).take(1)), None)
    if record is None:
        return
    features = tf.train.Example.FromString(record.numpy()).features.feature
    length = len(features["input_ids"].int64_list.value) if "input_ids" in features else None
    if length != d.max_seq_length:
        raise ValueError(f"{first_file}: first record has {length} input_ids, expected "
                         f"config.data.max_seq_length={d.max_seq_length} (a pre-training TFRecord?)")
    if ("masked_lm_positions" in features) != static:
        masked = "masked_lm_positions" in features
        raise ValueError(_masking_mismatch(first_file, f"first record {'has' if masked else 'lacks'} "
                                           "masked_lm_positions", d.masking))
    p = len(features["masked_lm_positions"].int64_list.value) if static else d.max_predictions_per_seq
    if p != d.max_predictions_per_seq:
        raise ValueError(f"{first_file}: {p} masked_lm_positions per record but "
                         f"config.data.max_predictions_per_seq={d.max_predictions_per_seq}")


def _masking_mismatch(where: str, evidence: str, masking_mode: str) -> str:
    if masking_mode == "static":
        return (f"{where}: the shards are unmasked ({evidence}) but config.data.masking='static' reads "
                f"pre-masked shards; set --config.data.masking=dynamic, or rebuild them with --masking static")
    return (f"{where}: the shards are already masked ({evidence}) and config.data.masking='dynamic' would "
            f"mask them again; set --config.data.masking=static, or rebuild them with --masking none")

r"""`create_pretraining_data` as an Apache Beam pipeline: the local tool's shards, on any runner.

    python -m input_pipeline.create_pretraining_data --runner=DirectRunner --input 'corpus/*.txt' \
        --output data/p128 --vocab vocab.txt --num_shards 64 [Beam's own options, e.g. --direct_num_workers=2]

The same two stages as the local process pool (`input_pipeline.pretraining.shards`), as Beam
transforms, so each document's examples depend only on the seed, the document and its place in
the corpus, never on the runner, the workers or the bundling:

1. ``read``: one element per input file; `shards.unit_documents` reads and tokenizes it and emits
   ``(shard, (file, j, document))`` for its non-empty documents (`shards.route` picks the shard).
   With ``heldout_every``, the held-out shards are numbered after the training ones.
2. ``GroupByKey`` by shard (every shard also gets an empty marker, so a shard without documents
   still gets its empty file, as locally); each shard sorts its documents by ``(file, j)`` — the
   order the local tool's spill files give — and `shards.shard_examples` builds its instances and
   static masks with the shard's seed.
3. Beam's `fileio.WriteToFiles` writes one TFRecord file per shard, ``pretrain-SSSSS-of-NNNNN``:
   into a temporary directory first (``<output>/.beam-temp-<id>``, which no training glob
   matches), then renamed into place once written, so no partial shard is ever visible. (A
   failed run leaves that directory; the next run removes it.)

Before any shard is built, a step checks that stage 1 found text (an empty corpus is the local
tool's one-line error, and the output is untouched) and removes an earlier run's shards and
``summary.json``; after every shard is in place, the last step writes ``config.json`` and then
``summary.json`` (`input_pipeline.pretraining.outputs`) and removes the temporary directory. A
pipeline that fails anywhere leaves no ``summary.json``, and training refuses such a directory.

Parallelism: stage 1 runs one worker per input file (split a corpus into many files; a TFDS
spec is read by one worker, as locally), stage 2 one per shard (``--num_shards``). Workers get the
vocabulary's text with the pipeline, so only the inputs and the output need be where the workers
can reach them (``gs://`` on Dataflow). Needs ``pip install 'bert-jax[beam]'``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import tempfile
import time
import uuid

import apache_beam as beam
import tensorflow as tf
from apache_beam.io import fileio
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil  # TFRecord framing (length, masked CRC32C)
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.options.value_provider import StaticValueProvider

from input_pipeline import command_line as cli
from input_pipeline import hide_accelerators_from_tf
from input_pipeline.corpora import sources
from input_pipeline.pretraining import featurize, outputs, shards
from input_pipeline.tokenizers.factory import open_tokenizer, source_file
from input_pipeline.tokenizers.tokenizer_json import TOKENIZER_JSON
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer

log = logging.getLogger(__name__)
_EMPTY = None  # the marker every shard gets, so a shard without documents is still written
_COMPRESSION = {"none": CompressionTypes.UNCOMPRESSED, "gzip": CompressionTypes.GZIP}


class _WithTokenizer(beam.DoFn):
    """A DoFn that builds its tokenizer once per worker from the vocabulary file's text (one file: a
    WordPiece vocab.txt or a tokenizer.json, `build` checks)."""

    def __init__(self, job: shards.ShardingJob, vocab_text: str):
        self.job, self.vocab_text = job, vocab_text

    def setup(self):
        hide_accelerators_from_tf()
        self._dir = tempfile.mkdtemp(prefix="bert-jax-vocab-")
        path = os.path.join(self._dir, os.path.basename(self.job.vocab_file) or "vocab.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.vocab_text)
        self.tokenizer = open_tokenizer(path, self.job.lower_case)

    def teardown(self):
        shutil.rmtree(getattr(self, "_dir", ""), ignore_errors=True)


class ReadUnit(_WithTokenizer):
    """Stage 1: input file ``unit`` → ``(shard, (unit, j, encoded document))``; its counts (the
    local tool's per-file report) go to the ``counts`` output."""

    def process(self, unit: int):
        report, counts = sources.SourceReport(), collections.Counter()
        for j, shard, doc in shards.unit_documents(self.job, unit, self.tokenizer, report, counts):
            yield shard, (unit, j, featurize.encode_document(doc))
        yield beam.pvalue.TaggedOutput("counts", {"report": report, **counts})


class BuildShard(_WithTokenizer):
    """Stage 2: ``(shard, documents)`` → ``(shard, serialized examples)``; its counts go to the
    ``counts`` output. ``ready`` (a side input) is the step that checked the text and cleared the
    output: it makes every shard wait for it."""

    def process(self, element, ready):
        shard, grouped = element
        documents = [doc for _, _, data in sorted(g for g in grouped if g is not _EMPTY)
                     for doc in featurize.decode_documents(data)]
        settings, _ = self.job.settings.shard_output(self.job.output_dir, self.job.heldout_output, shard)
        feats, counts = shards.shard_examples(settings, shard, documents, self.tokenizer)
        yield shard, list(featurize.serialize_features(feats))
        yield beam.pvalue.TaggedOutput("counts", (shard, counts))


class TFRecordSink(fileio.FileSink):
    """One shard's serialized examples (a list, one element per file) as TFRecords, in order."""

    def __init__(self, compression: str):
        self.compression = compression

    def create_metadata(self, destination, full_file_name):
        return fileio.FileMetadata(mime_type="application/octet-stream",
                                   compression_type=_COMPRESSION[self.compression])

    def open(self, fh):
        self._fh = fh

    def write(self, element):
        for record in element[1]:
            _TFRecordUtil.write_record(self._fh, record)

    def flush(self):
        pass  # WriteToFiles closes the file next, which flushes it; Beam's gzip writer finishes its
        # stream on flush() and fails on the close() after it (filesystem.CompressedFile, Beam 2.77)


def _prepare(_, *, input_spec, output_dirs: tuple[str, ...], read: list[dict]) -> int:
    outputs.check_text(input_spec, read)  # before the output is touched
    for output_dir in output_dirs:
        outputs.prepare_output(output_dir)
    return 1


def _finish(_, *, output_dir: str, temp_dirs: tuple[str, ...], input_spec, job: shards.ShardingJob,
            vocab_size: int, read: list[dict], written: list, files: list, start: float, runner: str) -> None:
    s = job.settings
    if len(files) != s.num_shards + s.held_out:  # never expected: one file per shard, whatever the runner
        raise RuntimeError(f"{output_dir}: {len(files)} shard files written, expected {s.num_shards + s.held_out}")
    outputs.finish(output_dir, input_spec, s, read=read,
                   written=[counts for _, counts in sorted(written, key=lambda sc: sc[0])],
                   input_files=len(job.units), vocab_file=job.vocab_file, vocab_size=vocab_size,
                   lower_case=job.lower_case, seconds=time.time() - start, engine={"runner": runner},
                   heldout_output=job.heldout_output)
    for temp_dir in temp_dirs:
        if FileSystems.exists(temp_dir):
            FileSystems.delete([temp_dir])


def build(p: beam.Pipeline, input_spec, units: list[str], output_dir: str, tokenizer,
          s: shards.Settings, *, runner: str, heldout_output: str = "") -> None:
    """Adds the pipeline's transforms to ``p`` (see the module docstring)."""
    source = source_file(tokenizer)
    if not (isinstance(tokenizer, WordPieceTokenizer) or os.path.basename(source) == TOKENIZER_JSON):
        raise ValueError(f"--vocab {source}: a Beam pipeline ships one vocabulary file to its workers: a WordPiece "
                         f"vocab.txt or a {TOKENIZER_JSON} (or run without --runner)")
    job = shards.ShardingJob(s, tuple(units), output_dir, "", source, tokenizer.lower_case, heldout_output)
    with tf.io.gfile.GFile(source) as f:
        vocab_text = f.read()
    dirs = (output_dir, heldout_output) if s.held_out else (output_dir,)
    temp_dirs = tuple(FileSystems.join(d, f"{outputs.BEAM_TEMP}{uuid.uuid4().hex[:12]}") for d in dirs)
    name = os.path.basename

    read = (p | "inputs" >> beam.Create(range(len(units)))
              | "reshuffle inputs" >> beam.Reshuffle()  # one worker per file, not one for all
              | "read" >> beam.ParDo(ReadUnit(job, vocab_text)).with_outputs("counts", main="documents"))
    read_counts = beam.pvalue.AsList(read.counts)
    ready = (p | "start" >> beam.Create([None])
               | "check text, clear output" >> beam.Map(_prepare, input_spec=input_spec, output_dirs=dirs,
                                                         read=read_counts))
    markers = p | "every shard" >> beam.Create([(i, _EMPTY) for i in range(s.num_shards + s.held_out)])
    built = ((read.documents, markers)
             | "documents and markers" >> beam.Flatten()
             | "group by shard" >> beam.GroupByKey()
             | "build shards" >> beam.ParDo(BuildShard(job, vocab_text), ready=beam.pvalue.AsSingleton(ready))
             .with_outputs("counts", main="records"))
    # The training shards, then (heldout_every) the held-out ones, each set into its own directory.
    parts = built.records | "training or held out" >> beam.Partition(
        lambda element, n: int(element[0] >= s.num_shards), len(dirs))
    written = []
    for k, (directory, temp_dir) in enumerate(zip(dirs, temp_dirs, strict=True)):
        first = k * s.num_shards  # the first shard number of this directory
        settings = s if k == 0 else s.heldout_settings()
        written.append(parts[k] | f"write shards {k}" >> fileio.WriteToFiles(
            path=directory, temp_directory=StaticValueProvider(str, temp_dir),
            sink=lambda _: TFRecordSink(s.compression), destination=lambda element: element[0],
            file_naming=lambda window, pane, i, n, compression, shard, first=first, settings=settings, d=directory:
            name(settings.shard_path(d, shard - first))))
    files = written | "all shard files" >> beam.Flatten()
    _ = (p | "end" >> beam.Create([None])
           | "config.json, summary.json" >> beam.Map(
               _finish, output_dir=output_dir, temp_dirs=temp_dirs, input_spec=input_spec, job=job,
               vocab_size=tokenizer.vocab_size, read=read_counts, written=beam.pvalue.AsList(built.counts),
               files=beam.pvalue.AsList(files), start=time.time(), runner=runner))


class _QuietUserErrors(logging.Filter):
    """Drops Beam's traceback log of a user error (bad input: `cli.is_user_error`) that the
    pipeline re-raises anyway, so the command line shows its one line (``BERT_JAX_DEBUG=1`` keeps it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or cli.debug() or not cli.is_user_error(error)


def run(input_spec, output_dir: str, tokenizer, units: list[str], s: shards.Settings,
        pipeline_args: list[str], heldout_output: str = "") -> dict:
    """Runs the pipeline with Beam's options ``pipeline_args`` (``--runner=...`` among them) and
    waits for it; returns the summary it wrote."""
    options = PipelineOptions(pipeline_args)
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    log.info("create_pretraining_data on Beam's %s: %d input files -> %d shards in %s",
             runner, len(units), s.num_shards, output_dir)
    beam_log, quiet = logging.getLogger("apache_beam.runners.common"), _QuietUserErrors()
    beam_log.addFilter(quiet)
    try:
        with beam.Pipeline(options=options) as p:
            build(p, input_spec, units, output_dir, tokenizer, s, runner=runner, heldout_output=heldout_output)
    finally:
        beam_log.removeFilter(quiet)
    with tf.io.gfile.GFile(os.path.join(output_dir, "summary.json")) as f:
        return json.load(f)

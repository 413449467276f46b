r"""Raw text → pre-training TFRecord shards (Google create_pretraining_data.py's format).

    python -m input_pipeline.create_pretraining_data --input 'corpus/*.txt' --output data/p128 \
        --vocab vocab.txt --max_seq_length 128 --max_predictions_per_seq 20 --dupe_factor 10 \
        --objective nsp --num_shards 64 --num_workers 8

Two stages (`input_pipeline.pretraining.shards`), both spread over ``--num_workers`` processes:

1. per input file (a Wikipedia dump, a text file, or one TFDS spec): read documents (`sources`),
   tokenize them in batches in-graph, and route each document to an output shard: with at least as
   many files as shards, file ``i`` goes whole to shard ``i % num_shards``; with fewer, document
   ``j`` of file ``i`` goes to shard ``i + num_files * (j % k)`` (``k`` = shards fed by file ``i``).
   Tokenized documents are spilled to a local temporary directory.
2. per shard: its documents (in file order) → instances (`examples.create_instances`, seeded with
   ``(random_seed, shard)``) → static masks (``--masking static``: example ``k`` of shard ``s`` is
   masked with ``masking.example_seed(random_seed, s, k)``) → ``pretrain-SSSSS-of-NNNNN.tfrecord``,
   written under a temporary name and renamed when complete.

So the output depends on the input, the flags and ``num_shards``, never on ``num_workers``.

``--runner=DirectRunner|DataflowRunner|FlinkRunner|...`` runs the same two stages as an Apache Beam
pipeline instead (`input_pipeline.pretraining.beam_pipeline`; ``pip install 'bert-jax[beam]'``), for
corpora beyond one machine: the same shards, byte for byte, and flags this tool does not define are
Beam's pipeline options (``--project``, ``--region``, ``--temp_location``, ``--direct_num_workers``,
...); ``--num_workers`` then goes to Beam (Dataflow's initial worker count). docs/data.md has the
commands.
Deviations from Google's tool: instances are shuffled (and NotNext partners drawn) within a shard,
not across the whole input; masks come from per-example seeds, not the instance rng stream.
The end writes ``config.json`` (the settings, so a reader knows max_seq_length and P) and then
``summary.json`` (counts, skipped input, speed; `input_pipeline.pretraining.outputs`); a directory
without ``summary.json`` is incomplete, and training refuses it. Text of the wrong shape for the
examples asked for (a handful of long documents, a pair label far from half the examples, rows
mostly padding) is a warning in the log, the printed summary and ``summary.json``'s ``warnings``.
``--heldout_every N`` holds every N-th document out as a second set of shards (``--heldout_output``,
default ``OUTPUT-heldout``), for ``config.data.eval_input``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import multiprocessing
import os
import tempfile
import time

import tensorflow as tf
from absl import flags
from tqdm.auto import tqdm

from input_pipeline import command_line as cli
from input_pipeline import hide_accelerators_from_tf
from input_pipeline.corpora import sources
from input_pipeline.package_data import locate
from input_pipeline.pretraining import examples, outputs
from input_pipeline.pretraining.shards import (
    COMPRESSIONS,
    Settings,
    ShardingJob,
    in_worker,
    init_worker,
    read_unit,
    write_shard,
)
from input_pipeline.tokenizers.factory import open_tokenizer, source_file

log = logging.getLogger(__name__)


# --- running the two stages in-process or in a pool of spawned workers ------------------------

def _run_stage(stage, job, count, tokenizer, pool, queue, desc, unit, progress) -> list[dict]:
    bar = tqdm(total=count, desc=desc, unit=unit, disable=not progress, dynamic_ncols=True)
    documents = 0

    def notify(n):
        nonlocal documents
        documents += n
        if n:
            bar.set_postfix(documents=documents, refresh=False)
            bar.refresh()

    results = {}
    with bar:
        if pool is None:
            fn = read_unit if stage == "read" else write_shard
            for i in range(count):
                results[i] = fn(job, i, tokenizer, notify)
                bar.update(1)
        else:
            pending = pool.imap_unordered(in_worker, [(stage, job, i) for i in range(count)])
            while len(results) < count:
                try:
                    i, result = pending.next(timeout=0.25)
                    results[i] = result
                    bar.update(1)
                except multiprocessing.TimeoutError:
                    pass
                while not queue.empty():
                    notify(queue.get())
    return [results[i] for i in range(count)]


def heldout_directory(output_dir: str, heldout_output: str | None) -> str:
    """Where the held-out shards go: ``heldout_output``, by default ``<output_dir>-heldout``."""
    return heldout_output or output_dir.rstrip("/") + "-heldout"


def create_pretraining_data(input_spec, output_dir: str, tokenizer, *, num_workers: int = 1,
                            progress: bool = True, runner: str | None = None,
                            pipeline_args: tuple[str, ...] = (), heldout_output: str | None = None,
                            **settings) -> dict:
    """Writes ``output_dir/pretrain-*-of-*.tfrecord``, ``config.json`` and ``summary.json``;
    returns the summary. ``tokenizer``: a tokenizer (`input_pipeline.tokenizers.factory`: WordPiece,
    SentencePiece, byte-level BPE, a ``tokenizer.json``) or the path of its vocabulary; ``settings``:
    the fields of `Settings` (``max_seq_length``, ``dupe_factor``, ``objective``, ...).
    ``heldout_every`` N > 0 in ``settings``: every N-th document of each input (its 1st, (N+1)-th,
    ...) goes instead to held-out shards in ``heldout_output`` (default ``<output_dir>-heldout``),
    each document used once. Earlier ``pretrain-*`` files in the output directories are removed
    first; nothing is reused. ``runner`` (a Beam runner's name): run as a Beam pipeline with Beam's
    options ``pipeline_args`` (the same output; ``num_workers`` and ``progress`` are then the
    runner's business)."""
    s = Settings(**settings)
    s.check()
    heldout_output = heldout_directory(output_dir, heldout_output) if s.heldout_every else ""
    if heldout_output and heldout_output.rstrip("/") == output_dir.rstrip("/"):
        raise ValueError(f"--heldout_output {heldout_output}: the training shards' directory; expected another one")
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = open_tokenizer(tokenizer)
    tfds = isinstance(input_spec, str) and input_spec.strip().startswith("tfds:")
    units = [input_spec] if tfds else sources.list_files(input_spec)
    if tf.io.gfile.exists(output_dir) and not tf.io.gfile.isdir(output_dir):
        raise NotADirectoryError(errno.ENOTDIR, "is a file, expected a directory for the shards", output_dir)
    if runner:
        cli.require_extra("beam", "apache_beam", purpose="create_pretraining_data --runner")
        from input_pipeline.pretraining import beam_pipeline

        return beam_pipeline.run(input_spec, output_dir, tokenizer, units, s,
                                 [f"--runner={runner}", *pipeline_args], heldout_output=heldout_output)
    start = time.time()
    shards = s.num_shards + s.held_out
    workers = max(1, min(num_workers, max(len(units), shards)))
    with tempfile.TemporaryDirectory(prefix="pretrain-spill-") as spill_dir:
        job = ShardingJob(s, tuple(units), output_dir, spill_dir, source_file(tokenizer), tokenizer.lower_case,
                          heldout_output)
        pool = queue = None
        if workers > 1:
            ctx = multiprocessing.get_context("spawn")  # TF is not fork-safe
            queue = ctx.Queue()
            pool = ctx.Pool(workers, init_worker, (job.vocab_file, job.lower_case, queue))
        try:
            read = _run_stage("read", job, len(units), tokenizer, pool, queue, "reading",
                              "file", progress)
            outputs.check_text(input_spec, read)  # before the output is touched
            for directory in filter(None, (output_dir, heldout_output)):
                outputs.prepare_output(directory)
            written = _run_stage("write", job, shards, tokenizer, pool, queue, "writing", "shard", progress)
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    return outputs.finish(output_dir, input_spec, s, read=read, written=written, input_files=len(units),
                          vocab_file=source_file(tokenizer), vocab_size=tokenizer.vocab_size,
                          lower_case=tokenizer.lower_case, seconds=time.time() - start,
                          engine={"num_workers": workers}, heldout_output=heldout_output)


# --- command line ------------------------------------------------------------------------------

def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the command-line flags on `fv` (only when run as a program: no import-time flags)."""
    _D = Settings()
    flags.DEFINE_string("input", None, "Source spec: files/globs/dirs (comma-separated), a Wikipedia dump "
                        "(*.xml[.bz2]), tfds:NAME[:SPLIT] or pkg:wikipedia; see input_pipeline.corpora.sources.",
                        flag_values=fv)
    flags.DEFINE_string("output", None, "Output directory for the shards, config.json, summary.json.", flag_values=fv)
    flags.DEFINE_string("vocab", None, "The vocabulary: a WordPiece vocab.txt (or pkg:minilm/vocab.txt), a "
                        "SentencePiece .model, a byte-level BPE vocab.json + merges.txt, a tokenizer.json "
                        "(ModernBERT's), or a directory holding one.", flag_values=fv)
    flags.DEFINE_enum("lower_case", "auto", ["auto", "true", "false"],
                      "Lower-case input (auto: from the vocabulary; WordPiece only).", flag_values=fv)
    flags.DEFINE_integer("max_seq_length", _D.max_seq_length, "Examples are padded to this length.", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", _D.max_predictions_per_seq,
                         "Masked positions per example (P).", flag_values=fv)
    flags.DEFINE_float("masked_lm_prob", _D.masked_lm_prob, "Fraction of tokens to mask.", flag_values=fv)
    flags.DEFINE_integer("dupe_factor", _D.dupe_factor,
                         "Passes over the corpus (different instances and masks each).", flag_values=fv)
    flags.DEFINE_enum("objective", _D.objective, list(examples.OBJECTIVES),
                      "nsp (BERT), sop (ALBERT) or none (packed single segments, RoBERTa).", flag_values=fv)
    flags.DEFINE_enum("packing", _D.packing, list(examples.PACKINGS),
                      "With --objective none: full = FULL-SENTENCES, doc = DOC-SENTENCES.", flag_values=fv)
    flags.DEFINE_bool("whole_word_mask", _D.whole_word_mask, "Mask whole words.", flag_values=fv)
    flags.DEFINE_integer("ngram", _D.ngram, "N > 0: ALBERT's n-gram masking, spans of n <= N whole words with "
                         "p(n) proportional to 1/n (ALBERT: 3); 0: off.", lower_bound=0, flag_values=fv)
    flags.DEFINE_float("short_seq_prob", _D.short_seq_prob, "Probability of a shorter target length.", flag_values=fv)
    flags.DEFINE_integer("random_seed", _D.random_seed, "Seed for instances and masks.", flag_values=fv)
    flags.DEFINE_integer("num_shards", _D.num_shards, "Output files.", flag_values=fv)
    flags.DEFINE_integer("num_workers", 1, "Worker processes (the output does not depend on it); with --runner, "
                         "Beam's --num_workers (Dataflow's initial worker count).", flag_values=fv)
    flags.DEFINE_string("runner", None, "An Apache Beam runner (DirectRunner, PrismRunner, DataflowRunner, "
                        "FlinkRunner, SparkRunner, ...): run as a Beam pipeline, the same output; flags this tool "
                        "does not define are Beam's pipeline options. Default: the local process pool.",
                        flag_values=fv)
    flags.DEFINE_enum("masking", _D.masking, ["static", "none"],
                      "static: write masked examples; none: unmasked, for dynamic masking.", flag_values=fv)
    flags.DEFINE_enum("format", _D.format, list(sources.FORMATS), "Text file layout.", flag_values=fv)
    flags.DEFINE_enum("on_error", _D.on_error, ["skip", "raise"], "Bad input: skip (counted) or raise.", flag_values=fv)
    flags.DEFINE_enum("compression", _D.compression, list(COMPRESSIONS), "Shard compression.", flag_values=fv)
    flags.DEFINE_string("text_field", _D.text_field, "Text feature of a tfds: source.", flag_values=fv)
    flags.DEFINE_integer("max_documents_per_file", None, "Only the first N documents of each file.", flag_values=fv)
    flags.DEFINE_integer("heldout_every", _D.heldout_every, "N > 0: every N-th document of each input file (its "
                         "1st, (N+1)-th, ...) goes to held-out shards instead (--heldout_output), each used once "
                         "(dupe_factor 1); 0: none held out.", lower_bound=0, flag_values=fv)
    flags.DEFINE_string("heldout_output", None, "Directory of the held-out shards (default: OUTPUT-heldout).",
                        flag_values=fv)
    flags.DEFINE_integer("heldout_shards", _D.heldout_shards, "Held-out shard files (0: as many as --num_shards).",
                         lower_bound=0, flag_values=fv)
    flags.DEFINE_bool("progress", True, "Show progress bars.", flag_values=fv)
    flags.mark_flags_as_required(["input", "output", "vocab"], flag_values=fv)


BEAM_CHATTY_LOGGERS = ("apache_beam.runners.portability", "apache_beam.runners.worker", "apache_beam.typehints",
                       "apache_beam.io.gcp.bigquery")


def parse_flags(argv: list[str], fv: flags.FlagValues = flags.FLAGS) -> list[str]:
    """The tool's flags parsed into `fv`; with ``--runner``, the flags it does not define are Beam's
    pipeline options and come back after ``argv[0]`` (without it they are errors, as in any tool)."""
    cli.exit_if_help(argv)
    try:
        rest = fv(argv, known_only=True)
    except flags.Error as e:
        cli.fail(e)
    extra = rest[1:]
    if extra and not fv.runner:  # absl's own error names the flag and suggests the closest
        try:
            fv(argv)
        except flags.Error as e:
            cli.fail(f"{e} (or, if it is one of Beam's pipeline options: they need --runner)")
    if any(not a.startswith("--") for a in extra):
        cli.fail(f"unexpected arguments {[a for a in extra if not a.startswith('--')]} (flags are --name=value)")
    if fv.runner and fv["num_workers"].present:
        extra = [*extra, f"--num_workers={fv.num_workers}"]
    return [argv[0], *extra]


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> None:
    hide_accelerators_from_tf()
    logging.getLogger().setLevel(logging.INFO)
    for chatty in BEAM_CHATTY_LOGGERS if fv.runner else ():  # per-bundle and per-worker lines
        logging.getLogger(chatty).setLevel(logging.WARNING)
    F = fv
    lower = {"auto": None, "true": True, "false": False}[F.lower_case]
    tokenizer = open_tokenizer(locate(F.vocab), lower)  # pkg:... → a local path
    names = [f.name for f in dataclasses.fields(Settings)]
    summary = create_pretraining_data(locate(F.input), F.output, tokenizer, num_workers=F.num_workers,
                                      progress=F.progress, runner=F.runner, pipeline_args=tuple(argv[1:]),
                                      heldout_output=F.heldout_output, **{n: getattr(F, n) for n in names})
    keys = ("documents", "examples", "tokens", "masked_tokens", "padding_fraction", "skipped_input", "seconds",
            "examples_per_second", "tokens_per_second", "held_out", "warnings")
    print(json.dumps({k: summary[k] for k in keys if k in summary}, indent=1))


if __name__ == "__main__":
    define_flags()
    cli.run_absl(main, flags_parser=parse_flags)

"""Raw corpora → documents, where a document is a list of sentences (``str``).

Three kinds of source, chosen by the ``spec`` string:

* text files (local or ``gs://``, via `tf.io.gfile`): a path, a glob, a directory (its files) or a
  comma-separated list (or a Python list) of these. ``format="bert"``: one sentence per line, a
  blank line between documents (the original BERT format). ``format="doc_per_line"``: one
  document per line, split into sentences by `sentences.split_sentences`.
* Wikipedia XML dumps, recognised by name (``*.xml``, ``*.xml.bz2``, ``*.xml-p1p2.bz2``): streamed,
  redirects and non-article pages skipped, wikitext turned into prose (see `wikipedia`).
* ``"tfds:NAME[:SPLIT]"`` (split defaults to ``train``), e.g. ``tfds:wikipedia/20230601.en``: the
  ``text_field`` of each example is a document (split into sentences; line breaks are boundaries).

Bad input (unreadable files, invalid UTF-8, empty documents, lines over ``max_line_chars``, broken
XML) is counted in a `SourceReport` with the first offending ``file:line``, then skipped (and logged
once per reason) or, with ``on_error="raise"``, raised as `SourceError` naming the file and line.
A path or glob that matches nothing always raises.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import re
from collections.abc import Iterator, Sequence

import tensorflow as tf

from input_pipeline.corpora import wikipedia
from input_pipeline.corpora.sentences import split_sentences

log = logging.getLogger(__name__)

FORMATS = ("bert", "doc_per_line")
_CHUNK = 1 << 20
_GLOB_CHARS = re.compile(r"[*?\[]")


class SourceError(ValueError):
    """A source cannot be read as asked; the message names the file (and line) or the spec."""


@dataclasses.dataclass
class SourceReport:
    """What reading produced and what it skipped; pass one in to collect counts, then log it.

    ``skipped`` counts bad input by reason (``unreadable``, ``bad_utf8``, ``line_too_long``,
    ``empty_document``, ``bad_xml``, ``bad_wikitext``); ``filtered`` counts pages dropped on purpose
    (``redirect``, ``non_article``, ``short_article``). Counts accumulate over every pass.
    """

    files: int = 0  # files opened (a TFDS split counts as one)
    documents: int = 0
    sentences: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    filtered: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first_error: str | None = None  # "path:line: what was wrong", for the first bad input seen

    def as_dict(self) -> dict:
        """Plain dict (JSON-ready): the counters become dicts."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return fields | {"skipped": dict(self.skipped), "filtered": dict(self.filtered)}

    def summary(self) -> str:
        text = f"{self.files} files, {self.documents} documents, {self.sentences} sentences"
        if self.filtered:
            text += "; filtered " + ", ".join(f"{k}={v}" for k, v in sorted(self.filtered.items()))
        if self.skipped:
            text += "; skipped " + ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items()))
            text += f" (first: {self.first_error})"
        return text


def _bad(report: SourceReport, on_error: str, reason: str, location: str, message: str) -> None:
    """Counts one piece of bad input; raises `SourceError` if ``on_error == "raise"``."""
    report.skipped[reason] += 1
    where = f"{location}: {message}"
    if report.first_error is None:
        report.first_error = where
    if on_error == "raise":
        raise SourceError(where)
    if report.skipped[reason] == 1:
        log.warning("skipping bad input (%s): %s", reason, where)


def _is_tfds(spec: str | Sequence[str]) -> bool:
    return isinstance(spec, str) and spec.strip().startswith("tfds:")


def list_files(spec: str | Sequence[str]) -> list[str]:
    """The files a spec (or a list of paths/globs) names, in the order the parts are given: a glob's
    or a directory's files sorted by name, a file named twice kept where it first appears. Raises
    `SourceError` for a part that matches nothing. The order is the spec's, never where the files
    lie, so that the same files under another directory (a workdir, a cache) give the same documents
    in the same order, and the same held-out split.

    Per-host sharding: ``read_documents(list_files(spec)[process_index::process_count])``.
    """
    if _is_tfds(spec):
        raise SourceError(f"{spec!r} is a TFDS dataset, not files (shard it with split slicing)")
    parts = [p.strip() for p in (spec.split(",") if isinstance(spec, str) else spec) if p.strip()]
    if not parts:
        raise SourceError(f"empty source spec {spec!r}")
    files = {}  # path: None, in first-seen order
    for part in parts:
        try:
            pattern = part.rstrip("/") + "/*" if tf.io.gfile.isdir(part) else part
            if _GLOB_CHARS.search(pattern):
                found = [f for f in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(f)]
            else:
                found = [part] if tf.io.gfile.exists(part) else []
        except tf.errors.OpError as e:
            raise SourceError(f"{part}: cannot list: {e.message}") from e
        if not found:
            raise SourceError(f"{part}: no such file (or the glob/directory matches no files)")
        files.update(dict.fromkeys(sorted(found)))
    return list(files)


def _iter_lines(f, max_bytes: int) -> Iterator[bytes | None]:
    """Lines of a binary file, no ``\\n``; None for a line over ``max_bytes`` (never held whole)."""
    buf, too_long = b"", False
    while chunk := f.read(_CHUNK):
        *complete, last = chunk.split(b"\n")
        for part in complete:
            yield None if too_long or len(buf) + len(part) > max_bytes else buf + part
            buf, too_long = b"", False
        if too_long or len(buf) + len(last) > max_bytes:
            buf, too_long = b"", True
        else:
            buf += last
    if buf or too_long:
        yield None if too_long else buf


def _read_text_file(path, fmt, on_error, max_line_chars, report) -> Iterator[list[str]]:
    doc: list[str] = []
    lineno = 0
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            for lineno, raw in enumerate(_iter_lines(f, 4 * max_line_chars), 1):
                where = f"{path}:{lineno}"
                try:
                    line = raw.decode("utf-8").removeprefix("\ufeff") if raw is not None else None
                except UnicodeDecodeError as e:
                    _bad(report, on_error, "bad_utf8", where, f"not valid UTF-8 ({e})")
                    continue
                if line is None or len(line) > max_line_chars:
                    _bad(report, on_error, "line_too_long", where, f"line over {max_line_chars=}")
                    continue
                line = line.strip()
                if fmt == "doc_per_line":
                    if not line:
                        _bad(report, on_error, "empty_document", where, "empty document")
                    elif sentences := split_sentences(line):
                        yield sentences
                elif line:
                    doc.append(line)
                elif doc:
                    yield doc
                    doc = []
    except (OSError, tf.errors.OpError) as e:
        message = f"cannot read: {getattr(e, 'message', None) or e}"
        _bad(report, on_error, "unreadable", f"{path}:{lineno}" if lineno else path, message)
        return
    if doc:
        yield doc



def _open_tfds(spec: str, text_field: str, data_dir: str | None) -> tuple[str, tf.data.Dataset]:
    """``tfds:NAME[:VERSION][:SPLIT]`` → (location prefix, dataset of the text field's bytes)."""
    import tensorflow_datasets as tfds  # slow to import; only for TFDS specs

    name, split = spec.strip()[len("tfds:") :], "train"
    if ":" in name and not re.fullmatch(r"[\d.*]+", name.rsplit(":", 1)[1]):  # not a version
        name, split = name.rsplit(":", 1)
    base = name.split("/")[0].split(":")[0]
    if base not in tfds.list_builders(with_community_datasets=False):
        raise SourceError(f"{spec!r}: no TFDS dataset named {base!r} (expected tfds:NAME[:SPLIT])")
    try:
        ds = tfds.load(name, split=split, shuffle_files=False, download=False, data_dir=data_dir)
    except Exception as e:  # DatasetNotFoundError, unknown split or config, ...
        raise SourceError(f"{spec!r}: cannot load TFDS {name} split {split!r} ({e}); prepare "
                          f"it first, e.g. `tfds build {name}`") from e
    fields = ds.element_spec if isinstance(ds.element_spec, dict) else {}
    if text_field not in fields:
        raise SourceError(f"{spec!r}: no text field {text_field!r} (fields: {sorted(fields)})")
    return f"tfds:{name}:{split}", ds.map(lambda ex: ex[text_field])


def _read_tfds(prefix, texts, on_error, max_line_chars, report) -> Iterator[list[str]]:
    report.files += 1
    try:
        yield from _tfds_docs(prefix, texts, on_error, max_line_chars, report)
    except tf.errors.OpError as e:  # a corrupt or unreadable record file
        _bad(report, on_error, "unreadable", prefix, f"cannot read: {e.message}")


def _tfds_docs(prefix, texts, on_error, max_line_chars, report) -> Iterator[list[str]]:
    for i, raw in enumerate(texts.as_numpy_iterator()):
        where = f"{prefix}#{i}"
        try:
            lines = raw.decode("utf-8").splitlines()
        except UnicodeDecodeError as e:
            _bad(report, on_error, "bad_utf8", where, f"not valid UTF-8 ({e})")
            continue
        if any(len(line) > max_line_chars for line in lines):
            _bad(report, on_error, "line_too_long", where, f"line over {max_line_chars=}")
            lines = [line for line in lines if len(line) <= max_line_chars]
        if sentences := [s for line in lines for s in split_sentences(line)]:
            yield sentences
        else:
            _bad(report, on_error, "empty_document", where, "empty text")


def read_documents(spec: str | Sequence[str], *, format: str = "bert", text_field: str = "text",
                   on_error: str = "skip", max_line_chars: int = 100_000,
                   report: SourceReport | None = None,
                   tfds_data_dir: str | None = None) -> Iterator[list[str]]:
    """Documents (non-empty lists of sentences) from ``spec``; see the module docstring.

    The spec is checked at the call (`SourceError` if it names nothing), documents are read lazily,
    files in `list_files` order; ``report`` (optional) is updated as they are. With
    ``on_error="raise"`` bad input raises `SourceError` while iterating.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if on_error not in ("skip", "raise") or max_line_chars < 1:
        raise ValueError(f"need on_error 'skip' or 'raise' and max_line_chars >= 1, got "
                         f"{on_error!r}, {max_line_chars}")
    report = report if report is not None else SourceReport()
    if _is_tfds(spec):
        docs = _read_tfds(*_open_tfds(spec, text_field, tfds_data_dir), on_error, max_line_chars,
                          report)
    else:
        docs = _read_files(list_files(spec), format, on_error, max_line_chars, report)
    return _counted(spec, docs, report)


def _counted(spec, docs, report) -> Iterator[list[str]]:
    for doc in docs:
        report.documents += 1
        report.sentences += len(doc)
        yield doc
    if report.skipped:
        log.warning("%s: %s", spec, report.summary())


def _read_files(files, fmt, on_error, max_line_chars, report) -> Iterator[list[str]]:
    for path in files:
        report.files += 1
        if wikipedia.is_dump_name(path):
            bad = functools.partial(_bad, report, on_error)
            yield from wikipedia.read_dump(path, bad=bad, filtered=report.filtered,
                                           split=split_sentences, max_line_chars=max_line_chars)
        else:
            yield from _read_text_file(path, fmt, on_error, max_line_chars, report)


def documents_dataset(spec: str | Sequence[str], **kw) -> tf.data.Dataset:
    """`read_documents` as a dataset of 1-D ``tf.string`` tensors (one document = its sentences).

    The spec is checked now (`SourceError` here, not inside TF). A fatal error met while iterating
    (``on_error="raise"``) surfaces as a `tf.errors.InvalidArgumentError` whose message holds
    ``SourceError: file:line: ...``. Each pass over the dataset reads the source again.
    """
    read_documents(spec, **kw)  # validates arguments and spec; reads nothing yet
    return tf.data.Dataset.from_generator(
        lambda: read_documents(spec, **kw),
        output_signature=tf.TensorSpec(shape=[None], dtype=tf.string),
    )

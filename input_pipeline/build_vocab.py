"""Trains a BERT vocabulary from a corpus: WordPiece (vocab.txt) or SentencePiece unigram/BPE.

    python -m input_pipeline.build_vocab --input 'corpus/*.txt' --output_dir vocab/ \\
        --model_type wordpiece --vocab_size 30522 [--nolower_case] [--max_sentences 1000000]

Text comes through `sources.read_documents`, so text files (``--format bert|doc_per_line``),
Wikipedia XML dumps and ``tfds:`` datasets all work; ``--max_sentences`` keeps the first N sentences.

* ``wordpiece`` → ``DIR/vocab.txt``: ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (ids 0-4), every character
  (alone and as ``##c``), then the learned pieces by frequency: words split and counted as
  `WordPieceTokenizer` splits them, learned by tensorflow-text's WordPiece learner with a faster
  threshold search (`input_pipeline.tokenizers.wordpiece_learner`).
* ``unigram`` / ``bpe`` → ``DIR/spm.model`` (trained by the ``sentencepiece`` package: ``[PAD]`` id 0
  and ``[UNK]`` id 1 as its pad/unknown pieces, ``[CLS] [SEP] [MASK]`` as control symbols 2-4; no
  BOS/EOS; case folding with ``nmt_nfkc_cf`` when lower-casing) and ``DIR/vocab.txt`` listing its
  pieces in id order. Over ``input_sentence_size`` sentences, a uniform sample is used. The same
  input and ``num_threads`` give the same model (unigram pieces depend on the thread count, so it
  is fixed at 16, SentencePiece's default, not taken from the machine).

Files are written atomically. Load the result with `tokenizer_factory.load_tokenizer(DIR)`.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from input_pipeline.corpora import sources
from input_pipeline.files import write_atomically
from input_pipeline.tokenizers import wordpiece_learner
from input_pipeline.tokenizers.vocab import SPECIAL_TOKENS, infer_lower_case

log = logging.getLogger(__name__)
MODEL_TYPES = ("wordpiece", "unigram", "bpe")
SPM_MODEL, VOCAB_TXT = "spm.model", "vocab.txt"
UNK_SAMPLE = 20_000  # sentences tokenised afterwards to measure the [UNK] rate


@dataclasses.dataclass(frozen=True)
class VocabSummary:
    path: Path  # vocab.txt (wordpiece) or spm.model
    model_type: str
    sentences: int  # sentences the vocabulary was learned from
    vocab_size: int
    unk_rate: float  # share of [UNK] among the tokens of the first UNK_SAMPLE sentences
    seconds: float

    def __str__(self) -> str:
        return (f"{self.model_type} vocabulary of {self.vocab_size} tokens from {self.sentences} "
                f"sentences in {self.seconds:.1f}s; [UNK] rate {self.unk_rate:.4%} -> {self.path}")


def build_vocab(input_spec, output_dir: str | os.PathLike, *, model_type: str, vocab_size: int,
                lower_case: bool = True, max_sentences: int | None = None, **kw) -> Path:
    """Trains a vocabulary (see the module docstring) and returns the file to load: ``vocab.txt``
    for WordPiece, ``spm.model`` for SentencePiece. Keywords as `train_vocab`."""
    return train_vocab(input_spec, output_dir, model_type=model_type, vocab_size=vocab_size,
                       lower_case=lower_case, max_sentences=max_sentences, **kw).path


def train_vocab(input_spec, output_dir: str | os.PathLike, *, model_type: str, vocab_size: int,
                lower_case: bool = True, max_sentences: int | None = None, format: str = "bert",
                text_field: str = "text", seed: int = 0, character_coverage: float = 0.9995,
                input_sentence_size: int = 2_000_000, num_threads: int = 16) -> VocabSummary:
    """`build_vocab` with a `VocabSummary` (sentences read, size, [UNK] rate, time) as the result."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be above {len(SPECIAL_TOKENS)}, got {vocab_size}")
    if max_sentences is not None and max_sentences < 1:
        raise ValueError(f"max_sentences must be >= 1 or None, got {max_sentences}")
    start = time.perf_counter()
    report = sources.SourceReport()
    docs = sources.read_documents(input_spec, format=format, text_field=text_field, report=report)
    sentences = _Sentences(docs, max_sentences, origin=input_spec)
    out = Path(output_dir)  # made only once the vocabulary is learned: bad input leaves nothing behind
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file, expected a directory for the vocabulary", str(out))
    if model_type == "wordpiece":
        path = _build_wordpiece(sentences, out, vocab_size, lower_case)
    else:
        path = _build_sentencepiece(sentences, out, model_type, vocab_size, lower_case, seed,
                                           character_coverage, input_sentence_size, num_threads)
    log.info("read %s", report.summary())
    from input_pipeline.tokenizers.factory import load_tokenizer  # imports TF text ops

    tokenizer = load_tokenizer(out)
    summary = VocabSummary(path, model_type, sentences.count, tokenizer.vocab_size,
                           _unk_rate(tokenizer, sentences.sample), time.perf_counter() - start)
    log.info("%s", summary)
    return summary


class _Sentences:
    """The documents' sentences (the first ``limit``) with a progress bar; counts them and keeps the
    first `UNK_SAMPLE` to measure the [UNK] rate afterwards. Iterate once."""

    def __init__(self, docs, limit: int | None, origin=""):
        self.docs, self.limit, self.count, self.sample = docs, limit, 0, []
        self.origin = origin if isinstance(origin, str) else ",".join(map(str, origin))  # for messages

    def __iter__(self) -> Iterator[str]:
        with tqdm(desc="reading sentences", unit=" sent", total=self.limit, mininterval=2) as bar:
            for doc in self.docs:
                for sentence in doc:
                    if len(self.sample) < UNK_SAMPLE:
                        self.sample.append(sentence)
                    self.count += 1
                    bar.update()
                    yield sentence
                    if self.count == self.limit:
                        return


def _vocab_bytes(tokens: list[str], origin: str) -> bytes:
    bad = next((t for t in tokens if not t or "\n" in t or "\r" in t), None)
    if bad is not None:
        raise ValueError(f"{origin}: piece {bad!r} cannot be written as a line of vocab.txt")
    return "".join(t + "\n" for t in tokens).encode("utf-8")


# --------------------------------------------------------------------------- WordPiece


def _build_wordpiece(sentences: _Sentences, out: Path, vocab_size: int, lower_case: bool) -> Path:
    word_counts = wordpiece_learner.count_words(sentences, lower_case)
    if not word_counts:
        raise ValueError(f"{sentences.origin}: no words in the input ({sentences.count} sentences)")
    log.info("%d sentences, %d words, %d distinct", sentences.count, sum(word_counts.values()),
             len(word_counts))
    vocab = wordpiece_learner.learn(word_counts, vocab_size)
    if not lower_case and infer_lower_case(vocab):
        log.warning("the cased vocabulary has no upper-case token, so WordPieceTokenizer will "
                    "treat it as uncased (lower-case its input)")
    path = out / VOCAB_TXT
    write_atomically(path, _vocab_bytes(vocab, "wordpiece learner"))
    stale = out / SPM_MODEL
    if stale.exists():  # from an earlier SentencePiece build: load_tokenizer(out) would pick it
        log.warning("removing %s from an earlier SentencePiece build", stale)
        stale.unlink()
    return path


# --------------------------------------------------------------------------- SentencePiece


def _build_sentencepiece(sentences: _Sentences, out: Path, model_type: str, vocab_size: int,
                         lower_case: bool, seed: int, character_coverage: float,
                         input_sentence_size: int, num_threads: int) -> Path:
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    log.info("training a SentencePiece %s model of %d pieces", model_type, vocab_size)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, model_type=model_type,
            vocab_size=vocab_size, character_coverage=character_coverage,
            normalization_rule_name="nmt_nfkc_cf" if lower_case else "nmt_nfkc",
            pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
            control_symbols=["[CLS]", "[SEP]", "[MASK]"],
            input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
            max_sentence_length=16384, num_threads=num_threads, minloglevel=1)
    except RuntimeError as e:
        raise ValueError(f"SentencePiece training failed ({sentences.count} sentences, vocab_size "
                         f"{vocab_size}): {e}") from e
    data = model.getvalue()
    processor = spm.SentencePieceProcessor(model_proto=data)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = _vocab_bytes(pieces, "SentencePiece model")
    path = out / SPM_MODEL
    write_atomically(path, data)
    write_atomically(out / VOCAB_TXT, vocab)
    return path


def _unk_rate(tokenizer, sample: list[str]) -> float:
    import tensorflow as tf

    total = unk = 0
    for i in range(0, len(sample), 1024):
        ids = tokenizer.tokenize(tf.constant(sample[i : i + 1024])).flat_values
        total += int(tf.size(ids))
        unk += int(tf.reduce_sum(tf.cast(ids == tokenizer.unk_id, tf.int32)))
    return unk / max(total, 1)


# --------------------------------------------------------------------------- CLI


def main(argv, fv=None) -> None:
    from absl import flags

    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {argv[1:]} (flags are --name=value)")
    f = flags.FLAGS if fv is None else fv
    from input_pipeline import hide_accelerators_from_tf
    from input_pipeline.package_data import locate

    hide_accelerators_from_tf()
    summary = train_vocab(locate(f.input), f.output_dir, model_type=f.model_type, vocab_size=f.vocab_size,
                          lower_case=f.lower_case, max_sentences=f.max_sentences, format=f.format,
                          seed=f.seed, character_coverage=f.character_coverage)
    print(summary)


def define_flags(fv=None) -> None:
    """Defines the command-line flags on `fv` (default: absl's global set; only when run as a program)."""
    from absl import flags

    kw = {"flag_values": flags.FLAGS if fv is None else fv}
    flags.DEFINE_string("input", None, "Corpus spec: files/globs/dirs, a Wikipedia dump, tfds:NAME.", **kw)
    flags.DEFINE_string("output_dir", None, "Where vocab.txt (and spm.model) go.", **kw)
    flags.DEFINE_enum("model_type", "wordpiece", MODEL_TYPES, "Vocabulary kind.", **kw)
    flags.DEFINE_integer("vocab_size", 30522, "Target vocabulary size (WordPiece: at most).", **kw)
    flags.DEFINE_boolean("lower_case", True, "Uncased vocabulary (lower-case, strip accents).", **kw)
    flags.DEFINE_integer("max_sentences", None, "Use only the first N sentences.", **kw)
    flags.DEFINE_enum("format", "bert", sources.FORMATS, "Text file layout.", **kw)
    flags.DEFINE_integer("seed", 0, "SentencePiece random seed.", **kw)
    flags.DEFINE_float("character_coverage", 0.9995, "SentencePiece character coverage.", **kw)
    flags.mark_flags_as_required(["input", "output_dir"], **kw)


if __name__ == "__main__":
    from input_pipeline import command_line as cli

    define_flags()
    cli.run_absl(main)

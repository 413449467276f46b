"""Documents → fixed-length pre-training examples, and their TFRecord format.

* `tokenize_documents`: documents (lists of sentence strings) → lists of sentences of WordPiece
  ids, streamed through a tf.data pipeline that tokenizes batches of sentences in-graph.
* `build_examples`: tokenized documents → padded numpy feature arrays (NSP, SOP or packed; the
  construction itself is in `input_pipeline.pretraining.examples`).
* `mask_features`: static masking of those arrays with per-example seeds (`masking.mask_dataset`).
* `serialize_example` / `feature_spec` / `parse_examples`: ``tf.train.Example`` records with the
  feature names, types and shapes Google's create_pretraining_data.py writes, so either tool's
  files read the same. Unmasked records (for dynamic masking later) have ``input_ids``,
  ``input_mask``, ``segment_ids`` (int64 [L]) and ``next_sentence_labels`` (int64 [1]); masked ones
  add ``masked_lm_positions``, ``masked_lm_ids`` (int64 [P]) and ``masked_lm_weights`` (float [P]).
"""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Iterable, Iterator

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2

from input_pipeline.pretraining import examples, masking
from input_pipeline.pretraining.batch import FLOAT_KEYS, MASKED_KEYS


def tokenize_documents(documents: Iterable[list[str]], tokenizer, *, batch_size: int = 1024,
                       num_parallel_calls: int | None = tf.data.AUTOTUNE
                       ) -> Iterator[list[list[int]]]:
    """One list of tokenized sentences per input document, in order (sentences that tokenize to
    nothing are dropped, so a document may come out empty).

    Sentences go through ``tokenizer.tokenize`` ``batch_size`` at a time inside a tf.data map
    (parallel, deterministic); the documents are read on tf.data's generator thread meanwhile.
    An exception raised by ``documents`` (e.g. `sources.SourceError`) is re-raised here as itself.
    """
    state = {"documents": 0, "error": None}

    def batches():
        texts, doc_ids = [], []
        try:
            for index, doc in enumerate(documents):
                state["documents"] = index + 1
                texts.extend(s.encode("utf-8") for s in doc)
                doc_ids.extend([index] * len(doc))
                if len(texts) >= batch_size:
                    yield np.array(texts, dtype=object), np.array(doc_ids, dtype=np.int64)
                    texts, doc_ids = [], []
        except Exception as e:  # noqa: BLE001 - handed over to the consumer below
            state["error"] = e
        if texts:
            yield np.array(texts, dtype=object), np.array(doc_ids, dtype=np.int64)

    def tokenize(texts, doc_ids):
        ids = tokenizer.tokenize(texts)
        return ids.flat_values, ids.row_lengths(), doc_ids

    ds = tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int64)))
    ds = ds.map(tokenize, num_parallel_calls=num_parallel_calls, deterministic=True).prefetch(2)
    current, sentences = 0, []
    for flat, lengths, doc_ids in ds.as_numpy_iterator():
        flat = flat.tolist()
        ends = np.cumsum(lengths).tolist()
        start = 0
        for end, doc in zip(ends, doc_ids.tolist(), strict=True):
            while doc > current:
                yield sentences
                current, sentences = current + 1, []
            if end > start:
                sentences.append(flat[start:end])
            start = end
    if state["error"] is not None:
        raise state["error"]
    while current < state["documents"]:
        yield sentences
        current, sentences = current + 1, []


def instances_to_features(instances: list[examples.Instance], max_seq_length: int) -> dict:
    """Pads instances to ``max_seq_length``: int32 [N, L] ids/mask/segments, int32 [N] labels."""
    n = len(instances)
    ids = np.zeros([n, max_seq_length], np.int32)
    segments = np.zeros([n, max_seq_length], np.int32)
    lengths = np.zeros([n], np.int32)
    for row, inst in enumerate(instances):
        if len(inst.tokens) > max_seq_length:
            raise ValueError(f"instance of {len(inst.tokens)} tokens > {max_seq_length=}")
        ids[row, : len(inst.tokens)] = inst.tokens
        segments[row, : len(inst.tokens)] = inst.segment_ids
        lengths[row] = len(inst.tokens)
    mask = (np.arange(max_seq_length)[None, :] < lengths[:, None]).astype(np.int32)
    labels = np.array([inst.label for inst in instances], np.int32)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments,
            "next_sentence_labels": labels}


def build_examples(documents, tokenizer, *, objective: str = "nsp", packing: str = "full",
                   max_seq_length: int = 128, short_seq_prob: float = 0.1, dupe_factor: int = 1,
                   seed: int | random.Random = 12345) -> dict:
    """Tokenized documents → padded feature arrays (`instances_to_features`) for every instance of
    `examples.create_instances` (``dupe_factor`` passes, shuffled). ``seed``: an int or an rng."""
    rng = seed if isinstance(seed, random.Random) else random.Random(seed)
    instances = examples.create_instances(
        documents, objective=objective, packing=packing, max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob, dupe_factor=dupe_factor, rng=rng,
        cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id)
    return instances_to_features(instances, max_seq_length)


def masking_config(tokenizer, *, masked_lm_prob: float = 0.15, max_predictions_per_seq: int = 20,
                   whole_word: bool = False, ngram: int = 0) -> masking.MaskingConfig:
    """The `masking.MaskingConfig` for ``tokenizer``'s vocabulary, special ids and [MASK]."""
    return masking.MaskingConfig(
        vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id,
        special_ids=tuple(sorted(tokenizer.special_ids)), masked_lm_prob=masked_lm_prob,
        max_predictions_per_seq=max_predictions_per_seq, whole_word=whole_word, ngram=ngram)


def mask_features(features: dict, tokenizer, cfg: masking.MaskingConfig, *, seed: int,
                  stream: int = 0, batch_size: int = 512) -> dict:
    """Static masking of [N, L] arrays: row k is ``masking.mask_example(row k,
    example_seed(seed, stream, k))``, i.e. exactly what `masking.mask_dataset` gives element k with
    ``epoch=stream``. One traced function per (tokenizer, cfg, L), reused across calls (a fresh
    `mask_dataset` per shard would trace again). Returns numpy arrays (int32/float32)."""
    n, length = np.shape(features["input_ids"])
    seeds = masking.example_seed(seed, stream, np.arange(n)).numpy()
    fn = _masker(tokenizer, cfg, length)
    out = {k: [] for k in ("input_ids", *MASKED_KEYS)}
    for i in range(0, n, batch_size):
        part = fn(features["input_ids"][i : i + batch_size], features["input_mask"][i : i + batch_size],
                  seeds[i : i + batch_size])
        for k in out:
            out[k].append(part[k].numpy())
    p = cfg.max_predictions_per_seq
    empty = {"input_ids": np.zeros([0, length], np.int32)}
    empty |= {k: np.zeros([0, p], np.float32 if k in FLOAT_KEYS else np.int32) for k in MASKED_KEYS}
    return dict(features) | {k: np.concatenate(v) if v else empty[k] for k, v in out.items()}


@functools.lru_cache(maxsize=8)
def _masker(tokenizer, cfg: masking.MaskingConfig, length: int):
    spec = [tf.TensorSpec([None, length], tf.int32)] * 2 + [tf.TensorSpec([None, 2], tf.int64)]

    @tf.function(input_signature=spec)
    def fn(ids, mask, seeds):
        cont = tokenizer.is_continuation(ids) if cfg.word_level else None
        return masking.mask_example({"input_ids": ids, "input_mask": mask}, seeds, cfg, cont)

    return fn


def _is_float(key: str, values: np.ndarray) -> bool:
    return key in FLOAT_KEYS or values.dtype.kind == "f"


def _example_bytes(items) -> bytes:
    ex = example_pb2.Example()
    fmap = ex.features.feature
    for key, values, is_float in items:
        (fmap[key].float_list if is_float else fmap[key].int64_list).value.extend(values)
    return ex.SerializeToString(deterministic=True)


def serialize_example(features: dict) -> bytes:
    """One example (a dict of 1-D sequences or arrays; scalars allowed) → ``tf.train.Example``
    bytes. ``masked_lm_weights`` (and any float array) becomes a float_list, the rest int64_list.
    Deterministic: features in sorted name order."""
    arrays = {k: np.asarray(v).reshape(-1) for k, v in features.items()}
    return _example_bytes((k, arrays[k].tolist(), _is_float(k, arrays[k])) for k in sorted(arrays))


def serialize_features(features: dict) -> Iterator[bytes]:
    """`serialize_example` of each row of batched [N, ...] arrays (labels [N] → [1] each)."""
    arrays = {k: np.asarray(v) for k, v in features.items()}
    keys = sorted(arrays)
    floats = [_is_float(k, arrays[k]) for k in keys]
    rows = [[r if isinstance(r, list) else [r] for r in arrays[k].tolist()] for k in keys]
    for row in zip(*rows, strict=True):
        yield _example_bytes(zip(keys, row, floats, strict=True))


def write_records(path: str, records: Iterable[bytes], compression: str | None = None) -> int:
    """Writes a TFRecord file under a temporary name and renames it when complete (the temporary
    file is removed on failure), so ``path`` is never half-written. Returns the record count."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    count = 0
    try:
        with tf.io.TFRecordWriter(tmp, options=compression) as writer:
            for count, record in enumerate(records, 1):  # noqa: B007
                writer.write(record)
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise
    return count


def encode_document(document: list[list[int]]) -> bytes:
    """A tokenized document as int32 bytes ``[n, len_1..len_n, tokens...]`` (spill files, Beam)."""
    lengths = [len(sentence) for sentence in document]
    tokens = [t for sentence in document for t in sentence]
    return np.array([len(document), *lengths, *tokens], np.int32).tobytes()


def decode_documents(data: bytes) -> Iterator[list[list[int]]]:
    """The documents of concatenated `encode_document` bytes, in order."""
    values = np.frombuffer(data, np.int32).tolist()
    pos = 0
    while pos < len(values):
        n = values[pos]
        lengths = values[pos + 1 : pos + 1 + n]
        pos += 1 + n
        doc = []
        for length in lengths:
            doc.append(values[pos : pos + length])
            pos += length
        yield doc


def spill_document(f, document: list[list[int]]) -> None:
    """Appends a tokenized document to a binary file (`encode_document`)."""
    f.write(encode_document(document))


def read_spilled(paths: Iterable[str]) -> list[list[list[int]]]:
    """The documents `spill_document` wrote to ``paths``, in order."""
    documents = []
    for path in paths:
        with open(path, "rb") as f:
            documents.extend(decode_documents(f.read()))
    return documents


def feature_spec(max_seq_length: int, max_predictions_per_seq: int | None = None) -> dict:
    """`tf.io.parse_example` spec; masked-LM features only when ``max_predictions_per_seq``."""
    seq = tf.io.FixedLenFeature([max_seq_length], tf.int64)
    spec = {"input_ids": seq, "input_mask": seq, "segment_ids": seq,
            "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64)}
    if max_predictions_per_seq:
        pred = [max_predictions_per_seq]
        spec |= {"masked_lm_positions": tf.io.FixedLenFeature(pred, tf.int64),
                 "masked_lm_ids": tf.io.FixedLenFeature(pred, tf.int64),
                 "masked_lm_weights": tf.io.FixedLenFeature(pred, tf.float32)}
    return spec


def parse_examples(serialized, max_seq_length: int,
                   max_predictions_per_seq: int | None = None) -> dict:
    """Serialized examples ([B] or a scalar) → the batch layout of `input_pipeline.pretraining.batch`: int32
    (float32 weights) [B, L] / [B, P], ``next_sentence_labels`` [B] (a scalar for a single example).
    Works eagerly and in ``tf.data.Dataset.map`` (after ``.batch`` for speed)."""
    serialized = tf.convert_to_tensor(serialized, tf.string)
    spec = feature_spec(max_seq_length, max_predictions_per_seq)
    if serialized.shape.rank == 0:
        parsed = tf.io.parse_single_example(serialized, spec)
    else:
        parsed = tf.io.parse_example(serialized, spec)
    out = {k: v if v.dtype == tf.float32 else tf.cast(v, tf.int32) for k, v in parsed.items()}
    out["next_sentence_labels"] = out["next_sentence_labels"][..., 0]
    return out

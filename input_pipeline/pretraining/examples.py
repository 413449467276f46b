"""Tokenized documents → pre-training instances (token ids with [CLS]/[SEP], segment ids, label).

Pure Python over lists of token ids and one ``random.Random``: no TensorFlow here. A document is a
list of sentences, a sentence a non-empty list of token ids.

* ``objective="nsp"``: `instances_from_document` is Google's ``create_instances_from_document``
  (bert/create_pretraining_data.py) line for line, with the same calls on the same ``rng`` in the
  same order, so for the same documents and ``random.Random`` state it builds the same pairs. It
  only leaves out the masking the original does inside it with the same ``rng`` (masking happens
  later, with per-example seeds: see `masking.py`); so from the second instance on the random
  streams differ from a run of the original, not the algorithm.
* ``objective="sop"`` (ALBERT's sentence-order prediction): the same chunking, but B is always the
  true continuation; with probability 0.5 A and B are swapped and the label is 1. Deviation from
  ALBERT's create_pretraining_data.py: a chunk of one sentence is not paired with a random other
  document (ALBERT does that, an NSP negative inside SOP data); the sentence's tokens are split at a
  random point into A and B instead, and a one-token chunk is dropped.
* ``objective="none"``: RoBERTa's packing, one segment, label 0. ``cross_documents=True`` is
  FULL-SENTENCES (fill up to the length across document boundaries, ``[SEP]`` between documents);
  ``False`` is DOC-SENTENCES (an example never crosses a document boundary). Sentences are never
  cut, except one longer than the target, which is split into consecutive pieces (no text lost).
  ``short_seq_prob`` applies here too (RoBERTa used 0).

`create_instances` does what Google's ``create_training_instances`` does after reading: shuffle the
documents, ``dupe_factor`` passes over them, shuffle all instances.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

OBJECTIVES = ("nsp", "sop", "none")
PACKINGS = ("full", "doc")

Document = Sequence[Sequence[int]]


@dataclasses.dataclass(frozen=True)
class Instance:
    """One example before padding: ``[CLS] A [SEP] B [SEP]`` (or ``[CLS] text [SEP]``)."""

    tokens: list[int]
    segment_ids: list[int]
    label: int  # next_sentence_labels: 0 IsNext / right order / packed, 1 NotNext / swapped


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: random.Random) -> None:
    """Google's ``truncate_seq_pair``: in place, one token at a time from the longer list (B on a
    tie), from the front or the back with probability 0.5 each."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def _pair(tokens_a, tokens_b, label, cls_id, sep_id) -> Instance:
    tokens = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    return Instance(tokens, segment_ids, label)


def instances_from_document(all_documents: Sequence[Document], document_index: int,
                            max_seq_length: int, short_seq_prob: float, rng: random.Random, *,
                            cls_id: int, sep_id: int, objective: str = "nsp") -> list[Instance]:
    """Google's ``create_instances_from_document`` (``objective="nsp"``) or the SOP variant."""
    if objective not in ("nsp", "sop"):
        raise ValueError(f"objective must be 'nsp' or 'sop' for sentence pairs, got {objective!r}")
    document = all_documents[document_index]

    # Account for [CLS], [SEP], [SEP]
    max_num_tokens = max_seq_length - 3

    # Usually fill the whole sequence; with short_seq_prob use a shorter (rough) target to reduce
    # the mismatch between pre-training and fine-tuning. max_seq_length stays the hard limit.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    # A and B are made of whole "sentences" of the input, not an arbitrary split of the tokens
    # (that would make next sentence prediction too easy).
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                if objective == "sop":
                    instance = _sop_pair(current_chunk, max_num_tokens, rng, cls_id, sep_id)
                    if instance is not None:
                        instances.append(instance)
                    current_chunk = []
                    current_length = 0
                    i += 1
                    continue
                # `a_end` is how many segments from `current_chunk` go into the A sentence.
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)

                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])

                tokens_b = []
                # Random next
                is_random_next = False
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)

                    # Rarely more than one iteration on a large corpus; make sure (10 tries) the
                    # random document is not the one being processed.
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break

                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    # The segments not used for A are "put back" so they are not wasted.
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                # Actual next
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

                assert len(tokens_a) >= 1
                assert len(tokens_b) >= 1
                instances.append(_pair(tokens_a, tokens_b, int(is_random_next), cls_id, sep_id))
            current_chunk = []
            current_length = 0
        i += 1

    return instances


def _sop_pair(chunk, max_num_tokens, rng, cls_id, sep_id) -> Instance | None:
    """ALBERT's SOP pair from one chunk: A = chunk[:a_end], B = the rest, swapped with p=0.5."""
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
        tokens_a = [t for seg in chunk[:a_end] for t in seg]
        tokens_b = [t for seg in chunk[a_end:] for t in seg]
    else:  # one sentence: split its tokens (deviation from ALBERT, see the module docstring)
        seg = list(chunk[0])
        if len(seg) < 2:
            return None
        cut = rng.randint(1, len(seg) - 1)
        tokens_a, tokens_b = seg[:cut], seg[cut:]
    swapped = rng.random() < 0.5
    if swapped:
        tokens_a, tokens_b = tokens_b, tokens_a
    truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
    return _pair(tokens_a, tokens_b, int(swapped), cls_id, sep_id)


def pack_documents(documents: Sequence[Document], max_seq_length: int, short_seq_prob: float,
                   rng: random.Random, *, cls_id: int, sep_id: int,
                   cross_documents: bool) -> list[Instance]:
    """FULL-SENTENCES (``cross_documents=True``) or DOC-SENTENCES packing: ``[CLS] text [SEP]``."""
    max_num_tokens = max_seq_length - 2  # [CLS], final [SEP]

    def new_target() -> int:
        if rng.random() < short_seq_prob:
            return rng.randint(2, max_num_tokens) if max_num_tokens > 2 else max_num_tokens
        return max_num_tokens

    instances: list[Instance] = []
    current: list[int] = []
    target = new_target()
    sep_pending = False  # a document ended: a [SEP] goes before the next sentence in `current`

    def emit() -> None:
        nonlocal current, target
        if current:
            tokens = [cls_id, *current, sep_id]
            instances.append(Instance(tokens, [0] * len(tokens), 0))
        current, target = [], new_target()

    for document in documents:
        for sentence in document:
            sep = 1 if sep_pending and current else 0
            if current and len(current) + sep + len(sentence) > target:
                emit()
                sep = 0
            if sep:
                current.append(sep_id)
            sep_pending = False
            sentence = list(sentence)
            while len(current) + len(sentence) > target:  # only with `current` empty
                cut = target - len(current)
                current.extend(sentence[:cut])
                sentence = sentence[cut:]
                emit()
            current.extend(sentence)
        if cross_documents:
            sep_pending = True
        else:
            emit()
    emit()
    return instances


def create_instances(documents: Sequence[Document], *, objective: str = "nsp",
                     packing: str = "full", max_seq_length: int = 128,
                     short_seq_prob: float = 0.1, dupe_factor: int = 1,
                     rng: random.Random, cls_id: int, sep_id: int) -> list[Instance]:
    """Google's ``create_training_instances`` after reading: shuffle the documents (empty ones
    dropped), ``dupe_factor`` passes building instances, then shuffle the instances.

    For packing, each pass goes over the documents in the same (shuffled) order; passes differ only
    through ``short_seq_prob`` targets (and, with static masking, through their masks).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {PACKINGS}, got {packing!r}")
    min_length = 5 if objective != "none" else 3
    if max_seq_length < min_length:
        raise ValueError(f"max_seq_length must be >= {min_length} for {objective=}, "
                         f"got {max_seq_length}")
    if dupe_factor < 1 or not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"need dupe_factor >= 1 and short_seq_prob in [0, 1], got "
                         f"{dupe_factor}, {short_seq_prob}")
    all_documents = [[list(s) for s in doc if len(s)] for doc in documents]
    all_documents = [doc for doc in all_documents if doc]
    rng.shuffle(all_documents)
    instances: list[Instance] = []
    for _ in range(dupe_factor):
        if objective == "none":
            instances.extend(pack_documents(all_documents, max_seq_length, short_seq_prob, rng,
                                            cls_id=cls_id, sep_id=sep_id,
                                            cross_documents=packing == "full"))
            continue
        for document_index in range(len(all_documents)):
            instances.extend(instances_from_document(
                all_documents, document_index, max_seq_length, short_seq_prob, rng,
                cls_id=cls_id, sep_id=sep_id, objective=objective))
    rng.shuffle(instances)
    return instances

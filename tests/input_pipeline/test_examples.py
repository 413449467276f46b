"""Pre-training instances (input_pipeline/pretraining/examples.py) on synthetic token documents (token = its
document and position, see the make_docs fixture): Google's NSP algorithm exactly, NSP and SOP pairs,
short sequences and truncation, FULL-/DOC-SENTENCES packing, determinism."""

import random

import numpy as np
import pytest

from input_pipeline.pretraining.examples import create_instances, instances_from_document

CLS, SEP = 1, 2


def split_pair(inst):
    toks = inst.tokens
    assert toks[0] == CLS and toks[-1] == SEP and toks.count(SEP) == 2
    mid = toks.index(SEP)
    a, b = toks[1:mid], toks[mid + 1 : -1]
    assert inst.segment_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert a and b
    return a, b


def span(tokens, where):
    """(doc, first pos, last pos) of a contiguous run of one document's tokens."""
    info = [where[t] for t in tokens]
    doc = {d for d, _, _ in info}
    assert len(doc) == 1, "a segment mixes documents"
    pos = [p for _, _, p in info]
    assert pos == list(range(pos[0], pos[0] + len(pos))), "a segment is not contiguous"
    return doc.pop(), pos[0], pos[-1]


def google_create_instances_from_document(all_documents, document_index, max_seq_length,
                                          short_seq_prob, rng):
    """bert/create_pretraining_data.py's function, verbatim but for the masking (ids, not strings)."""
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances, current_chunk, current_length, i = [], [], 0, 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b = []
                is_random_next = False
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
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
                    i -= len(current_chunk) - a_end
                else:
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                while len(tokens_a) + len(tokens_b) > max_num_tokens:
                    trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
                    if rng.random() < 0.5:
                        del trunc_tokens[0]
                    else:
                        trunc_tokens.pop()
                tokens = [CLS, *tokens_a, SEP, *tokens_b, SEP]
                instances.append((tokens, int(is_random_next)))
            current_chunk, current_length = [], 0
        i += 1
    return instances


def test_nsp_is_googles_algorithm(make_docs):
    docs, _ = make_docs(30, sent_len=(2, 40))
    ours, ref = [], []
    rng_a, rng_b = random.Random(5), random.Random(5)
    for _ in range(2):
        for d in range(len(docs)):
            ours += instances_from_document(docs, d, 64, 0.3, rng_a, cls_id=CLS, sep_id=SEP)
            ref += google_create_instances_from_document(docs, d, 64, 0.3, rng_b)
    assert [(x.tokens, x.label) for x in ours] == ref
    assert rng_a.random() == rng_b.random()  # same number of draws


def test_nsp_pairs(make_docs):
    docs, where = make_docs(150, sents=(5, 40))
    max_len = 64
    insts = create_instances(docs, objective="nsp", max_seq_length=max_len, short_seq_prob=0.1,
                             dupe_factor=3, rng=random.Random(1), cls_id=CLS, sep_id=SEP)
    labels = np.array([x.label for x in insts])
    # 50% NotNext, plus Google's forced NotNext for one-sentence chunks (end of a document).
    assert len(insts) > 1000 and 0.48 < labels.mean() < 0.6
    consecutive = 0
    for inst in insts:
        assert len(inst.tokens) <= max_len
        a, b = split_pair(inst)
        (da, _a0, a1), (db, b0, _b1) = span(a, where), span(b, where)
        if inst.label == 0:  # B is the true continuation of A in the same document
            assert da == db and b0 > a1
            if len(a) + len(b) < max_len - 3:  # not truncated: exactly adjacent, whole sentences
                assert b0 == a1 + 1
                consecutive += 1
        else:
            assert da != db
    assert consecutive > 100


def test_short_seq_prob_and_truncation(make_docs):
    docs, _ = make_docs(40, sents=(40, 80))
    mean_len = {}
    for p in (0.0, 1.0):
        insts = create_instances(docs, objective="nsp", max_seq_length=64, short_seq_prob=p,
                                 rng=random.Random(2), cls_id=CLS, sep_id=SEP)
        mean_len[p] = np.mean([len(x.tokens) for x in insts])
        assert max(len(x.tokens) for x in insts) <= 64
    assert mean_len[0.0] > 55 and mean_len[1.0] < 0.65 * mean_len[0.0]


def test_sop_pairs(make_docs):
    docs, where = make_docs(60)
    insts = create_instances(docs, objective="sop", max_seq_length=64, dupe_factor=3,
                             rng=random.Random(3), cls_id=CLS, sep_id=SEP)
    assert 0.45 < np.mean([x.label for x in insts]) < 0.55
    for inst in insts:
        (da, a0, a1), (db, b0, b1) = (span(s, where) for s in split_pair(inst))
        assert da == db
        assert (b0 > a1) if inst.label == 0 else (a0 > b1)  # label 1: swapped order


@pytest.mark.parametrize("packing", ["full", "doc"])
def test_packing(packing, make_docs):
    docs, where = make_docs(50)
    insts = create_instances(docs, objective="none", packing=packing, max_seq_length=64,
                             short_seq_prob=0.0, rng=random.Random(4), cls_id=CLS, sep_id=SEP)
    crossing, content = 0, []
    for inst in insts:
        assert inst.label == 0 and inst.segment_ids == [0] * len(inst.tokens)
        assert len(inst.tokens) <= 64 and inst.tokens[0] == CLS and inst.tokens[-1] == SEP
        parts, cur = [], []
        for t in inst.tokens[1:-1]:
            (parts.append(cur), cur := []) if t == SEP else cur.append(t)
        parts.append(cur)
        assert all(parts)
        spans = [span(p, where) for p in parts]  # each part: one document, contiguous
        assert len({d for d, _, _ in spans}) == len(spans)  # a [SEP] exactly at document changes
        crossing += len(parts) > 1
        content += [t for p in parts for t in p]
    assert sorted(content) == sorted(t for doc in docs for s in doc for t in s)  # nothing lost
    assert (crossing > 10) if packing == "full" else (crossing == 0)
    full = np.mean([len(x.tokens) for x in insts]) / 64
    assert full > (0.9 if packing == "full" else 0.5)


def test_instances_deterministic(make_docs):
    docs, _ = make_docs(20)
    run = lambda seed, obj: [(x.tokens, x.label) for x in create_instances(
        docs, objective=obj, dupe_factor=2, rng=random.Random(seed), cls_id=CLS, sep_id=SEP)]
    for obj in ("nsp", "sop", "none"):
        assert run(7, obj) == run(7, obj) and run(7, obj) != run(8, obj)

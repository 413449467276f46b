"""Tests for pre-training example construction (examples.py, pretraining.py) and the data tool
(create_pretraining_data.py, pretraining_shards.py): synthetic token documents, a tiny vocabulary,
the gensim excerpt."""

import collections
import json
import os
import random

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from input_pipeline import create_pretraining_data as cpd
from input_pipeline import masking, pretraining, sources
from input_pipeline.examples import create_instances, instances_from_document
from input_pipeline.pretraining_shards import shard_seed
from input_pipeline.tokenizers import WordPieceTokenizer

CLS, SEP = 1, 2


# --- synthetic token documents: token = doc * 10**6 + position in the document (sentence known) --

def make_docs(num_docs=40, seed=0, sent_len=(3, 12), sents=(1, 30)):
    rng = random.Random(seed)
    docs, where = [], {}
    for d in range(num_docs):
        doc, pos = [], 0
        for i in range(rng.randint(*sents)):
            sentence = []
            for _ in range(rng.randint(*sent_len)):
                token = 1000 + d * 10**6 + pos
                where[token] = (d, i, pos)
                sentence.append(token)
                pos += 1
            doc.append(sentence)
        docs.append(doc)
    return docs, where


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


def test_nsp_is_googles_algorithm():
    docs, _ = make_docs(30, sent_len=(2, 40))
    ours, ref = [], []
    rng_a, rng_b = random.Random(5), random.Random(5)
    for _ in range(2):
        for d in range(len(docs)):
            ours += instances_from_document(docs, d, 64, 0.3, rng_a, cls_id=CLS, sep_id=SEP)
            ref += google_create_instances_from_document(docs, d, 64, 0.3, rng_b)
    assert [(x.tokens, x.label) for x in ours] == ref
    assert rng_a.random() == rng_b.random()  # same number of draws


def test_nsp_pairs():
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


def test_short_seq_prob_and_truncation():
    docs, _ = make_docs(40, sents=(40, 80))
    mean_len = {}
    for p in (0.0, 1.0):
        insts = create_instances(docs, objective="nsp", max_seq_length=64, short_seq_prob=p,
                                 rng=random.Random(2), cls_id=CLS, sep_id=SEP)
        mean_len[p] = np.mean([len(x.tokens) for x in insts])
        assert max(len(x.tokens) for x in insts) <= 64
    assert mean_len[0.0] > 55 and mean_len[1.0] < 0.65 * mean_len[0.0]


def test_sop_pairs():
    docs, where = make_docs(60)
    insts = create_instances(docs, objective="sop", max_seq_length=64, dupe_factor=3,
                             rng=random.Random(3), cls_id=CLS, sep_id=SEP)
    assert 0.45 < np.mean([x.label for x in insts]) < 0.55
    for inst in insts:
        (da, a0, a1), (db, b0, b1) = (span(s, where) for s in split_pair(inst))
        assert da == db
        assert (b0 > a1) if inst.label == 0 else (a0 > b1)  # label 1: swapped order


@pytest.mark.parametrize("packing", ["full", "doc"])
def test_packing(packing):
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


def test_instances_deterministic():
    docs, _ = make_docs(20)
    run = lambda seed, obj: [(x.tokens, x.label) for x in create_instances(
        docs, objective=obj, dupe_factor=2, rng=random.Random(seed), cls_id=CLS, sep_id=SEP)]
    for obj in ("nsp", "sop", "none"):
        assert run(7, obj) == run(7, obj) and run(7, obj) != run(8, obj)


# --- tiny vocabulary: words d0.., s0.., w0.. ---------------------------------------------------

def write_corpus(root, num_files=5, docs_per_file=8, seed=0):
    """bert-format text files; sentence "dD sI wK ..." names its document and sentence."""
    rng = random.Random(seed)
    paths, d = [], 0
    for f in range(num_files):
        lines = []
        for _ in range(docs_per_file):
            for i in range(rng.randint(1, 14)):
                words = " ".join(f"w{rng.randrange(40)}" for _ in range(rng.randint(2, 12)))
                lines.append(f"D{d} s{i} {words}.")
            lines.append("")
            d += 1
        path = root / f"part-{f}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "##s"]
    words += [f"d{i}" for i in range(60)] + [f"s{i}" for i in range(20)] + [f"w{i}" for i in range(40)]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(words) + "\n")
    return WordPieceTokenizer(path)


def test_tokenize_documents_batches_and_keeps_order(tiny_tok):
    docs = [["d1 s0 w1.", "d1 s1 w2 w3"], ["\x00"], ["d3 s0"]] * 300  # 900 docs, 1500 sentences
    out = list(pretraining.tokenize_documents(iter(docs), tiny_tok, batch_size=64))
    assert len(out) == 900 and out[1] == []
    assert [tiny_tok.id_to_token(s) for s in out[0]] == [["d1", "s0", "w1", "."],
                                                         ["d1", "s1", "w2", "w3"]]
    assert tiny_tok.id_to_token(out[-1][0]) == ["d3", "s0"]

    def bad():
        yield ["d1"]
        raise sources.SourceError("x.txt:3: boom")

    with pytest.raises(sources.SourceError, match="boom"):
        list(pretraining.tokenize_documents(bad(), tiny_tok))


def test_serialize_and_parse_round_trip(tiny_tok, tmp_path):
    docs, _ = make_docs(10, sents=(2, 10))
    docs = [[[5 + t % 120 for t in s] for s in d] for d in docs]  # ids inside the tiny vocab
    feats = pretraining.build_examples(docs, tiny_tok, max_seq_length=32, dupe_factor=2, seed=1)
    cfg = pretraining.masking_config(tiny_tok, max_predictions_per_seq=5)
    masked = pretraining.mask_features(feats, tiny_tok, cfg, seed=3, stream=2)
    # The same masks as masking.mask_dataset (epoch = stream) gives.
    ref = list(masking.mask_dataset(tf.data.Dataset.from_tensor_slices(feats), cfg, seed=3, epoch=2)
               .batch(10_000).as_numpy_iterator())[0]
    for k, v in ref.items():
        np.testing.assert_array_equal(masked[k], v)
    path = str(tmp_path / "x.tfrecord")
    n = pretraining.write_records(path, pretraining.serialize_features(masked))
    assert n == len(feats["input_ids"]) and os.listdir(tmp_path) == ["x.tfrecord"]
    raw = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    parsed = pretraining.parse_examples(raw, 32, 5)
    assert set(parsed) == set(masked)
    for k, v in parsed.items():
        assert v.dtype == (tf.float32 if k == "masked_lm_weights" else tf.int32)
        np.testing.assert_array_equal(v.numpy(), masked[k])
    assert raw[0] == pretraining.serialize_example({k: v[0] for k, v in masked.items()})
    one = pretraining.parse_examples(raw[0], 32)  # unmasked spec reads a masked record too
    assert one["next_sentence_labels"].shape == [] and one["input_ids"].shape == [32]
    # Google's writer: OrderedDict of features, label as int64 [1] (field order must not matter).
    ex = tf.train.Example()
    for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
        ex.features.feature[k].int64_list.value.extend(masked[k][0].tolist())
    ex.features.feature["masked_lm_weights"].float_list.value.extend(masked["masked_lm_weights"][0])
    ex.features.feature["next_sentence_labels"].int64_list.value.append(int(masked["next_sentence_labels"][0]))
    google = pretraining.parse_examples([ex.SerializeToString()], 32, 5)
    for k, v in google.items():
        np.testing.assert_array_equal(v.numpy()[0], masked[k][0])


def read_shards(out_dir, max_seq_length, p=None, compression=None):
    files = sorted(f for f in os.listdir(out_dir) if f.startswith("pretrain-"))
    result = {}
    for f in files:
        raw = list(tf.data.TFRecordDataset(str(out_dir / f), compression).as_numpy_iterator())
        result[f] = (raw, pretraining.parse_examples(raw, max_seq_length, p) if raw else None)
    return result


def test_tool_static_masks_and_reproduces(tiny_tok, tmp_path):
    files = write_corpus(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "pretrain-00003-of-00009.tfrecord.tmp-dead").write_bytes(b"half")
    kw = dict(max_seq_length=48, max_predictions_per_seq=6, dupe_factor=2, num_shards=2,
              random_seed=9, objective="nsp", whole_word_mask=True, progress=False)
    summary = cpd.create_pretraining_data(str(tmp_path / "part-*.txt"), str(tmp_path / "out"),
                                          tiny_tok, **kw)
    names = sorted(os.listdir(tmp_path / "out"))
    assert names == ["config.json", "pretrain-00000-of-00002.tfrecord",
                     "pretrain-00001-of-00002.tfrecord", "summary.json"]  # no .tmp, stale gone
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["max_seq_length"] == 48 and config["max_predictions_per_seq"] == 6
    assert config["masked"] and summary["documents"] == 40 and summary["input_files"] == 5
    shards = read_shards(tmp_path / "out", 48, 6)
    assert summary["examples"] == sum(len(raw) for raw, _ in shards.values())
    # Shard s = files s, s+2, ... (files >= shards): rebuild it from the public pieces.
    cfg = pretraining.masking_config(tiny_tok, max_predictions_per_seq=6, whole_word=True)
    for s, (_, parsed) in enumerate(shards.values()):
        docs = pretraining.tokenize_documents(sources.read_documents([str(f) for f in files[s::2]]),
                                              tiny_tok)
        feats = pretraining.build_examples(list(docs), tiny_tok, max_seq_length=48, dupe_factor=2,
                                           seed=random.Random(shard_seed(9, s)))
        feats = pretraining.mask_features(feats, tiny_tok, cfg, seed=9, stream=s)
        for k, v in parsed.items():
            np.testing.assert_array_equal(v.numpy(), feats[k])
    masked = sum(int(p["masked_lm_weights"].numpy().sum()) for _, p in shards.values())
    assert masked == summary["masked_tokens"] > 0


def test_tool_independent_of_workers(tiny_tok, tmp_path):
    write_corpus(tmp_path, num_files=3, docs_per_file=6)
    outs = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        cpd.create_pretraining_data(str(tmp_path / "*.txt"), str(out), tiny_tok, num_shards=4,
                                    num_workers=workers, max_seq_length=32, masking="none",
                                    objective="sop", progress=False, dupe_factor=1)
        outs[workers] = {f: raw for f, (raw, _) in read_shards(out, 32).items()}
        assert not [f for f in os.listdir(out) if ".tmp" in f]
    assert outs[1] == outs[2] and len(outs[1]) == 4
    assert all(outs[1].values())  # 3 files < 4 shards: documents spread over every shard
    first = pretraining.parse_examples(outs[1]["pretrain-00000-of-00004.tfrecord"], 32)
    assert "masked_lm_ids" not in first
    # Different seed → different data; re-run into the same directory replaces everything.
    cpd.create_pretraining_data(str(tmp_path / "*.txt"), str(tmp_path / "out1"), tiny_tok,
                                num_shards=1, random_seed=1, max_seq_length=32, masking="none",
                                compression="gzip", progress=False)
    again = read_shards(tmp_path / "out1", 32, compression="GZIP")
    assert list(again) == ["pretrain-00000-of-00001.tfrecord.gz"]


def test_static_dupes_get_different_masks(tiny_tok, tmp_path):
    write_corpus(tmp_path, num_files=1, docs_per_file=10)
    cpd.create_pretraining_data(str(tmp_path / "*.txt"), str(tmp_path / "out"), tiny_tok,
                                objective="none", packing="doc", short_seq_prob=0.0,
                                dupe_factor=3, max_seq_length=40, progress=False)
    (_, p), = read_shards(tmp_path / "out", 40, 20).values()
    ids, pos = p["input_ids"].numpy(), p["masked_lm_positions"].numpy()
    orig = ids.copy()
    np.put_along_axis(orig, pos, p["masked_lm_ids"].numpy(), 1)  # weight-0 slots: pos 0 = [CLS]
    orig[:, 0] = ids[:, 0]
    groups = collections.defaultdict(list)
    for row, o in enumerate(orig):
        groups[o.tobytes()].append(tuple(pos[row]))
    assert all(len(g) == 3 for g in groups.values())  # the same packed examples in every pass
    assert sum(len(set(g)) > 1 for g in groups.values()) >= 0.9 * len(groups)


def test_cli(tiny_tok, tmp_path):
    write_corpus(tmp_path, num_files=2, docs_per_file=4)
    argv = ["prog", f"--input={tmp_path}/part-0.txt,{tmp_path}/part-1.txt", f"--vocab={tiny_tok.vocab_file}",
            f"--output={tmp_path / 'out'}", "--max_seq_length=32", "--dupe_factor=1",
            "--objective=none", "--packing=full", "--num_shards=2", "--noprogress"]
    fv = flags.FlagValues()  # a fresh set: the module defines no flags at import
    cpd.define_flags(fv)
    fv(argv)
    cpd.main([], fv)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["documents"] == 8 and summary["examples"] > 0 and summary["masked_tokens"] > 0


def test_wikipedia_excerpt_end_to_end(minilm_dir, tmp_path):
    from input_pipeline.package_data import PackageDataError, wikipedia_excerpt

    try:
        dump = wikipedia_excerpt()
    except PackageDataError as e:
        pytest.skip(f"gensim excerpt unavailable: {e}")
    tok = WordPieceTokenizer(minilm_dir / "vocab.txt")
    summary = cpd.create_pretraining_data(str(dump), str(tmp_path), tok, num_shards=3,
                                          dupe_factor=2, max_documents_per_file=12,
                                          progress=False)
    assert summary["documents"] == 12 and summary["source"]["filtered"]["redirect"] > 0
    shards = read_shards(tmp_path, 128, 20)
    assert len(shards) == 3 and all(raw for raw, _ in shards.values())
    assert summary["examples"] == sum(len(raw) for raw, _ in shards.values()) > 200
    assert 90 < summary["mean_tokens_per_example"] <= 128
    assert 0.4 < summary["next_sentence_label_1_fraction"] < 0.65
    assert 0.12 < summary["masked_tokens"] / summary["tokens"] < 0.16
    _, parsed = shards["pretrain-00000-of-00003.tfrecord"]
    text = " ".join(tok.id_to_token(parsed["input_ids"][0][parsed["input_mask"][0] > 0]))
    assert text.startswith("[CLS]") and text.count("[SEP]") == 2

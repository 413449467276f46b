"""The data tool (input_pipeline/create_pretraining_data.py, pretraining_shards.py): shards rebuilt
from the public pieces, independent of the worker count, different masks per dupe, the command line,
and the real Wikipedia excerpt end to end."""

import collections
import json
import os
import random

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from input_pipeline import create_pretraining_data as cpd
from input_pipeline.corpora import sources
from input_pipeline.pretraining import featurize
from input_pipeline.pretraining.shards import shard_seed
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer


def read_shards(out_dir, max_seq_length, p=None, compression=None):
    files = sorted(f for f in os.listdir(out_dir) if f.startswith("pretrain-"))
    result = {}
    for f in files:
        raw = list(tf.data.TFRecordDataset(str(out_dir / f), compression).as_numpy_iterator())
        result[f] = (raw, featurize.parse_examples(raw, max_seq_length, p) if raw else None)
    return result


def test_tool_static_masks_and_reproduces(tiny_tok, tmp_path, write_token_corpus):
    files = write_token_corpus(tmp_path)
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
    cfg = featurize.masking_config(tiny_tok, max_predictions_per_seq=6, whole_word=True)
    for s, (_, parsed) in enumerate(shards.values()):
        docs = featurize.tokenize_documents(sources.read_documents([str(f) for f in files[s::2]]),
                                              tiny_tok)
        feats = featurize.build_examples(list(docs), tiny_tok, max_seq_length=48, dupe_factor=2,
                                           seed=random.Random(shard_seed(9, s)))
        feats = featurize.mask_features(feats, tiny_tok, cfg, seed=9, stream=s)
        for k, v in parsed.items():
            np.testing.assert_array_equal(v.numpy(), feats[k])
    masked = sum(int(p["masked_lm_weights"].numpy().sum()) for _, p in shards.values())
    assert masked == summary["masked_tokens"] > 0


@pytest.mark.slow  # ~17 s: worker processes
def test_tool_independent_of_workers(tiny_tok, tmp_path, write_token_corpus):
    write_token_corpus(tmp_path, num_files=3, docs_per_file=6)
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
    first = featurize.parse_examples(outs[1]["pretrain-00000-of-00004.tfrecord"], 32)
    assert "masked_lm_ids" not in first
    # Different seed → different data; re-run into the same directory replaces everything.
    cpd.create_pretraining_data(str(tmp_path / "*.txt"), str(tmp_path / "out1"), tiny_tok,
                                num_shards=1, random_seed=1, max_seq_length=32, masking="none",
                                compression="gzip", progress=False)
    again = read_shards(tmp_path / "out1", 32, compression="GZIP")
    assert list(again) == ["pretrain-00000-of-00001.tfrecord.gz"]


def test_static_dupes_get_different_masks(tiny_tok, tmp_path, write_token_corpus):
    write_token_corpus(tmp_path, num_files=1, docs_per_file=10)
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


def test_cli(tiny_tok, tmp_path, write_token_corpus):
    write_token_corpus(tmp_path, num_files=2, docs_per_file=4)
    argv = ["prog", f"--input={tmp_path}/part-0.txt,{tmp_path}/part-1.txt", f"--vocab={tiny_tok.vocab_file}",
            f"--output={tmp_path / 'out'}", "--max_seq_length=32", "--dupe_factor=1",
            "--objective=none", "--packing=full", "--num_shards=2", "--ngram=3", "--noprogress"]
    fv = flags.FlagValues()  # a fresh set: the module defines no flags at import
    cpd.define_flags(fv)
    fv(argv)
    cpd.main([], fv)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["documents"] == 8 and summary["examples"] > 0 and summary["masked_tokens"] > 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["ngram"] == 3
    with pytest.raises(flags.IllegalFlagValueError, match="ngram"):
        fv(["prog", "--ngram=-1"])


def test_tool_ngram_masks_reproduce(tiny_tok, tmp_path, write_token_corpus):
    files = write_token_corpus(tmp_path, num_files=1, docs_per_file=8)
    cpd.create_pretraining_data(str(files[0]), str(tmp_path / "out"), tiny_tok, max_seq_length=32,
                                max_predictions_per_seq=5, dupe_factor=1, random_seed=4, ngram=3, progress=False)
    (_, parsed), = read_shards(tmp_path / "out", 32, 5).values()
    docs = featurize.tokenize_documents(sources.read_documents([str(files[0])]), tiny_tok)
    feats = featurize.build_examples(list(docs), tiny_tok, max_seq_length=32, seed=random.Random(shard_seed(4, 0)))
    cfg = lambda n: featurize.masking_config(tiny_tok, max_predictions_per_seq=5, ngram=n)
    masked = {n: featurize.mask_features(feats, tiny_tok, cfg(n), seed=4, stream=0) for n in (3, 0)}
    for k, v in parsed.items():
        np.testing.assert_array_equal(v.numpy(), masked[3][k], err_msg=k)
    assert (masked[3]["masked_lm_positions"] != masked[0]["masked_lm_positions"]).any()  # not token masking
    with pytest.raises(ValueError, match="ngram=-2: expected an int >= 0"):
        cpd.create_pretraining_data(str(files[0]), str(tmp_path / "bad"), tiny_tok, ngram=-2, progress=False)


def test_wikipedia_excerpt_end_to_end(minilm_dir, wikipedia_dump, tmp_path):
    dump = wikipedia_dump
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


def tokenizer_json_shards(golden_file, tmp_path, write_prose_corpus, workers: int):
    """Shards of pseudo-prose built with the tests' 2,000-merge ModernBERT-style BPE; (its tokenizer,
    its path, the corpus, the summary)."""
    from input_pipeline.tokenizers.factory import load_tokenizer

    vocab = golden_file("modernbert_l3/tokenizer.json")
    corpus = write_prose_corpus(tmp_path / "prose.txt", n_sentences=200)
    summary = cpd.create_pretraining_data(corpus, str(tmp_path / "out"), str(vocab), max_seq_length=64,
                                          max_predictions_per_seq=10, masked_lm_prob=0.3, dupe_factor=1,
                                          num_shards=2, objective="none", packing="doc", num_workers=workers,
                                          progress=False, masking="none")
    return load_tokenizer(vocab), vocab, corpus, summary


def test_shards_from_a_tokenizer_json(golden_file, tmp_path, write_prose_corpus):
    """A byte-level BPE ``tokenizer.json`` (ModernBERT's kind; tests/golden/modernbert_l3's) builds
    shards as a vocab.txt does: every row is the file's own encoding of a document ([CLS] ... [SEP])."""
    tok, vocab, corpus, summary = tokenizer_json_shards(golden_file, tmp_path, write_prose_corpus, workers=1)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["vocab_file"] == str(vocab) and config["vocab_size"] == tok.vocab_size and summary["examples"]
    rows = [ids for _, parsed in read_shards(tmp_path / "out", 64).values()
            for ids, mask in zip(parsed["input_ids"].numpy(), parsed["input_mask"].numpy(), strict=True)
            for ids in [ids[mask > 0]]]
    assert all(r[0] == tok.cls_id and r[-1] == tok.sep_id for r in rows)
    first = open(corpus, encoding="utf-8").read().split("\n\n")[0].split("\n")  # the first document's sentences
    ids = [i for s in first for i in tok.encode_python([s])[0]]
    assert any(list(r[1:-1]) == ids[:len(r) - 2] for r in rows)  # DOC-SENTENCES: a document's own encoding


@pytest.mark.slow  # ~2 min: worker processes, then ModernBERT's step compiled
def test_modernbert_pretrains_on_tokenizer_json_shards_from_the_worker_pool(golden_file, tmp_path,
                                                                            write_prose_corpus):
    """The worker pool opens the tokenizer.json in each worker, and the ModernBERT recipe pre-trains
    on the shards with the same file as its vocabulary."""
    from bert_jax import launch
    from bert_jax.config_args import load_config_file

    _, vocab, _, summary = tokenizer_json_shards(golden_file, tmp_path, write_prose_corpus, workers=2)
    assert summary["num_workers"] == 2 and summary["examples"]
    c = load_config_file("pretrain", "model=modernbert,runlocal")
    c.data.update(input=str(tmp_path / "out" / "pretrain-*.tfrecord"), vocab=str(vocab), max_seq_length=64,
                  max_predictions_per_seq=10, eval_fraction=0.0)
    c.update(num_train_steps=2, eval_every=0, checkpoint_every=2, log_every=1, batch_size=8)
    c.optimizer.update(num_train_steps=2, warmup_steps=1, decay_steps=1)
    result = launch.run(c, str(tmp_path / "w"))
    assert result["train"]["mlm_loss"] > 0 and (tmp_path / "w" / "checkpoints" / "2").is_dir()


# ------------------------------------------------------------------ text of the wrong shape, held-out shards


def _posts(path, n=120, seed=0):
    """One short post a line (1-2 sentences, no blank lines): the layout --format doc_per_line reads."""
    rng = random.Random(seed)
    lines = [" ".join(f"s{k} " + " ".join(f"w{rng.randrange(40)}" for _ in range(rng.randint(3, 8))) + "."
                      for k in range(rng.randint(1, 2))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_posts_read_as_one_document_are_a_warning(tiny_tok, tmp_path):
    posts = _posts(tmp_path / "posts.txt")
    summary = cpd.create_pretraining_data(str(posts), str(tmp_path / "out"), tiny_tok, max_seq_length=32,
                                          dupe_factor=1, masking="none", progress=False)
    assert summary["documents"] == 1
    assert [w for w in summary["warnings"] if "read as 1 document(s)" in w and "--format doc_per_line" in w]
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written["warnings"] == summary["warnings"]
    # The same posts as documents: no such warning. Books (few documents of many sentences, blank lines
    # between them) do get it: it says "if".
    fine = cpd.create_pretraining_data(str(posts), str(tmp_path / "out"), tiny_tok, max_seq_length=32,
                                       dupe_factor=1, masking="none", progress=False, format="doc_per_line")
    assert fine["documents"] == 120 and not [w for w in fine["warnings"] if "read as" in w]


def test_short_documents_skew_nsp_and_long_rows_are_padding(tiny_tok, tmp_path, write_token_corpus):
    posts = _posts(tmp_path / "posts.txt", n=200)
    summary = cpd.create_pretraining_data(str(posts), str(tmp_path / "out"), tiny_tok, max_seq_length=128,
                                          dupe_factor=2, masking="none", progress=False, format="doc_per_line")
    fraction = summary["next_sentence_label_1_fraction"]
    assert fraction > 0.65, fraction  # one- and two-sentence documents: few IsNext pairs
    nsp = [w for w in summary["warnings"] if "NSP labels are 1 (NotNext)" in w]
    assert nsp and f"{fraction:.0%}" in nsp[0] and "--objective none" in nsp[0]
    padding = [w for w in summary["warnings"] if "of the rows are padding at --max_seq_length 128" in w]
    assert padding and summary["padding_fraction"] > 0.5
    assert summary["padding_fraction"] == pytest.approx(1 - summary["tokens"] / (summary["examples"] * 128))
    # Documents of many sentences at a length they fill: no warning at all.
    (tmp_path / "docs").mkdir()
    write_token_corpus(tmp_path / "docs")
    good = cpd.create_pretraining_data(str(tmp_path / "docs" / "part-*.txt"), str(tmp_path / "good"), tiny_tok,
                                       max_seq_length=32, dupe_factor=2, masking="none", progress=False)
    assert good["warnings"] == [] and 0.4 < good["next_sentence_label_1_fraction"] < 0.6


def test_heldout_every_nth_document(tiny_tok, tmp_path, write_token_corpus):
    """--heldout_every 4: documents 0, 4, 8, ... of each file go to the held-out shards, once each;
    the training shards hold the rest; together they hold every document."""
    write_token_corpus(tmp_path, num_files=2, docs_per_file=12)
    kw = dict(max_seq_length=32, masking="none", progress=False, objective="none", packing="doc", short_seq_prob=0.0)
    out, held = tmp_path / "p", tmp_path / "p-heldout"
    summary = cpd.create_pretraining_data(str(tmp_path / "part-*.txt"), str(out), tiny_tok, num_shards=2,
                                          dupe_factor=2, heldout_every=4, heldout_shards=1, **kw)
    assert sorted(os.listdir(held)) == ["config.json", "pretrain-00000-of-00001.tfrecord", "summary.json"]
    config = json.loads((held / "config.json").read_text())
    assert config["dupe_factor"] == 1 and config["num_shards"] == 1
    assert config["held_out_of"] == {"output": str(out), "every": 4}
    assert json.loads((out / "config.json").read_text())["held_out"] == {"output": str(held), "every": 4}
    assert summary["held_out"]["documents"] == 6 and summary["documents"] == 18  # 3 + 9 of each file

    words = open(tiny_tok.vocab_file).read().split("\n")

    def sentences_in(directory):
        """How often each document's sentences occur (each sentence holds its document's id once)."""
        ids = collections.Counter()
        for f in sorted(directory.glob("pretrain-*")):
            for raw in tf.data.TFRecordDataset(str(f)).as_numpy_iterator():
                row = featurize.parse_examples([raw], 32)["input_ids"].numpy()[0]
                ids.update(words[t] for t in row if words[t].startswith("d"))
        return ids

    corpus = collections.Counter(line.split()[0].lower() for f in sorted(tmp_path.glob("part-*.txt"))
                                 for line in f.read_text().splitlines() if line)  # sentences per document
    # Document D of file f is "D<f * 12 + j>": held out exactly when j % 4 == 0, its sentences once each.
    expected_held = {f"d{f * 12 + j}" for f in range(2) for j in range(0, 12, 4)}
    assert sentences_in(held) == {d: corpus[d] for d in expected_held}
    assert sentences_in(out) == {d: 2 * n for d, n in corpus.items() if d not in expected_held}  # dupe_factor 2
    # The same command line, as a user types it.
    with pytest.raises(ValueError, match="--heldout_output .*: the training shards' directory"):
        cpd.create_pretraining_data(str(tmp_path / "part-*.txt"), str(out), tiny_tok, heldout_every=4,
                                    heldout_output=str(out), **kw)
    with pytest.raises(ValueError, match="heldout_every=1: expected 0 \\(none held out\\) or >= 2"):
        cpd.create_pretraining_data(str(tmp_path / "part-*.txt"), str(out), tiny_tok, heldout_every=1, **kw)

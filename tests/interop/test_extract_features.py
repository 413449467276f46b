"""Feature extraction (python -m bert_jax.interop.extract_features) against the transformers golden values."""

import json

import numpy as np
import pytest

from bert_jax.interop import extract_features as ef


@pytest.fixture(scope="module")
def golden_run(minilm_dir, minilm_golden, tmp_path_factory):
    """Runs the tool once on the golden inputs, writing both output formats."""
    g = minilm_golden
    d = tmp_path_factory.mktemp("features")
    lines = [a if not b else f"{a} ||| {b}" for a, b in zip(g["texts_a"], g["texts_b"], strict=True)]
    (d / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    layers = [0, 3, -1]
    ef.run(f"hf:{minilm_dir}", d / "in.txt", d / "out.npz", layers=layers, batch_size=3, progress=False)
    ef.run(f"hf:{minilm_dir}", d / "in.txt", d / "out.jsonl", layers=layers, batch_size=8, progress=False)
    return g, d, layers, minilm_dir


def test_npz_matches_golden(golden_run):
    g, d, layers, _ = golden_run
    out = np.load(d / "out.npz")
    n = len(g["texts_a"])
    assert set(out.files) == {"input_ids", "input_mask", "segment_ids", "pooled"} | {f"layer_{k}" for k in layers}
    lengths = np.diff(g["offsets"])
    assert out["input_ids"].shape == (n, lengths.max()) and out["input_ids"].dtype == np.int32
    np.testing.assert_array_equal(out["input_mask"].sum(1), lengths)
    num_layers = g["hidden_states"].shape[0] - 1
    for i in range(n):
        lo, hi = g["offsets"][i], g["offsets"][i + 1]
        np.testing.assert_array_equal(out["input_ids"][i, : hi - lo], g["input_ids"][lo:hi])
        np.testing.assert_array_equal(out["segment_ids"][i, : hi - lo], g["segment_ids"][lo:hi])
        for k in layers:
            ref = g["hidden_states"][k % (num_layers + 1), lo:hi]
            np.testing.assert_allclose(out[f"layer_{k}"][i, : hi - lo], ref, atol=1e-4, err_msg=f"{i} {k}")
    np.testing.assert_allclose(out["pooled"], g["pooler_output"], atol=1e-4)


def test_jsonl_has_the_original_layout(golden_run):
    g, d, layers, _ = golden_run
    rows = [json.loads(line) for line in (d / "out.jsonl").read_text().splitlines()]
    assert [r["linex_index"] for r in rows] == list(range(len(g["texts_a"])))
    first = rows[0]["features"]
    assert first[0]["token"] == "[CLS]" and first[-1]["token"] == "[SEP]"
    vocab = (golden_run[3] / "vocab.txt").read_text(encoding="utf-8").splitlines()
    lo, hi = g["offsets"][0], g["offsets"][1]
    assert [t["token"] for t in first] == [vocab[i] for i in g["input_ids"][lo:hi]]
    assert first[1]["token"] == "cafe"  # uncased vocab: accents stripped
    assert [layer["index"] for layer in first[0]["layers"]] == layers
    vals = np.array([[tok["layers"][-1]["values"] for tok in first]])[0]
    assert len(first) == hi - lo
    np.testing.assert_allclose(vals, g["hidden_states"][-1, lo:hi], atol=1e-4)


def test_truncation_follows_the_original():
    a, b = list(range(10)), list(range(100, 104))
    ef.truncate_pair(a, b, 12)  # room for 9 tokens: the longer segment loses from its end
    assert (a, b) == ([0, 1, 2, 3, 4], [100, 101, 102, 103])
    a, b = list(range(5)), list(range(100, 105))
    ef.truncate_pair(a, b, 9)  # equal lengths: the second segment loses first
    assert (a, b) == ([0, 1, 2], [100, 101, 102])
    single = list(range(10))
    ef.truncate_pair(single, None, 6)
    assert single == [0, 1, 2, 3]


def test_max_seq_length_pads_and_truncates(minilm_dir, tmp_path):
    (tmp_path / "in.txt").write_text("a b c d e f g h i j ||| k l\nshort\n")
    ef.run(f"hf:{minilm_dir}", tmp_path / "in.txt", tmp_path / "o.npz", layers=[-1], max_seq_length=8,
           progress=False)
    out = np.load(tmp_path / "o.npz")
    assert out["input_ids"].shape == (2, 8) and out["layer_-1"].shape == (2, 8, 384)
    assert out["input_mask"][0].sum() == 8 and out["input_mask"][1].sum() == 3
    assert list(out["segment_ids"][0]) == [0, 0, 0, 0, 0, 1, 1, 1]  # [CLS] a b c d [SEP] k [SEP]


def test_bad_inputs(minilm_dir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: not valid UTF-8"):
        ef.run(f"hf:{minilm_dir}", bad, tmp_path / "o.npz", progress=False)
    good = tmp_path / "good.txt"
    good.write_text("hello\n")
    with pytest.raises(ValueError, match="--layers: 7 is out of range for a 6-layer model"):
        ef.run(f"hf:{minilm_dir}", good, tmp_path / "o.npz", layers=[7], progress=False)
    assert not (tmp_path / "o.npz").exists()
    with pytest.raises(ValueError, match="--max_seq_length 600"):
        ef.run(f"hf:{minilm_dir}", good, tmp_path / "o.npz", max_seq_length=600, progress=False)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    with pytest.raises(ValueError, match="has 6 tokens but the checkpoint's vocab_size is 30522"):
        ef.run(f"hf:{minilm_dir}", good, tmp_path / "o.npz", vocab=vocab, progress=False)
    assert list(tmp_path.glob("o.npz*")) == []  # nothing half-written


def test_features_from_a_roberta_directory(family_golden, tmp_path):
    """A RoBERTa directory (its config, weights and byte-level BPE vocab.json + merges.txt): pairs
    come out in RoBERTa's layout, <s> a </s></s> b </s>, all in segment 0."""
    g = family_golden("roberta")
    n = json.loads((g.directory / "config.json").read_text())["vocab_size"]
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    letters = ["\u0120", *"abcdefghijklmnopqrstuvwxyz"]
    tokens = specials + letters + [f"\u0120{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    tokens += [f"x{i}" for i in range(n - len(tokens))]
    (tmp_path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((g.directory / name).read_bytes())
    src = tmp_path / "in.txt"
    src.write_text("who won ||| the home team\nhello\n")
    ef.run(f"hf:{tmp_path}", src, tmp_path / "o.npz", layers=[-1], progress=False)
    out = np.load(tmp_path / "o.npz")
    ids, seg = out["input_ids"][0], out["segment_ids"][0]
    real = ids[out["input_mask"][0] > 0].tolist()
    word = lambda w: [tokens.index(c) for c in w]  # noqa: E731
    space = lambda w: [tokens.index("\u0120"), *word(w)]  # noqa: E731  (no merges: Ġ stays a piece)
    assert real == [0, *word("who"), *space("won"), 2, 2, *word("the"), *space("home"), *space("team"), 2]
    assert seg.sum() == 0 and np.isfinite(out["layer_-1"]).all()

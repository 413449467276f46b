"""python -m bert_jax.visualize: the attention page, its data, the PNG and the errors a user meets."""

import io
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.visualize import attention, command, html
from bert_jax.visualize.png import png_bytes
from tests.visualize.conftest import HEADS, LAYERS

TEXT = "the cat sat on the mat, and it was tired."


def page_json(page: str) -> dict:
    (blob,) = re.findall(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(blob)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return attention.load(tiny_checkpoint)


def test_page_is_self_contained_and_carries_every_head(tiny_checkpoint, tmp_path):
    summary = command.run(tiny_checkpoint, TEXT, tmp_path / "a.html", text_b="a dog ran.", layer=2)
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href|url)\s*[=(]\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<link" not in page and not re.search(r"<script[^>]*\ssrc=", page) and "@import" not in page
    assert not re.search(r"\bfetch\(|XMLHttpRequest|WebSocket|\bimport\(", page)  # the script loads nothing
    data = page_json(page)
    words = "the cat sat on the mat , and it was tired .".split()
    assert data["tokens"] == ["[CLS]", *words, "[SEP]", "a", "dog", "ran", ".", "[SEP]"]
    assert data["segments"] == [0] * (len(words) + 2) + [1] * 5
    assert (data["layers"], data["heads"], data["layer"]) == (LAYERS, HEADS, 1)  # --layer 2 = index 1
    probs = np.array(data["attention"])
    n = len(data["tokens"])
    assert probs.shape == (LAYERS, HEADS, n, n) and summary["tokens"] == n and not summary["truncated"]
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=n * 1e-4)  # rows over the real tokens
    assert "truncated" not in page.split("<script")[0]


def test_padding_to_a_bucket_changes_nothing(tiny):
    model, tokenizer = tiny
    att = attention.attention_of(model, tokenizer, "the cat sat")  # 5 tokens, padded to 16
    n = len(att.tokens)
    assert n == 5 and att.probs.shape == (LAYERS, HEADS, n, n)
    ids = jnp.asarray([[tokenizer.cls_id, *tokenizer.tokenize(["the cat sat"]).to_list()[0], tokenizer.sep_id]])
    exact = model(ids, jnp.ones_like(ids), jnp.zeros_like(ids), output_attentions=True).attentions[:, 0]
    np.testing.assert_allclose(att.probs, np.asarray(exact), atol=1e-6)
    assert np.ptp(att.probs) > 0.01  # not uniform (a random model's heads are close to it)


def test_matches_transformers_on_minilm(minilm_dir, minilm_golden):
    """The page's numbers are the model's: MiniLM's attention on the golden input within 1e-4 of transformers."""
    g = minilm_golden
    model, tokenizer = attention.load(f"hf:{minilm_dir}")
    i = next(k for k, b in enumerate(g["texts_b"]) if b)  # a pair
    att = attention.attention_of(model, tokenizer, str(g["texts_a"][i]), str(g["texts_b"][i]))
    lo, hi = g["offsets"][i], g["offsets"][i + 1]
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert att.tokens == [vocab[t] for t in g["input_ids"][lo:hi]]
    ref = g["attentions"][g["attention_offsets"][i]:g["attention_offsets"][i + 1]].reshape(att.probs.shape)
    np.testing.assert_allclose(att.probs, ref, atol=1e-4)
    page = page_json(html.render(att))
    np.testing.assert_allclose(np.array(page["attention"]), ref, atol=1e-4)


def test_long_text_is_truncated_and_said(tiny_checkpoint, tmp_path, capsys):
    summary = command.run(tiny_checkpoint, " ".join(["the cat sat"] * 10), tmp_path / "t.html", max_seq_length=8)
    assert summary["truncated"] and summary["tokens"] == 8
    page = (tmp_path / "t.html").read_text(encoding="utf-8")
    assert "The input had 32 tokens; it was truncated to 8." in page
    assert page_json(page)["tokens"] == ["[CLS]", "the", "cat", "sat", "the", "cat", "sat", "[SEP]"]
    assert "truncated to 8" in capsys.readouterr().err


def test_attention_page_takes_a_model_or_a_spec(tiny, tiny_checkpoint):
    model, tokenizer = tiny
    from_model = page_json(html.attention_page(model, tokenizer, "a dog ran"))
    from_spec = page_json(html.attention_page(tiny_checkpoint, None, "a dog ran"))
    assert from_model == from_spec and from_model["layer"] == LAYERS - 1


def test_png_has_the_heat_maps(tiny):
    from matplotlib.image import imread

    att = attention.attention_of(*tiny, TEXT)
    all_heads, one = png_bytes(att, layer=-1), png_bytes(att, layer=0, head=3)
    for data in (all_heads, one):
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        pixels = imread(io.BytesIO(data))  # [height, width, channels]
        assert pixels.shape[0] > 200 and pixels[..., :3].std() > 0.05
    with pytest.raises(ValueError, match="head 4: expected 0..3"):
        png_bytes(att, head=4)


@pytest.mark.parametrize("kwargs,message", [
    (dict(layer=4), "--layer 4: expected 1..3 or -1..-3"),
    (dict(layer=0), "--layer 0: expected 1..3"),
    (dict(head=5), "--head 5: expected 1..4"),
    (dict(max_seq_length=41), "--max_seq_length 41: expected 3..40"),
    (dict(text_b="  "), "--text_b: expected a non-empty text"),
])
def test_bad_flags_name_themselves(tiny_checkpoint, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        command.run(tiny_checkpoint, TEXT, tmp_path / "x.html", **kwargs)
    assert not list(tmp_path.iterdir())  # nothing written, not even a temporary file


def test_missing_checkpoint_and_vocab(tmp_path, tiny_checkpoint):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nope"))):
        attention.load(f"hf:{tmp_path / 'nope'}")
    (tmp_path / "v.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    with pytest.raises(ValueError, match="v.txt has 6 tokens but the checkpoint .* has vocab_size 20"):
        attention.load(tiny_checkpoint, str(tmp_path / "v.txt"))

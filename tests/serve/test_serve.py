"""The server in-process (Starlette's TestClient): every endpoint, every pooling, MiniLM's
sentence-transformers embeddings, classification from a fine-tuning workdir, dynamic batching,
no compiles after warm-up, and bad requests answered with a 4xx JSON error."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bert_jax.serve import engine as engine_lib
from bert_jax.serve.client import BertClient, ServerError


def metric(client, name: str, **labels) -> float:
    """The value of one sample of /metrics (0 when absent)."""
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_encode_every_pooling(client, tiny_engine):
    texts = ["the film was good", "bad plot and the acting was dull"]
    rows = tiny_engine.encode(texts)
    direct = tiny_engine.run(rows)
    h = tiny_engine.cfg.hidden_size
    for pooling, dim in (("cls", h), ("mean", h), ("pooled", h), ("last4_concat", 3 * h)):
        r = client.post("/v1/encode", json={"texts": texts, "pooling": pooling})
        assert r.status_code == 200, r.text
        body = r.json()
        v = np.asarray(body["vectors"], np.float32)
        assert v.shape == (2, dim) and body["dim"] == dim and body["truncated"] == [False, False]
        np.testing.assert_allclose(v, direct[pooling], rtol=1e-6, atol=1e-6)
        n = client.post("/v1/encode", json={"texts": texts, "pooling": pooling, "normalize": True}).json()
        np.testing.assert_allclose(np.linalg.norm(n["vectors"], axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(direct["cls"], direct["mean"])
    # the tiny model has 2 layers: last4_concat is [CLS] of the embeddings and layers 1, 2
    np.testing.assert_allclose(direct["last4_concat"][:, 2 * h:], direct["cls"])
    assert body["num_tokens"] == [len(r.ids) for r in rows]


def test_tokenize_truncates_and_flags(client):
    long = " ".join(["film"] * 50)
    body = client.post("/v1/tokenize", json={"texts": ["the film", long], "text_pairs": ["was good", "it"]}).json()
    assert body["tokens"][0] == ["[CLS]", "the", "film", "[SEP]", "was", "good", "[SEP]"]
    assert body["segment_ids"][0] == [0, 0, 0, 0, 1, 1, 1]
    assert body["truncated"] == [False, True] and len(body["ids"][1]) == 32
    enc = client.post("/v1/encode", json={"texts": [long, "the film"]}).json()
    assert enc["truncated"] == [True, False] and enc["num_tokens"] == [32, 4]


def test_healthz_and_metrics(client):
    h = client.get("/healthz").json()
    assert h["status"] == "ok" and h["kind"] == "encoder"
    assert h["compiled_shapes"] == [[b, n] for b in (1, 2, 4) for n in (16, 32)]
    before = metric(client, "bert_serve_requests_total", endpoint="encode", code="200")
    client.post("/v1/encode", json={"texts": ["good"]})
    assert metric(client, "bert_serve_requests_total", endpoint="encode", code="200") == before + 1
    assert metric(client, "bert_serve_request_latency_seconds_count", endpoint="encode") >= before + 1
    assert metric(client, "bert_serve_batch_size_count") >= 1
    assert metric(client, "bert_serve_compiles") == 6 and metric(client, "bert_serve_compiled_shapes") == 6


@pytest.mark.parametrize("kwargs,status,words", [
    (dict(json={"texts": []}), 400, "empty list"),
    (dict(json={"texts": "good"}), 400, "expected a list"),
    (dict(json={"texts": ["good", 3]}), 400, "item 1 is int"),
    (dict(json={"texts": ["good"] * 9}), 413, "more than the limit of 8"),
    (dict(json={"texts": ["good"], "pooling": "max"}), 400, "'max' is not one of"),
    (dict(json={"texts": ["good"], "normalize": "yes"}), 400, "'normalize'"),
    (dict(json={"texts": ["good " * 1000]}), 413, "limit is 4096"),
    (dict(content=b'{"texts": ["good"]}', headers={"content-type": "text/plain"}), 415, "application/json"),
    (dict(content=b'{"texts": [', headers={"content-type": "application/json"}), 400, "not valid JSON"),
    (dict(json=["good"]), 400, "JSON object"),
])
def test_bad_requests_get_a_json_4xx(client, kwargs, status, words):
    errors = metric(client, "bert_serve_errors_total", endpoint="encode")
    r = client.post("/v1/encode", **kwargs)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert metric(client, "bert_serve_errors_total", endpoint="encode") == errors + 1
    assert client.post("/v1/encode", json={"texts": ["still serving"]}).status_code == 200


def test_unknown_routes_and_classify_on_an_encoder(client):
    assert client.get("/v1/nope").status_code == 404 and "error" in client.get("/v1/nope").json()
    assert client.get("/v1/encode").status_code == 405
    r = client.post("/v1/classify", json={"texts": ["good"]})
    assert r.status_code == 400 and "not a fine-tuned classifier" in r.json()["error"]



def test_attention_page(client, tiny_engine, make_client):
    """GET /v1/attention: bert_jax.visualize's page for the text through the served model."""
    r = client.get("/v1/attention", params={"text": "the film was good"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    tokens = client.post("/v1/tokenize", json={"texts": ["the film was good"]}).json()
    assert "[CLS]" in r.text and "<script" in r.text and "http://" not in r.text and "https://" not in r.text
    assert tokens and r.text.count("[SEP]") >= 1
    assert client.get("/v1/attention").status_code == 400
    with make_client(tiny_engine, attention_page=None) as without:
        r = without.get("/v1/attention", params={"text": "good"})
        assert r.status_code == 501 and "bert_jax.visualize" in r.json()["error"]


def test_concurrent_requests_share_batches_and_nothing_compiles(tiny_engine, make_client):
    """Eight threads at once with a 300 ms batching window: batches of more than one request, every
    answer equal to the request run alone, and no compile after warm-up."""
    texts = [f"the film was {w}" + " very" * i for i, w in enumerate(["good", "bad", "dull", "fun"] * 2)]
    alone = {t: tiny_engine.run(tiny_engine.encode([t]))["mean"][0] for t in texts}
    with make_client(tiny_engine, max_wait_ms=300) as c:
        compiles = tiny_engine.compiles
        barrier, answers = threading.Barrier(len(texts)), {}

        def ask(text):
            barrier.wait(timeout=10)
            answers[text] = c.post("/v1/encode", json={"texts": [text], "pooling": "mean"}).json()["vectors"][0]

        threads = [threading.Thread(target=ask, args=(t,)) for t in texts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(answers) == sorted(texts)
        for t in texts:
            np.testing.assert_allclose(answers[t], alone[t], rtol=1e-5, atol=1e-5)
        batches = metric(c, "bert_serve_batch_size_count")
        assert batches < len(texts), "no two requests shared a batch"
        assert metric(c, "bert_serve_batch_size_sum") == len(texts)
        # a request larger than max_batch is split over batches; odd sizes and lengths reuse the buckets
        big = c.post("/v1/encode", json={"texts": [f"the {w} end" * k for k in (1, 5) for w in ("a", "b", "c")]})
        assert big.status_code == 200 and len(big.json()["vectors"]) == 6
        assert tiny_engine.compiles == compiles == 6 and metric(c, "bert_serve_compiles") == 6


@pytest.mark.slow  # ~13 s; MiniLM's parity: tests/interop/test_convert.py
def test_minilm_mean_pooling_is_sentence_transformers(minilm_golden, make_client):
    """all-MiniLM-L6-v2's recipe (its modules.json: Transformer → mean Pooling → Normalize) is the
    server's default for that checkpoint, and its vectors equal the recipe applied to transformers'
    last layer (tests/golden/minilm_golden.npz) and to bert_jax's encoder run directly."""
    g = minilm_golden
    single = [i for i, b in enumerate(g["texts_b"]) if not b]
    texts = [str(g["texts_a"][i]) for i in single]
    engine = engine_lib.load("hf:pkg:minilm", max_seq_length=32, max_batch=2)  # 7 texts: 4 batches
    assert (engine.default_pooling, engine.default_normalize) == ("mean", True)
    with make_client(engine) as c:
        body = c.post("/v1/encode", json={"texts": texts}).json()
        pair = c.post("/v1/tokenize", json={"texts": [str(g["texts_a"][6])], "text_pairs": [str(g["texts_b"][6])]})
        with BertClient(client=c) as bc:
            np.testing.assert_allclose(bc.encode(texts), body["vectors"], rtol=1e-6)
            with pytest.raises(ServerError, match="empty list"):
                bc.encode([])
    got = np.asarray(body["vectors"], np.float32)  # [7, 384]
    off = g["offsets"]
    ref = np.stack([g["hidden_states"][-1, off[i]:off[i + 1]].mean(0) for i in single])  # transformers, [7, 384]
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    assert pair.json()["ids"][0] == g["input_ids"][off[6]:off[7]].tolist()
    assert pair.json()["segment_ids"][0] == g["segment_ids"][off[6]:off[7]].tolist()
    # bert_jax's encoder directly (one batch of 7, no buckets): attention-mask-weighted mean of the
    # last layer, L2-normalised
    model = engine.model.bert
    rows = engine.encode(texts)
    ids = np.zeros((len(rows), 32), np.int32)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r.ids)], mask[i, : len(r.ids)] = r.ids, 1
    last = np.asarray(model(ids, mask, np.zeros_like(ids), deterministic=True).sequence_output)  # [7, 32, 384]
    mean = (last * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(got, mean / np.linalg.norm(mean, axis=1, keepdims=True), atol=2e-5)


@pytest.mark.slow  # ~65 s: a fine-tuning run first; the server's engine and routes: the tests above
def test_classify_from_a_finetuning_workdir(sentiment_workdir, make_client):
    engine = engine_lib.load(str(sentiment_workdir), max_seq_length=16, max_batch=2)
    assert engine.kind == "classification" and engine.label_names == ("negative", "positive")
    texts = ["the film was good", "the film was bad and dull", " ".join(["film"] * 40)]
    logits = engine.run(engine.encode(texts[:2]))["logits"]
    with make_client(engine) as c:
        r = c.post("/v1/classify", json={"texts": texts})
        assert r.status_code == 200, r.text
        body = r.json()
        probs = np.asarray(body["probabilities"])
        assert probs.shape == (3, 2) and body["label_names"] == ["negative", "positive"]
        np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-6)
        expected = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        np.testing.assert_allclose(probs[:2], expected, rtol=1e-5)
        assert body["labels"] == [body["label_names"][i] for i in probs.argmax(1)]
        assert body["truncated"] == [False, False, True]
        assert c.post("/v1/classify", json={"texts": ["good"], "text_pairs": ["a", "b"]}).status_code == 400
        assert c.post("/v1/encode", json={"texts": ["good"], "pooling": "pooled"}).status_code == 200
        assert engine.compiles == 2  # batch 1, 2 × length 16: nothing new after warm-up


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        engine_lib.load(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="--max_batch 0"):
        engine_lib.load(str(tmp_path), max_batch=0)


@pytest.mark.slow  # ~45 s: an STS-B fine-tuning run first; classification from a workdir stays fast
def test_classify_pairs_and_regression(stsb_workdir, make_client):
    """A pair task fine-tuned as regression (STS-B): text_pairs go in as [CLS] a [SEP] b [SEP], the
    answer is a score per pair, equal to the model's output for the same features."""
    engine = engine_lib.load(str(stsb_workdir), max_seq_length=32, max_batch=2)
    assert engine.kind == "regression"
    a, b = ["a man is playing a guitar", "a woman is cooking"], ["a man plays guitar", "a dog runs"]
    with make_client(engine) as c:
        r = c.post("/v1/classify", json={"texts": a, "text_pairs": b})
        assert r.status_code == 200, r.text
        scores = np.asarray(r.json()["scores"])
        tokens = c.post("/v1/tokenize", json={"texts": a[:1], "text_pairs": b[:1]}).json()
    assert scores.shape == (2,) and np.isfinite(scores).all()
    expected = engine.run(engine.encode(a, b))["logits"][:, 0]
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    assert str(tokens).count("[SEP]") == 2

"""Fixtures of the server tests: a tiny random BERT as ``hf:DIR`` (tests/golden/tiny_bert with a
made-up 99-token vocabulary), a tiny fine-tuned sentiment workdir, and in-process test clients."""

from __future__ import annotations

import shutil

import pytest

WORDS = ("good great fine nice happy love best fun warm bright bad awful poor sad hate worst dull cold dark "
         "boring the a film movie story is was and it this not very so plot acting cast scene end music").split()


def write_vocab(path, size: int) -> None:
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    filler = [f"w{i}" for i in range(size - len(special) - len(WORDS))]
    path.write_text("\n".join(special + WORDS + filler) + "\n")


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory, golden_file):
    """A random 2-layer BERT (hidden 32, vocabulary 99, pooler) with a vocab.txt beside it."""
    d = tmp_path_factory.mktemp("tiny_hf")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(golden_file(f"tiny_bert/{name}"), d / name)
    write_vocab(d / "vocab.txt", 99)
    return d


@pytest.fixture(scope="session")
def sentiment_workdir(tmp_path_factory, load_config):
    """configs/sentiment.py:runlocal from scratch for 2 steps on 40 made-up reviews."""
    from bert_jax import launch

    d = tmp_path_factory.mktemp("sentiment")
    write_vocab(d / "vocab.txt", 120)
    pos, neg = WORDS[:10], WORDS[10:20]
    lines = [f"{i % 2}\tthe film was {(pos if i % 2 else neg)[i % 10]} and {(pos if i % 2 else neg)[(i * 3) % 10]}"
             for i in range(40)]
    (d / "reviews.tsv").write_text("\n".join(lines) + "\n")
    c = load_config("sentiment", "runlocal")
    c.vocab, c.task.source = str(d / "vocab.txt"), str(d / "reviews.tsv")
    c.num_train_steps, c.log_every, c.progress = 2, 1, False
    c.max_seq_length = 32
    launch.run(c, d / "workdir")
    return d / "workdir"


def _make_client(engine, **kw):
    from starlette.testclient import TestClient

    from bert_jax.serve.app import create_app

    engine.warm_up()
    return TestClient(create_app(engine, **kw))


@pytest.fixture(scope="session")
def make_client():
    """``make_client(engine, **create_app_kwargs)``: warms the engine up and returns a TestClient
    (use it as a context manager: that starts and stops the batcher)."""
    return _make_client


@pytest.fixture(scope="module")
def tiny_engine(tiny_hf_dir):
    from bert_jax.serve import engine

    return engine.load(f"hf:{tiny_hf_dir}", max_seq_length=32, max_batch=4)


@pytest.fixture(scope="module")
def client(tiny_engine):
    """An in-process client of the tiny model's server (batches of up to 4, lengths 16 and 32)."""
    with _make_client(tiny_engine, max_texts=8, max_body_bytes=4096) as c:
        yield c


@pytest.fixture(scope="session")
def stsb_workdir(tmp_path_factory, load_config, glue_dir):
    """configs/glue.py:task=stsb,runlocal (sentence pairs, regression) from scratch for 2 steps."""
    from bert_jax import launch

    d = tmp_path_factory.mktemp("stsb")
    words = sorted({w for line in (glue_dir / "STS-B" / "train.tsv").read_text().lower().split() for w in [line]})
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    c = load_config("glue", "task=stsb,runlocal")
    c.vocab, c.task.source = str(d / "vocab.txt"), str(glue_dir)
    c.num_train_steps, c.log_every, c.progress = 2, 1, False
    c.max_seq_length = 32
    launch.run(c, d / "workdir")
    return d / "workdir"

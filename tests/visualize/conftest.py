"""A tiny random checkpoint (3 layers x 4 heads, a 20-word vocabulary) for the attention page's tests."""

import pytest

from bert_jax.interop.pretrained import save_orbax
from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.models import create

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran",
         "it", "was", "tired", ".", ",", "##s", "and"]
LAYERS, HEADS = 3, 4


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """``orbax:DIR`` spec of a random 3-layer, 4-head encoder with its vocab.txt."""
    d = tmp_path_factory.mktemp("tiny_attention")
    (d / "words.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    cfg = BertConfig.from_size("tiny", num_layers=LAYERS, num_heads=HEADS, vocab_size=len(WORDS),
                               max_position_embeddings=40)
    save_orbax(create(BertEncoder, cfg, seed=1), cfg, d / "ckpt", vocab_file=d / "words.txt")
    return f"orbax:{d / 'ckpt'}"

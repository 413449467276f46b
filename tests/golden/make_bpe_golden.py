"""Writes RoBERTa byte-level BPE goldens in tests/golden/ with ``tokenizers`` + Hugging Face transformers.

Run by ``make golden`` in the golden venv (``~/.cache/bert_jax/golden-venv``: transformers 5.23.0 and
the ``tokenizers`` it depends on). Never imports bert_jax or jax; it loads
``input_pipeline/package_data.py`` by file path (stdlib only) for its real text. Outputs (see
tests/golden/README.md):

- ``roberta_bpe/vocab.json`` + ``merges.txt``: a small byte-level BPE (2,000 ids) trained with
  ``tokenizers.ByteLevelBPETokenizer`` on the article text of the gensim Wikipedia excerpt;
- ``roberta_tokenizer_golden.npz``: ``RobertaTokenizer.from_pretrained(roberta_bpe/)`` ids for every
  movie-review sentence, pairs of them, and edge cases. A plain-Python GPT-2 byte-level BPE (the
  original algorithm, written out below) is run on every row too as an independent cross-check;
  rows where it disagrees are recorded.
"""

from __future__ import annotations

import argparse
import bz2
import hashlib
import itertools
import json
import platform
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import regex
import tokenizers
import transformers
from golden_common import (  # tests/golden/golden_common.py (the script's directory)
    load_package_data,
    read_review_sentences,
)
from tokenizers import ByteLevelBPETokenizer
from transformers import RobertaTokenizer

HERE = Path(__file__).resolve().parent

REPO = HERE.parent.parent
REGENERATE = "make golden (tests/golden/make_bpe_golden.py in ~/.cache/bert_jax/golden-venv)"
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
TRAINING = dict(vocab_size=2000, min_frequency=2, special_tokens=SPECIALS)
NUM_PAIRS = 500  # review sentences (2k, 2k+1) as pairs, k < NUM_PAIRS

EDGE_CASES = [
    ("", ""),
    (" leading space, trailing space ", ""),
    ("two  spaces,\tTAB, new\nline\r\n and   runs of    spaces   ", ""),
    ("don't won't I'm we've they'll she'd it's O'Neil 'quoted' ''double''", ""),
    ("Numbers 3.14, 1,000,000 and 12345678901234567890; 2nd 10th 1990s", ""),
    ("Café déjà vu in Zürich — naïve façade", ""),
    ("東京タワーと北京の天安門, 서울 Привет Ёж مرحبا שָׁלוֹם नमस्ते", ""),
    ("emoji \U0001f600\U0001f469\u200d\U0001f4bb ☃\ufe0f 🇫🇷 and a zero\u200bwidth space", ""),
    ("A film <mask> here </s> and<s>, <pad> <unk> <MASK> < s>", ""),
    ("What?! (Really) -- #1 @home $5 50% [x] {y} a/b c\\d ~tilde~ `tick`", ""),
    ("ThE QuIcK BrOwN fOx JUMPS over the LAZY dog", ""),
    ("pneumonoultramicroscopicsilicovolcanoconiosis", ""),
    ("Who won?", "The home team, 3-1."),
    ("  ", "  "),
    ("Is this the first segment?", "Yes, and THIS is the second one."),
]


def _versions() -> dict[str, str]:
    return {"transformers_version": transformers.__version__, "tokenizers_version": tokenizers.__version__,
            "regex_version": regex.__version__, "numpy_version": np.__version__,
            "python_version": platform.python_version()}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------------- training text

_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_REF = re.compile(r"<!--.*?-->|<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.DOTALL)
_LINK = re.compile(r"\[\[(?:[^\[\]|]*\|)?([^\[\]]*)\]\]")
_MARKUP_LINE = re.compile(r"^[|!{}*#=:;]")


def wiki_text(dump: Path) -> list[str]:
    """Article (namespace 0, not redirect) prose of a Wikipedia XML dump, crudely stripped of markup:
    comments, <ref>s and {{templates}} dropped, [[links]] keep their text, bold/italic quotes dropped,
    lines that start with table/list/heading markup dropped. Deterministic; training text only."""
    texts = []
    with bz2.open(dump) as f:
        for _, el in ET.iterparse(f):
            if not el.tag.endswith("}page"):
                continue
            text = el.find("{*}revision/{*}text")
            if el.find("{*}ns").text == "0" and el.find("{*}redirect") is None and text is not None:
                t = _REF.sub("", text.text or "")
                while (stripped := _TEMPLATE.sub("", t)) != t:
                    t = stripped
                t = _LINK.sub(r"\1", t).replace("'''", "").replace("''", "")
                lines = [ln.strip() for ln in t.split("\n")]
                texts.extend(ln for ln in lines if ln and not _MARKUP_LINE.match(ln))
            el.clear()
    return texts


# --------------------------------------------------------------- independent reference: GPT-2's BPE

_GPT2_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (a space is "Ġ")."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Gpt2Bpe:
    """OpenAI's GPT-2 encoder.py algorithm (no caching tricks), plus HF's added-token split on SPECIALS."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]):
        self.vocab, self.ranks = vocab, {m: r for r, m in enumerate(merges)}
        self.byte_char = _bytes_to_unicode()
        self.cache: dict[str, tuple[str, ...]] = {}
        self.special = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")

    def bpe(self, word: str) -> tuple[str, ...]:
        if word not in self.cache:
            self.cache[word] = self._bpe(word)
        return self.cache[word]

    def _bpe(self, word: str) -> tuple[str, ...]:
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get(pair, float("inf")), i) for i, pair in enumerate(itertools.pairwise(parts))]
            rank, i = min(pairs)
            if rank == float("inf"):
                break
            a, b = parts[i], parts[i + 1]
            merged, j = [], 0
            while j < len(parts):  # merge every occurrence of (a, b), left to right
                if j < len(parts) - 1 and parts[j] == a and parts[j + 1] == b:
                    merged.append(a + b)
                    j += 2
                else:
                    merged.append(parts[j])
                    j += 1
            parts = merged
        return tuple(parts)

    def encode(self, text: str) -> list[int]:
        ids = []
        for chunk in self.special.split(text):
            if chunk in SPECIALS:
                ids.append(self.vocab[chunk])
                continue
            for word in _GPT2_PATTERN.findall(chunk):
                mapped = "".join(self.byte_char[b] for b in word.encode("utf-8"))
                ids.extend(self.vocab[p] for p in self.bpe(mapped))
        return ids

    def encode_pair(self, a: str, b: str) -> list[int]:
        cls, sep = self.vocab["<s>"], self.vocab["</s>"]
        return [cls, *self.encode(a), sep] + ([sep, *self.encode(b), sep] if b else [])


# -------------------------------------------------------------------------------------------- files

def train_bpe(texts: list[str], out_dir: Path) -> None:
    bpe = ByteLevelBPETokenizer()  # add_prefix_space=False, as RobertaTokenizer
    bpe.train_from_iterator(texts, show_progress=False, **TRAINING)
    out_dir.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(out_dir))
    print(f"{out_dir.name}/: {bpe.get_vocab_size()} ids trained on {len(texts)} lines "
          f"({sum(map(len, texts))} characters)")


def _concat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(rows) + 1, np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    flat = np.fromiter((i for r in rows for i in r), np.int32, count=int(offsets[-1]))
    return flat, offsets


def make_golden(bpe_dir: Path, reviews: Path, out: Path) -> None:
    sentences = read_review_sentences(reviews)
    tok = RobertaTokenizer.from_pretrained(bpe_dir)
    vocab = json.loads((bpe_dir / "vocab.json").read_text(encoding="utf-8"))
    # transformers 5's BertTokenizer silently ignored its vocab_file; make sure this one read the files.
    assert len(tok) == len(vocab) == TRAINING["vocab_size"], (len(tok), len(vocab))
    assert (tok.cls_token_id, tok.sep_token_id) == (vocab["<s>"], vocab["</s>"])
    merges = [tuple(ln.split(" ")) for ln in (bpe_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
              if not ln.startswith("#version")]
    reference = Gpt2Bpe(vocab, merges)
    pairs = np.array([(2 * k, 2 * k + 1) for k in range(NUM_PAIRS)], np.int32)
    inputs = [(s, "") for s in sentences] + [(sentences[i], sentences[j]) for i, j in pairs] + EDGE_CASES
    rows, check = [], []
    for a, b in inputs:
        enc = tok(a, b or None, truncation=False, padding=False, return_token_type_ids=True)
        assert not any(enc["token_type_ids"]), "RoBERTa's segment ids are all 0"
        rows.append(enc["input_ids"])
        check.append(reference.encode_pair(a, b))
    mismatch = np.array([i for i, (x, y) in enumerate(zip(rows, check, strict=True)) if x != y], np.int32)
    ids, offsets = _concat(rows)
    np.savez_compressed(
        out, ids=ids, offsets=offsets,
        num_source_lines=np.int32(len(sentences)), pairs=pairs,
        extra_texts_a=np.array([a for a, _ in EDGE_CASES]), extra_texts_b=np.array([b for _, b in EDGE_CASES]),
        reference_mismatch_rows=mismatch,
        source_sha256=np.str_(_sha256("\n".join(sentences).encode("utf-8"))),
        source_file=np.str_(f"{reviews.name} (vaderSentiment==3.3.2 sdist, column 3, \\r stripped)"),
        vocab_sha256=np.str_(_sha256((bpe_dir / "vocab.json").read_bytes())),
        merges_sha256=np.str_(_sha256((bpe_dir / "merges.txt").read_bytes())),
        vocab_file=np.str_(f"tests/golden/roberta_bpe/ (tokenizers ByteLevelBPETokenizer trainer, {TRAINING}, "
                           f"on the gensim==4.4.0 Wikipedia excerpt's article lines)"),
        reference=np.str_("transformers RobertaTokenizer.from_pretrained(roberta_bpe/): <s> a </s> "
                          "(</s> b </s>), no truncation; cross-check: plain-Python GPT-2 BPE"),
        regenerate=np.str_(REGENERATE),
        **{k: np.str_(v) for k, v in _versions().items()},
    )
    print(f"{out.name}: {len(sentences)} review lines + {len(pairs)} pairs + {len(EDGE_CASES)} extra texts, "
          f"{ids.size} ids, {out.stat().st_size} bytes; the Python GPT-2 BPE disagrees on {mismatch.size} "
          f"rows {mismatch[:20].tolist()}")
    for i in mismatch[:5]:
        print("  hf    ", tok.convert_ids_to_tokens(rows[i]))
        print("  python", tok.convert_ids_to_tokens(check[i]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wikipedia", type=Path, help="the gensim Wikipedia excerpt (default: package data)")
    parser.add_argument("--reviews", type=Path, help="movieReviewSnippets_GroundTruth.txt (default: package data)")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    pkg = load_package_data()
    train_bpe(wiki_text(args.wikipedia or pkg.wikipedia_excerpt()), args.out / "roberta_bpe")
    make_golden(args.out / "roberta_bpe", args.reviews or pkg.movie_review_snippets(),
                args.out / "roberta_tokenizer_golden.npz")
    for p in [args.out / "roberta_tokenizer_golden.npz", *(args.out / "roberta_bpe").iterdir()]:
        assert p.stat().st_size < 1_500_000, f"{p} is {p.stat().st_size} bytes (limit 1.5 MB)"


if __name__ == "__main__":
    sys.exit(main())

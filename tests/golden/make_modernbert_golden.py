"""Writes ModernBERT parity goldens with Hugging Face transformers: two small random models as Hub directories.

Run it with ``make golden`` (after make_family_golden.py; the same venv: torch==2.13.0,
transformers==5.23.0). It never imports bert_jax or jax. No released ModernBERT is available
offline, so each golden is a small, randomly initialised ``ModernBertForMaskedLM`` (fixed seeds) whose
every parameter is then moved away from HF's initialisation (``0.1 * N(0, 1)`` added), so a converter
that drops, swaps or mis-lays any tensor changes the outputs. Each model is a directory
``tests/golden/modernbert_<name>/`` (see tests/golden/README.md):

- ``model.safetensors`` and ``config.json``: what ``save_pretrained`` writes (transformers 5's config
  form: ``layer_types``, ``rope_parameters``);
- ``config_released.json``: the same model's config in the form the released checkpoints carry
  (``global_attn_every_n_layers``, ``global_rope_theta``, ``local_rope_theta``; no ``layer_types`` or
  ``rope_parameters``). The script checks that transformers builds the same model from it;
- ``outputs.npz``: right-padded inputs longer than the local window, the hidden states and the MLM
  logits in eval mode (float32), and the versions;
- ``l3`` only: a ModernBERT-style ``tokenizer.json`` (byte-level BPE, GPT-NeoX style: NFC, ByteLevel
  pre-tokenizer, ``[CLS] $A [SEP]`` template, ``[UNK] [CLS] [SEP] [PAD] [MASK]`` added after the BPE
  vocabulary of tests/golden/roberta_bpe/) with ``tokenizer_config.json``, and ``tokenizer_ids.npz``:
  ``transformers.AutoTokenizer.from_pretrained`` ids of review sentences, pairs and edge cases.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from golden_common import (  # tests/golden/golden_common.py
    load_package_data,
    perturb,
    read_review_sentences,
    start,
    versions,
)
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import AutoTokenizer, ModernBertConfig, ModernBertForMaskedLM, ModernBertModel

HERE = Path(__file__).resolve().parent
REGENERATE = "make golden (tests/golden/make_modernbert_golden.py in ~/.cache/bert_jax/golden-venv)"
LIMIT = 1_500_000  # bytes per file

# [UNK] [CLS] [SEP] [PAD] [MASK] after the 2,000 BPE ids, in ModernBERT's order (its are 50280..50284).
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
BPE_SIZE = 2000
TOKEN_IDS = dict(pad_token_id=BPE_SIZE + 3, bos_token_id=BPE_SIZE + 1, eos_token_id=BPE_SIZE + 2,
                 cls_token_id=BPE_SIZE + 1, sep_token_id=BPE_SIZE + 2)

# l3: released ModernBERT's switches (no biases, thetas 160k / 10k, every third layer global) at a
# small size, the vocabulary padded to a multiple of 64 past the tokenizer's 2,005 ids, as ModernBERT's.
# l4: every bias on (attention, MLP, norms, head), other thetas, every second layer global, eps 1e-6.
MODELS = {
    "l3": dict(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=3,
               global_rope_theta=160_000.0, local_rope_theta=10_000.0, norm_eps=1e-5, **TOKEN_IDS),
    "l4": dict(vocab_size=160, hidden_size=96, intermediate_size=64, num_hidden_layers=4, num_attention_heads=6,
               max_position_embeddings=64, local_attention=16, global_attn_every_n_layers=2,
               global_rope_theta=20_000.0, local_rope_theta=5_000.0, norm_eps=1e-6, attention_bias=True,
               mlp_bias=True, norm_bias=True, classifier_bias=True, pad_token_id=0, bos_token_id=1,
               eos_token_id=2, cls_token_id=1, sep_token_id=2),
}
# name -> (length, real lengths of the three rows): rows longer and shorter than the window
INPUTS = {"l3": (24, (24, 17, 9)), "l4": (40, (40, 29, 13))}
RELEASED_KEYS = ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta")

NUM_REVIEWS, NUM_PAIRS = 1000, 200
EDGE_CASES = [
    ("", ""),
    (" leading space, trailing space ", ""),
    ("two  spaces,\tTAB, new\nline\r\n and   runs of    spaces   ", ""),
    ("don't won't I'm we've they'll she'd it's O'Neil 'quoted' ''double''", ""),
    ("Café déjà vu in Zürich — naïve façade; decomposed Cafe\u0301 (NFC)", ""),
    ("東京タワーと北京の天安門, 서울 Привет Ёж مرحبا नमस्ते", ""),
    ("emoji \U0001f600\U0001f469\u200d\U0001f4bb ☃\ufe0f and a zero\u200bwidth space", ""),
    ("A film [MASK] here [SEP] and[CLS], [PAD] [UNK] [mask] <s> </s>", ""),
    ("What?! (Really) -- #1 @home $5 50% [x] {y} a/b c\\d ~tilde~ `tick`", ""),
    ("Who won?", "The home team, 3-1."),
    ("Is this the first segment?", "Yes, and THIS is the second one."),
]


def inputs(seed: int, name: str, vocab: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Three right-padded rows; ids drawn below the specials (and above 4), padding = pad_id, mask 0."""
    length, lengths = INPUTS[name]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, min(vocab, BPE_SIZE), (len(lengths), length), generator=gen)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = pad_id
    return {"input_ids": ids, "attention_mask": mask}


def released_config(config_json: dict, spec: dict) -> dict:
    """The Hub's form of the config transformers 5 wrote: the pattern and thetas as plain keys."""
    out = {k: v for k, v in config_json.items() if k not in ("layer_types", "rope_parameters", "dtype")}
    out |= {k: spec[k] for k in RELEASED_KEYS} | {"torch_dtype": "float32", "transformers_version": "4.48.0"}
    return dict(sorted(out.items()))


def make_model(name: str, seed: int, out: Path) -> None:
    spec = MODELS[name]
    every = spec["global_attn_every_n_layers"]
    layer_types = ["full_attention" if i % every == 0 else "sliding_attention"
                   for i in range(spec["num_hidden_layers"])]
    rope = {"full_attention": {"rope_type": "default", "rope_theta": spec["global_rope_theta"]},
            "sliding_attention": {"rope_type": "default", "rope_theta": spec["local_rope_theta"]}}
    torch.manual_seed(seed)  # built as transformers 5 builds one: layer_types and rope_parameters
    config = ModernBertConfig(**{k: v for k, v in spec.items() if k not in RELEASED_KEYS}, layer_types=layer_types,
                              rope_parameters=rope)
    model = ModernBertForMaskedLM(config)
    perturb(model, seed + 1)
    assert model.decoder.weight is model.model.embeddings.tok_embeddings.weight
    model.eval()
    d = out / f"modernbert_{name}"
    if d.exists():
        shutil.rmtree(d)
    model.save_pretrained(d, safe_serialization=True)
    config_json = json.loads((d / "config.json").read_text())
    assert config_json["layer_types"] == layer_types
    assert config_json["rope_parameters"]["full_attention"]["rope_theta"] == spec["global_rope_theta"]
    assert config_json["rope_parameters"]["sliding_attention"]["rope_theta"] == spec["local_rope_theta"]
    assert not any(k in config_json for k in RELEASED_KEYS)
    (d / "config_released.json").write_text(json.dumps(released_config(config_json, spec), indent=2) + "\n")

    x = inputs(seed + 2, name, spec["vocab_size"], spec["pad_token_id"])
    with torch.no_grad():
        out_mlm = model(**x, output_hidden_states=True)
        base = model.model(**x)
        eager = ModernBertForMaskedLM.from_pretrained(d, attn_implementation="eager").eval()(**x)
    real = x["attention_mask"].bool()
    assert torch.equal(out_mlm.hidden_states[-1], base.last_hidden_state)  # after the final norm
    eager_diff = (eager.logits - out_mlm.logits)[real].abs().max().item()
    assert eager_diff < 1e-4, eager_diff
    # The released config form builds the same model: same pattern, thetas, outputs (bit for bit).
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(d / "model.safetensors", tmp)
        shutil.copy(d / "config_released.json", Path(tmp) / "config.json")
        again = ModernBertForMaskedLM.from_pretrained(tmp).eval()
        assert again.config.layer_types == config_json["layer_types"]
        assert again.config.rope_parameters == config_json["rope_parameters"]
        with torch.no_grad():
            assert torch.equal(again(**x).logits, out_mlm.logits)
    # The bare encoder saves its names without the "model." prefix.
    with tempfile.TemporaryDirectory() as tmp:
        ModernBertModel(model.config).save_pretrained(tmp)
        names = safetensors.safe_open(Path(tmp) / "model.safetensors", "np").keys()
        assert all(not k.startswith("model.") for k in names) and "final_norm.weight" in names
    np.savez_compressed(
        d / "outputs.npz", input_ids=x["input_ids"].numpy().astype(np.int32),
        attention_mask=x["attention_mask"].numpy().astype(np.int32),
        hidden_states=torch.stack(out_mlm.hidden_states).numpy(), last_hidden_state=base.last_hidden_state.numpy(),
        logits=out_mlm.logits.numpy(), eager_vs_sdpa_max_abs_diff=np.float32(eager_diff),
        attn_implementation=np.str_(model.config._attn_implementation),
        regenerate=np.str_(REGENERATE), **versions(torch, transformers, tokenizers, safetensors))
    for p in sorted(d.iterdir()):
        p.chmod(0o644)  # save_pretrained leaves model.safetensors private
        assert p.stat().st_size < LIMIT, f"{p} is {p.stat().st_size} bytes (limit {LIMIT})"
    print(f"{d.name}/: {sum(1 for _ in model.parameters())} tensors, layer_types {config_json['layer_types']}, "
          f"eager vs {model.config._attn_implementation} {eager_diff:.1e}, "
          f"{sum(p.stat().st_size for p in d.iterdir())} bytes")


def make_tokenizer(d: Path, bpe_dir: Path, reviews: Path) -> None:
    """A ModernBERT-style tokenizer.json over roberta_bpe/'s BPE, and HF's ids for real text."""
    bpe = models.BPE.from_file(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt"))
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=t == "[MASK]") for t in SPECIALS])
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    assert list(ids.values()) == list(range(BPE_SIZE, BPE_SIZE + len(SPECIALS))), ids
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 8192,
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
        "unk_token": "[UNK]"}, indent=2) + "\n")
    hf = AutoTokenizer.from_pretrained(d)
    assert len(hf) == BPE_SIZE + len(SPECIALS), len(hf)
    assert (hf.cls_token_id, hf.sep_token_id, hf.pad_token_id) == (ids["[CLS]"], ids["[SEP]"], ids["[PAD]"])
    all_sentences = read_review_sentences(reviews)
    sentences = all_sentences[:NUM_REVIEWS]
    pairs = np.array([(2 * k, 2 * k + 1) for k in range(NUM_PAIRS)], np.int32)
    texts = [(s, "") for s in sentences] + [(sentences[i], sentences[j]) for i, j in pairs] + EDGE_CASES
    rows, types = [], []
    for a, b in texts:
        enc = hf(a, b or None, truncation=False, padding=False, return_token_type_ids=True)
        rows.append(enc["input_ids"])
        types.append(enc["token_type_ids"])
    offsets = np.zeros(len(rows) + 1, np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    np.savez_compressed(
        d / "tokenizer_ids.npz", ids=np.concatenate(rows).astype(np.int32),
        token_type_ids=np.concatenate(types).astype(np.int32), offsets=offsets,
        num_source_lines=np.int32(len(sentences)), pairs=pairs,
        extra_texts_a=np.array([a for a, _ in EDGE_CASES]), extra_texts_b=np.array([b for _, b in EDGE_CASES]),
        source_file=np.str_(f"{reviews.name} (vaderSentiment==3.3.2 sdist, column 3, \\r stripped), "
                            f"first {NUM_REVIEWS} sentences"),
        source_sha256=np.str_(hashlib.sha256("\n".join(all_sentences).encode("utf-8")).hexdigest()),
        tokenizer_sha256=np.str_(hashlib.sha256((d / "tokenizer.json").read_bytes()).hexdigest()),
        reference=np.str_("transformers AutoTokenizer.from_pretrained(modernbert_l3/) (PreTrainedTokenizerFast "
                          "over tokenizer.json): [CLS] a [SEP] (b [SEP]), no truncation"),
        regenerate=np.str_(REGENERATE), **versions(torch, transformers, tokenizers, safetensors))
    print(f"{d.name}/tokenizer.json: {len(hf)} ids; tokenizer_ids.npz: {len(rows)} rows, {offsets[-1]} ids")


def main(argv: list[str] | None = None) -> None:
    args = start(__doc__, HERE, argv)
    args.out.mkdir(parents=True, exist_ok=True)
    make_model("l3", 60, args.out)
    make_model("l4", 70, args.out)
    make_tokenizer(args.out / "modernbert_l3", HERE / "roberta_bpe", load_package_data().movie_review_snippets())
    for p in (args.out / "modernbert_l3").iterdir():
        assert p.stat().st_size < LIMIT, f"{p} is {p.stat().st_size} bytes (limit {LIMIT})"


if __name__ == "__main__":
    sys.exit(main())

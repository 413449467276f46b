"""Writes parity goldens for the BERT family (ALBERT, ELECTRA, RoBERTa) with Hugging Face transformers.

Run it with ``make golden`` (its third line, after make_golden.py; the same venv: torch==2.13.0,
transformers==5.23.0). It never imports bert_jax or jax. There is no released ALBERT/ELECTRA/RoBERTa
checkpoint offline, so each golden is a tiny, randomly initialised Hugging Face model (fixed seeds)
whose every parameter is then moved away from HF's 0/1 initialisation, so a converter that drops,
swaps or mis-lays any tensor changes the outputs. Per family one ``<family>_golden.npz`` holds:

- ``tensor/<name>``: every tensor of the model's ``save_pretrained`` safetensors file (tied copies
  dropped, as on the Hub), ``config_json``: its config.json text;
- ``input_ids``, ``attention_mask``, ``token_type_ids`` [3, 12] int32: right-padded rows;
- the outputs in eval mode (float32), see tests/golden/README.md.

ELECTRA has two networks in one file (prefixes ``disc_`` and ``gen_``): an ``ElectraForPreTraining``
discriminator (E=16, H=32) and an ``ElectraForMaskedLM`` generator (hidden 16, E=16) whose embedding
tables and embedding LayerNorm equal the discriminator's, as in ELECTRA's pre-training.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import safetensors
import torch
import transformers
from golden_common import perturb, saved, start, versions  # tests/golden/golden_common.py (the script's directory)
from transformers import (
    AlbertConfig,
    AlbertForPreTraining,
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaModel,
)

HERE = Path(__file__).resolve().parent
REGENERATE = "make golden (tests/golden/make_family_golden.py in ~/.cache/bert_jax/golden-venv)"
VOCAB, LENGTH, LENGTHS, SPLITS = 120, 12, (12, 9, 5), (7, 5, 5)  # SPLITS: where segment B starts
COMMON = dict(vocab_size=VOCAB, num_attention_heads=4, hidden_dropout_prob=0.1,
              attention_probs_dropout_prob=0.1, initializer_range=0.02)

ALBERT = dict(COMMON, embedding_size=16, hidden_size=32, num_hidden_layers=3, intermediate_size=37,
              max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu_new", layer_norm_eps=1e-12,
              num_hidden_groups=1, inner_group_num=1, pad_token_id=0, classifier_dropout_prob=0.1)
ELECTRA_DISC = dict(COMMON, embedding_size=16, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                    max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
                    pad_token_id=0)
# The generator at fraction 0.5 of the discriminator: hidden 16, 2 heads, intermediate 32, same E.
ELECTRA_GEN = dict(ELECTRA_DISC, hidden_size=16, num_attention_heads=2, intermediate_size=32)
ROBERTA = dict(COMMON, hidden_size=32, num_hidden_layers=2, intermediate_size=37, max_position_embeddings=40,
               type_vocab_size=1, hidden_act="gelu", layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
               eos_token_id=2)


def inputs(seed: int, pad_id: int, *, segments: bool) -> dict[str, torch.Tensor]:
    """Three right-padded rows of real lengths 12, 9, 5 (ids avoid 0..2, the special/pad ids)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(LENGTHS), LENGTH), generator=gen)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for i, (n, split) in enumerate(zip(LENGTHS, SPLITS, strict=True)):
        mask[i, :n] = 1
        ids[i, n:] = pad_id
        if segments:
            types[i, split:n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def as_np(x: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.numpy().astype(np.int32) for k, v in x.items()}


def make_albert() -> dict[str, np.ndarray]:
    torch.manual_seed(10)
    model = AlbertForPreTraining(AlbertConfig(**ALBERT))
    perturb(model, 11)
    assert model.predictions.decoder.weight is model.albert.embeddings.word_embeddings.weight
    model.eval()
    x = inputs(12, 0, segments=True)
    out = model(**x, output_hidden_states=True)
    base = model.albert(**x)
    assert torch.allclose(out.hidden_states[-1], base.last_hidden_state)
    return {**saved(model), **as_np(x), "last_hidden_state": base.last_hidden_state.numpy(),
            "pooler_output": base.pooler_output.numpy(), "prediction_logits": out.prediction_logits.numpy(),
            "sop_logits": out.sop_logits.numpy()}


def make_electra() -> dict[str, np.ndarray]:
    torch.manual_seed(20)
    disc = ElectraForPreTraining(ElectraConfig(**ELECTRA_DISC))
    perturb(disc, 21)
    gen = ElectraForMaskedLM(ElectraConfig(**ELECTRA_GEN))
    perturb(gen, 22)
    with torch.no_grad():  # ELECTRA's generator and discriminator share the embeddings (tables + LayerNorm)
        for name, p in gen.electra.embeddings.named_parameters():
            p.copy_(disc.electra.embeddings.get_parameter(name))
    assert gen.generator_lm_head.weight is gen.electra.embeddings.word_embeddings.weight
    assert not hasattr(gen.electra, "embeddings_project") and hasattr(disc.electra, "embeddings_project")
    disc.eval(), gen.eval()
    x = inputs(23, 0, segments=True)
    d, g = disc(**x, output_hidden_states=True), gen(**x, output_hidden_states=True)
    return {**saved(disc, "disc_"), **saved(gen, "gen_"), **as_np(x),
            "disc_last_hidden_state": d.hidden_states[-1].numpy(), "disc_logits": d.logits.numpy(),
            "gen_last_hidden_state": g.hidden_states[-1].numpy(), "gen_logits": g.logits.numpy()}


def make_roberta() -> dict[str, np.ndarray]:
    """A RobertaForMaskedLM plus a pooler, as the Hub's roberta-base checkpoint holds both."""
    torch.manual_seed(30)
    cfg = RobertaConfig(**ROBERTA)
    mlm = RobertaForMaskedLM(cfg)
    perturb(mlm, 31)
    base = RobertaModel(cfg)  # the same encoder with a pooler
    perturb(base, 32)
    missing, unexpected = base.load_state_dict(mlm.roberta.state_dict(), strict=False)
    assert unexpected == [] and all(k.startswith("pooler.") for k in missing), (missing, unexpected)
    assert mlm.lm_head.decoder.weight is mlm.roberta.embeddings.word_embeddings.weight
    mlm.eval(), base.eval()
    x = inputs(33, ROBERTA["pad_token_id"], segments=False)
    out, enc = mlm(**x), base(**x)
    tensors = saved(mlm)
    tensors |= {f"tensor/roberta.{k}": v.numpy() for k, v in base.state_dict().items() if k.startswith("pooler.")}
    return {**tensors, **as_np(x), "last_hidden_state": enc.last_hidden_state.numpy(),
            "pooler_output": enc.pooler_output.numpy(), "prediction_logits": out.logits.numpy()}


def main(argv: list[str] | None = None) -> None:
    args = start(__doc__, HERE, argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for family, make in (("albert", make_albert), ("electra", make_electra), ("roberta", make_roberta)):
        with torch.no_grad():
            arrays = make()
        path = args.out / f"{family}_golden.npz"
        np.savez_compressed(path, **arrays, regenerate=np.str_(REGENERATE),
                            **versions(torch, transformers, safetensors))
        size = path.stat().st_size
        assert size < 500_000, f"{path} is {size} bytes (limit 500 KB)"
        n = sum(k.endswith("config_json") for k in arrays)
        print(f"{path.name}: {sum('tensor/' in k for k in arrays)} tensors, {n} config(s), {size} bytes")


if __name__ == "__main__":
    sys.exit(main())

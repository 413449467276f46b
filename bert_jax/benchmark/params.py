"""Parameter counts of the benchmarked model against the papers' figures.

`param_counts` reads the trained parameters from the step's state (what the optimizer updates:
encoder, heads, and for ELECTRA the generator too) and the encoder's share of them (``bert/``:
the discriminator for ELECTRA), then restates the encoder at the paper's vocabulary and the recipe's
position table, which is what the papers' tables count. Sources, with the vocabulary each used:
BERT (Devlin et al., 2019, §3: 110M / 340M, WordPiece 30,522), RoBERTa (Liu et al., 2019, §5:
large 355M; base 125M from fairseq's model table; byte-level BPE 50,265), ALBERT (Lan et al.,
2020, Table 1; SentencePiece 30,000), ELECTRA (Clark et al., 2020, Table 6; BERT's 30,522).
"""

from __future__ import annotations

import math

import jax

PAPER_VOCAB = {"bert": 30522, "roberta": 50265, "albert": 30000, "electra": 30522}
PAPER_PARAMS = {
    ("bert", "base"): 110e6, ("bert", "large"): 340e6,
    ("roberta", "base"): 125e6, ("roberta", "large"): 355e6,
    ("albert", "base"): 12e6, ("albert", "large"): 18e6, ("albert", "xlarge"): 60e6, ("albert", "xxlarge"): 235e6,
    ("electra", "small"): 14e6, ("electra", "base"): 110e6, ("electra", "large"): 335e6,
}
PAPER_SOURCE = {"bert": "Devlin et al. 2019, sec. 3", "roberta": "Liu et al. 2019 (base: fairseq's table)",
                "albert": "Lan et al. 2020, Table 1", "electra": "Clark et al. 2020, Table 6"}


def param_counts(model: str, size: str, params: dict, embed_dim: int, vocab_size: int, positions: int,
                 recipe_positions: int) -> dict:
    """``params``: the state's parameter tree (arrays or shape structs) of a model with
    ``vocab_size`` word and ``positions`` position embeddings of width ``embed_dim``;
    ``recipe_positions``: the recipe's position table (the benchmark widens it for long sequences)."""
    sizes = {jax.tree_util.keystr(path): math.prod(x.shape)
             for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    encoder = sum(n for k, n in sizes.items() if k.startswith("['bert']"))
    at_paper = encoder + (PAPER_VOCAB[model] - vocab_size + recipe_positions - positions) * embed_dim
    paper = PAPER_PARAMS.get((model, size))
    return {"total": sum(sizes.values()), "encoder": encoder, "paper_vocab": PAPER_VOCAB[model],
            "encoder_at_paper_vocab": at_paper, "paper": paper and int(paper),
            "paper_source": PAPER_SOURCE[model] if paper else None,
            "ours_over_paper": paper and round(at_paper / paper, 4)}


def summary(p: dict) -> str:
    """One line: the encoder at the paper's vocabulary against the paper's figure."""
    paper = (f"the paper {p['paper'] / 1e6:.0f}M ({p['paper_source']}), ours/paper {p['ours_over_paper']:.3f}"
             if p["paper"] else "no figure in the paper for this size")
    return (f"  parameters: {p['total'] / 1e6:.2f}M trained ({p['encoder'] / 1e6:.2f}M encoder); encoder at the "
            f"paper's vocabulary {p['paper_vocab']}: {p['encoder_at_paper_vocab'] / 1e6:.2f}M, {paper}")

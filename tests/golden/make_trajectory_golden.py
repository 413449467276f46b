"""Writes the training-trajectory golden: short PyTorch pre-training runs of Hugging Face models with
bert-jax's optimizer re-implemented in torch, step by step.

Run it with ``make golden`` (its fourth line; the same venv: torch==2.13.0, transformers==5.23.0). It
never imports bert_jax or jax. ``trajectory_golden.npz`` holds, for two runs of ``STEPS`` optimizer
steps on the same fixed batches (see tests/golden/README.md):

- ``bert_*``: ``transformers.BertForPreTraining`` (masked LM + next-sentence prediction);
- ``electra_*``: ``transformers.ElectraForPreTraining`` (discriminator) + ``ElectraForMaskedLM``
  (generator) sharing one embeddings module, trained together as ELECTRA does.

Each run starts from tiny random weights (float32, a fixed ``torch.manual_seed``, every parameter then
moved by ``0.1 * N(0, 1)`` so biases and LayerNorm parameters are not 0/1), stored under their HF names
(``*_tensor/<name>``, what ``save_pretrained`` writes) with the config.json text, so the test loads the
very same numbers into bert-jax through its strict Hugging Face loader. The run itself is in float64
(the exact reference; a float32 torch run is recorded only as a measure of float32 noise), dropout 0,
and the word embeddings lose HF's ``padding_idx`` (see `no_padding_idx`): bert-jax, like Google's
code, trains the [PAD] row from every lookup.

The optimizer is bert-jax's ``adamw_bert`` (bert_jax/training/optim.py: Google's
``AdamWeightDecayOptimizer``) written out by hand below, per step ``t`` from 0:

    g <- g * clip / max(||g||, clip)          global norm over every (unique) parameter
    m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    u  = m / (sqrt(v) + eps)                  no bias correction
    u <- u + wd * p                           only Linear/Embedding weights: not LayerNorm, not biases
    p <- p - lr(t) u,   lr(t) = lr * t / warmup (t < warmup), else lr * (1 - t / num_train_steps)

The losses are bert-jax's (bert_jax/pretraining/objective.py): masked-LM cross-entropy summed over the
real prediction slots (``masked_lm_weights``) and divided by their count over the whole batch, plus
NSP cross-entropy averaged over the examples; ELECTRA: generator masked-LM + ``rtd_weight`` x the
discriminator's binary cross-entropy averaged over real tokens. Recorded per step, BEFORE the update
(what bert-jax's ``train_step`` returns as metrics): the losses, the gradient's global norm (before
clipping), the learning rate, and the parameters' global norm AFTER the update.

ELECTRA's generator samples its replacements; bert-jax draws them with ``jax.random.categorical``,
which torch cannot replay. Here they are drawn (``torch.multinomial``, a fixed generator) from the
generator's own softmax at each step and stored (``electra_sampled``); the test feeds the same tokens
in place of bert-jax's draw, so everything but the random draw itself is bert-jax's code.
"""

from __future__ import annotations

import copy
import json
import platform
import sys
from pathlib import Path

import numpy as np
import safetensors
import torch
import transformers
from golden_common import saved, start  # tests/golden/golden_common.py (the script's directory)
from transformers import BertConfig, BertForPreTraining, ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

HERE = Path(__file__).resolve().parent
REGENERATE = "make golden (tests/golden/make_trajectory_golden.py in ~/.cache/bert_jax/golden-venv)"

STEPS, BATCH, LENGTH, PREDICTIONS = 20, 8, 24, 5
VOCAB, PAD, CLS, SEP, MASK, FIRST_WORD = 100, 0, 2, 3, 4, 5  # ids 0..4 special, words from 5
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=32, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
            initializer_range=0.02, pad_token_id=PAD, tie_word_embeddings=True, **NO_DROPOUT)
ELECTRA_DISC = dict(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=32, type_vocab_size=2, hidden_act="gelu",
                    layer_norm_eps=1e-12, initializer_range=0.02, pad_token_id=PAD, **NO_DROPOUT)
# The generator at fraction 0.5 (bert_jax.model.electra.electra_generator_config): hidden 16, 2 heads,
# intermediate 32, the discriminator's embedding width (16, so no projection of its own).
ELECTRA_GEN = dict(ELECTRA_DISC, hidden_size=16, num_attention_heads=2, intermediate_size=32)
GENERATOR_FRACTION, RTD_WEIGHT = 0.5, 50.0

# bert-jax's OptimizerConfig fields, every one given (the test builds make_optimizer from this dict). The
# schedule warms up over steps 0..4 (lr 0 at step 0) and decays linearly to lr / 20 at the last step.
# Weight decay 0.1 rather than the paper's 0.01, so that a wrong decay mask moves the recorded numbers
# well beyond float32 noise within 20 steps. Clipping at 2.0 rather than 1.0: BERT's gradient norm
# here runs from about 4 down to 1.6, so some steps are clipped and some are not.
OPTIMIZER = dict(optimizer="adamw_bert", learning_rate=1e-3, warmup_steps=5, num_train_steps=STEPS,
                 weight_decay=0.1, b1=0.9, b2=0.999, eps=1e-6, clip_norm=2.0, bias_correction=False,
                 schedule="bert", decay_power=1.0, decay_steps=0, generator_lr_scale=1.0)
# ELECTRA at tiny scale degenerates at lr >= 1e-3 (DESIGN.md's known facts): a smaller lr; its
# gradient (x rtd_weight 50) is clipped at the paper's 1.0 at every step.
ELECTRA_OPTIMIZER = dict(OPTIMIZER, learning_rate=5e-4, clip_norm=1.0)


def _versions() -> dict[str, np.str_]:
    v = {"torch_version": torch.__version__, "transformers_version": transformers.__version__,
         "numpy_version": np.__version__, "safetensors_version": safetensors.__version__,
         "python_version": platform.python_version()}
    return {k: np.str_(s) for k, s in v.items()}


# ------------------------------------------------------------------------------------------ batches


def make_batches(seed: int) -> dict[str, np.ndarray]:
    """``STEPS`` fixed batches in the layout of input_pipeline/pretraining/batch.py, stacked on a leading step axis.

    Rows are ``[CLS] a [SEP] b [SEP]`` right-padded to ``LENGTH`` (real lengths 8..24, some full),
    segment 1 over ``b [SEP]``. Words follow a Zipf-like law (p ~ 1 / (rank + 5)); where the NSP label
    is 1, ``b`` follows the reversed law: both heads have something to learn in 20 steps. Each row has
    0..PREDICTIONS real predictions (uneven on purpose, sometimes none) at non-special positions,
    masked 80% [MASK] / 10% random / 10% kept; unused slots are position 0, id 0, weight 0."""
    rng = np.random.default_rng(seed)
    words = np.arange(VOCAB - FIRST_WORD)
    zipf = 1.0 / (words + 5.0)
    zipf /= zipf.sum()
    shape = (STEPS, BATCH)
    out = {"input_ids": np.zeros((*shape, LENGTH), np.int32), "input_mask": np.zeros((*shape, LENGTH), np.int32),
           "segment_ids": np.zeros((*shape, LENGTH), np.int32),
           "masked_lm_positions": np.zeros((*shape, PREDICTIONS), np.int32),
           "masked_lm_ids": np.zeros((*shape, PREDICTIONS), np.int32),
           "masked_lm_weights": np.zeros((*shape, PREDICTIONS), np.float32),
           "next_sentence_labels": rng.integers(0, 2, shape).astype(np.int32)}
    for s in range(STEPS):
        for r in range(BATCH):
            n = LENGTH if rng.random() < 0.3 else int(rng.integers(8, LENGTH))
            sep = int(rng.integers(2, n - 3))  # [CLS] a(1..sep-1) [SEP](sep) b [SEP](n-1)
            ids = FIRST_WORD + rng.choice(words, n, p=zipf)
            if out["next_sentence_labels"][s, r]:  # a random b: from the reversed word distribution
                ids[sep + 1:] = FIRST_WORD + rng.choice(words, n - sep - 1, p=zipf[::-1])
            ids[0], ids[sep], ids[n - 1] = CLS, SEP, SEP
            candidates = [i for i in range(1, n - 1) if i != sep]
            k = min(int(rng.integers(0, PREDICTIONS + 1)), len(candidates))
            pos = np.sort(rng.choice(candidates, k, replace=False))
            masked = ids.copy()
            for p in pos:
                u = rng.random()
                masked[p] = MASK if u < 0.8 else int(rng.integers(FIRST_WORD, VOCAB)) if u < 0.9 else ids[p]
            out["input_ids"][s, r, :n] = masked
            out["input_mask"][s, r, :n] = 1
            out["segment_ids"][s, r, sep + 1:n] = 1
            out["masked_lm_positions"][s, r, :k] = pos
            out["masked_lm_ids"][s, r, :k] = ids[pos]
            out["masked_lm_weights"][s, r, :k] = 1.0
        assert out["masked_lm_weights"][s].sum() > 0
    return out


def step_batch(batches: dict[str, np.ndarray], s: int) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v[s]).long() if v.dtype == np.int32 else torch.from_numpy(v[s])
            for k, v in batches.items()}


# ------------------------------------------------------------------------------------------ optimizer


def decays(name: str, p: torch.Tensor) -> bool:
    """Google's deny-list (no decay on LayerNorm and biases), by HF name; cross-checked: exactly the
    matrices (Linear and Embedding weights)."""
    by_name = name.endswith(".weight") and "LayerNorm" not in name
    assert by_name == (p.ndim == 2), name
    return by_name


def learning_rate(cfg: dict, t: int) -> float:
    """bert-jax's "bert" schedule (Google's create_optimizer): warmup from 0, linear decay from step 0."""
    lr, w, n = cfg["learning_rate"], cfg["warmup_steps"], cfg["num_train_steps"]
    return lr * t / w if t < w else lr * max(n - t, 0) / n


class AdamWeightDecay:
    """bert-jax's ``adamw_bert`` (see the module docstring) over named, unique parameters."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]], cfg: dict):
        assert cfg["optimizer"] == "adamw_bert" and cfg["schedule"] == "bert" and not cfg["bias_correction"]
        assert cfg["decay_power"] == 1.0
        self.cfg, self.named = cfg, named
        self.decay = [decays(n, p) for n, p in named]
        self.m = [torch.zeros_like(p) for _, p in named]
        self.v = [torch.zeros_like(p) for _, p in named]

    @torch.no_grad()
    def step(self, t: int) -> tuple[float, float]:
        """One update at optimizer step ``t``; returns (the gradient's global norm before clipping, lr)."""
        c = self.cfg
        grads = [p.grad for _, p in self.named]
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        scale = c["clip_norm"] / torch.clamp(norm, min=c["clip_norm"])
        lr = learning_rate(c, t)
        for (_, p), g, m, v, decay in zip(self.named, grads, self.m, self.v, self.decay, strict=True):
            g = g * scale
            m.mul_(c["b1"]).add_((1 - c["b1"]) * g)
            v.mul_(c["b2"]).add_((1 - c["b2"]) * g * g)
            u = m / (torch.sqrt(v) + c["eps"])
            if decay:
                u = u + c["weight_decay"] * p
            p.sub_(lr * u)
            p.grad = None
        return float(norm), lr


def unique_named(*models: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Every parameter once (tied and shared ones under their first name)."""
    seen, out = set(), []
    for i, model in enumerate(models):
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) not in seen:
                seen.add(id(p))
                out.append((f"{i}.{name}", p))
    return out


def global_norm(named) -> float:
    return float(torch.sqrt(sum((p.detach() ** 2).sum() for _, p in named)))


# ------------------------------------------------------------------------------------------ losses


def mlm_loss(logits: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """logits [B, L, V] -> cross-entropy at the masked positions, summed with the weights and divided
    by the batch's total weight."""
    rows = torch.arange(logits.shape[0])[:, None]
    at = logits[rows, b["masked_lm_positions"]]  # [B, P, V]
    ce = -torch.log_softmax(at, -1).gather(-1, b["masked_lm_ids"][..., None])[..., 0]  # [B, P]
    w = b["masked_lm_weights"].to(ce.dtype)
    return (ce * w).sum() / torch.clamp(w.sum(), min=1e-5)


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Adds 0.1 * N(0, 1) to every parameter, in place (tied parameters stay tied, moved once)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))


def no_padding_idx(*models: torch.nn.Module) -> None:
    """Word embeddings whose [PAD] row is trained like any other, as in Google's BERT and ELECTRA and in
    bert-jax: HF builds ``nn.Embedding(padding_idx=pad_token_id)``, whose backward drops every gradient
    of a lookup of id 0. That matters when ELECTRA's generator samples [PAD] at a masked position."""
    for model in models:
        model.get_input_embeddings().padding_idx = None


def trajectory(records: list[dict[str, float]]) -> dict[str, np.ndarray]:
    return {k: np.array([r[k] for r in records], np.float64) for k in records[0]}


# ------------------------------------------------------------------------------------------ BERT


def run_bert(model: BertForPreTraining, batches, cfg: dict) -> dict[str, np.ndarray]:
    model.train()  # dropout is 0: training mode is deterministic
    named = unique_named(model)
    opt = AdamWeightDecay(named, cfg)
    records = []
    for s in range(STEPS):
        b = step_batch(batches, s)
        out = model(input_ids=b["input_ids"], attention_mask=b["input_mask"], token_type_ids=b["segment_ids"])
        mlm = mlm_loss(out.prediction_logits, b)
        nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, b["next_sentence_labels"])
        loss = mlm + nsp
        loss.backward()
        grad_norm, lr = opt.step(s)
        records.append({"loss": loss.item(), "mlm_loss": mlm.item(), "nsp_loss": nsp.item(), "grad_norm": grad_norm,
                        "learning_rate": lr, "param_norm": global_norm(named)})
    return trajectory(records)


def make_bert(batches) -> dict[str, np.ndarray]:
    torch.manual_seed(40)
    model = BertForPreTraining(BertConfig(**BERT, attn_implementation="eager"))
    perturb(model, 41)
    no_padding_idx(model)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    ref = run_bert(copy.deepcopy(model).double(), batches, OPTIMIZER)
    f32 = run_bert(copy.deepcopy(model), batches, OPTIMIZER)
    return {**saved(model, "bert_"), **{f"bert_{k}": v for k, v in ref.items()},
            "bert_optimizer_json": np.str_(json.dumps(OPTIMIZER)),
            "bert_torch_float32_max_abs_diff": _max_diff(ref, f32)}


def _max_diff(ref: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> np.ndarray:
    """Per step, the largest |difference| over the three-loss columns (float32 noise, for the README)."""
    losses = [k for k in ref if k.endswith("loss")]
    return np.max([np.abs(ref[k] - other[k]) for k in losses], axis=0)


# ------------------------------------------------------------------------------------------ ELECTRA


def share_embeddings(disc: ElectraForPreTraining, gen: ElectraForMaskedLM) -> None:
    """One embeddings module for both networks, and the generator decoding through its word table."""
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight


def run_electra(disc, gen, batches, cfg: dict, sampled: np.ndarray | None, seed: int):
    """The ELECTRA step: the generator's MLM at the masked positions, replacements sampled from its
    softmax (or taken from ``sampled``), the discriminator's BCE over real tokens."""
    share_embeddings(disc, gen)
    disc.train(), gen.train()
    named = unique_named(disc, gen)
    opt = AdamWeightDecay(named, cfg)
    draw = torch.Generator().manual_seed(seed)
    records, draws = [], []
    for s in range(STEPS):
        b = step_batch(batches, s)
        mask = b["input_mask"]
        logits = gen(input_ids=b["input_ids"], attention_mask=mask, token_type_ids=b["segment_ids"]).logits
        mlm = mlm_loss(logits, b)
        pos, w = b["masked_lm_positions"], b["masked_lm_weights"]
        rows = torch.arange(BATCH)[:, None]
        if sampled is None:
            probs = torch.softmax(logits[rows, pos].detach(), -1).reshape(-1, VOCAB)
            new = torch.multinomial(probs, 1, generator=draw).reshape(BATCH, PREDICTIONS)
        else:
            new = torch.from_numpy(sampled[s]).long()
        draws.append(new.numpy().astype(np.int32))
        corrupted, original = b["input_ids"].clone(), b["input_ids"].clone()
        real = w > 0
        corrupted[rows.expand_as(pos)[real], pos[real]] = new[real]
        original[rows.expand_as(pos)[real], pos[real]] = b["masked_lm_ids"][real]
        labels = ((corrupted != original) & (mask > 0)).to(logits.dtype)
        rtd_logits = disc(input_ids=corrupted, attention_mask=mask, token_type_ids=b["segment_ids"]).logits
        bce = torch.nn.functional.binary_cross_entropy_with_logits(rtd_logits, labels, reduction="none")
        tokens = mask.to(bce.dtype).sum()
        rtd = (bce * mask).sum() / tokens
        loss = mlm + RTD_WEIGHT * rtd
        loss.backward()
        grad_norm, lr = opt.step(s)
        records.append({"loss": loss.item(), "mlm_loss": mlm.item(), "rtd_loss": rtd.item(),
                        "rtd_replaced_fraction": float((labels * mask).sum() / tokens), "grad_norm": grad_norm,
                        "learning_rate": lr, "param_norm": global_norm(named)})
    return trajectory(records), np.stack(draws)


def make_electra(batches) -> dict[str, np.ndarray]:
    torch.manual_seed(50)
    disc = ElectraForPreTraining(ElectraConfig(**ELECTRA_DISC, attn_implementation="eager"))
    perturb(disc, 51)
    gen = ElectraForMaskedLM(ElectraConfig(**ELECTRA_GEN, attn_implementation="eager"))
    perturb(gen, 52)
    no_padding_idx(disc, gen)
    with torch.no_grad():  # shared embeddings: the generator's copy equals the discriminator's
        for name, p in gen.electra.embeddings.named_parameters():
            p.copy_(disc.electra.embeddings.get_parameter(name))
    assert gen.generator_lm_head.weight is gen.electra.embeddings.word_embeddings.weight
    assert not hasattr(gen.electra, "embeddings_project") and hasattr(disc.electra, "embeddings_project")
    tensors = {**saved(disc, "disc_"), **saved(gen, "gen_")}
    ref, sampled = run_electra(copy.deepcopy(disc).double(), copy.deepcopy(gen).double(), batches,
                               ELECTRA_OPTIMIZER, None, seed=53)
    f32, _ = run_electra(copy.deepcopy(disc), copy.deepcopy(gen), batches, ELECTRA_OPTIMIZER, sampled, seed=53)
    return {**tensors, **{f"electra_{k}": v for k, v in ref.items()}, "electra_sampled": sampled,
            "electra_optimizer_json": np.str_(json.dumps(ELECTRA_OPTIMIZER)),
            "electra_generator_fraction": np.float64(GENERATOR_FRACTION), "electra_rtd_weight": np.float64(RTD_WEIGHT),
            "electra_torch_float32_max_abs_diff": _max_diff(ref, f32)}


def main(argv: list[str] | None = None) -> None:
    args = start(__doc__, HERE, argv)
    batches = make_batches(60)
    arrays = {**{f"batch/{k}": v for k, v in batches.items()}, **make_bert(batches), **make_electra(batches)}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "trajectory_golden.npz"
    np.savez_compressed(path, **arrays, regenerate=np.str_(REGENERATE), **_versions())
    size = path.stat().st_size
    assert size < 500_000, f"{path} is {size} bytes (limit 500 KB)"
    for run in ("bert", "electra"):
        loss = arrays[f"{run}_loss"]
        print(f"{run}: loss {loss[0]:.4f} -> {loss[-1]:.4f} over {STEPS} steps; grad norm "
              f"{arrays[f'{run}_grad_norm'].min():.3f}..{arrays[f'{run}_grad_norm'].max():.3f}; torch float32 vs "
              f"float64 max |loss diff| {arrays[f'{run}_torch_float32_max_abs_diff'].max():.2e}")
    print(f"{path.name}: {size} bytes")


if __name__ == "__main__":
    sys.exit(main())

"""Representation health during pre-training, and the collapse warning.

A collapsed encoder gives every token the same last-layer vector: the MLM and RTD losses then sit
at what the label or token prior alone gives, and nothing downstream can be learned from it, while
the loss curve looks merely flat. ELECTRA at tiny scale with lr 1e-3, 30 warmup steps and no Adam
bias correction did this within 25-50 steps (the discriminator's per-token spread went 0.17 after
the embeddings, 0.0006 after block 0, 0.0000 after block 1; held-out RTD BCE equal to the prior's
entropy, AUC 0.47-0.52 up to step 300; docs/records.md, "ELECTRA at small scale").

The metrics, all over the last layer's hidden states (ELECTRA: the discriminator's):

* ``token_spread``: the per-feature standard deviation across real tokens (input_mask = 1),
  averaged over features. 0 = every token has the same vector.
* ``cls_spread``: the same across examples for each example's first token ([CLS]: position 0, or
  ``cls_positions`` of packed rows), and ``cls_spread_ratio`` = cls_spread / token_spread.
* ELECTRA, held-out only: ``rtd_auc``, the discriminator's ROC AUC of replaced against original
  real tokens (from histograms of its logits, `RTD_BINS` bins); ``rtd_prior_entropy``, H(p) in nats
  for p the replaced fraction, the BCE of the best constant prediction; ``rtd_bce_over_prior``,
  the RTD BCE divided by it (1 = no better than the prior; every step reports these two).
* held-out only: ``token_top_share``, the share of the real tokens' variance along their first
  principal direction (largest eigenvalue of their covariance over its trace): a pre-training
  readout that takes over the last layer (ELECTRA's replaced-token logit) shows here while the
  spread stays healthy; ``mlm_unigram_entropy``, the entropy in nats of the masked tokens' own
  unigram distribution (a bound no unigram model reaches on held-out tokens: it knows their
  frequencies); ``mlm_unigram_cross_entropy``, their cross-entropy under the masked labels'
  frequencies in the training batches read so far (add-one smoothed: `LabelCounts`,
  `unigram_cross_entropy`), the loss of a unigram model fitted on the training side (ELECTRA: what
  the generator's ``mlm_loss`` must beat).

Each batch gives additive sums (`health_sums`, `held_out_sums`, `rtd_histograms`; counts,
per-feature sums, sums of squares and of outer products, histogram counts) that micro-batches and
evaluation batches add up exactly; `summarize_health` finishes them. `HealthMonitor` applies the
collapse rule (`collapse_signs`) and two more warnings (`readout_sign`, `unigram_sign`).
"""

from __future__ import annotations

import collections
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np

log = logging.getLogger(__name__)

# Histogram bins of the discriminator's logits for the held-out AUC: uniform in the logit over
# [-RTD_LOGIT_RANGE, RTD_LOGIT_RANGE] (monotone in sigmoid(logit), so the same AUC as probabilities,
# with resolution where probabilities crowd near 0 and 1); logits beyond fall in the end bins.
# Ties within a bin count one half: with 1024 bins of 0.03 the AUC is within ~1e-3 of the exact one.
RTD_BINS = 1024
RTD_LOGIT_RANGE = 16.0

# The collapse rule (`collapse_signs`, `HealthMonitor`). Healthy ELECTRA runs pass through a short
# "prior phase" (the discriminator first learns the replaced fraction: BCE = H(p), AUC ~0.5, token
# spread down to 3-15% of step 0) and leave it within 10-40 steps; collapsed runs stay there (or
# fall to a constant vector) for good. Measured on 27 tiny ELECTRA runs (docs/records.md, "ELECTRA
# at small scale"), evaluated every 10-25 steps: the rule below flags the 10 that ended at AUC 0.50-0.52
# and none of those that ended above 0.6.
#
# A hard sign warns at once: token_spread below this fraction of its step-0 value. Collapsed runs
# sat at 0.02-0.5% of it from their first evaluation on; no healthy run's dip went below 2.8%.
TOKEN_SPREAD_COLLAPSED = 0.01
# Soft signs warn when they hold at every evaluation over `COLLAPSE_PERSIST_STEPS` steps or more
# (the prior phase of healthy runs lasted < 50 steps; collapsed runs' for the rest of the run):
# token_spread below this fraction of its step-0 value (healthy dips: 2.8-15%) ...
TOKEN_SPREAD_LOW = 0.05
# ... or (ELECTRA, held-out, after warmup) the RTD BCE within this fraction of the prior's entropy
# and the AUC within `RTD_AUC_MARGIN` of chance: the discriminator predicts the replaced fraction
# and nothing else (the collapsed run: BCE 0.4195 vs H(p) 0.4195, AUC 0.47-0.52; healthy
# runs reached AUC 0.75-0.87). A BCE well above H(p) is an untrained discriminator, not a collapse.
RTD_BCE_BAND = 0.02
RTD_AUC_MARGIN = 0.05
COLLAPSE_PERSIST_STEPS = 50
# The readout warning (`readout_sign`): ELECTRA's held-out token_top_share above this. The demo's
# recipe (output bias at logit 0.4) ends at 0.27-0.29 and fine-tunes at least as well as scratch; the
# bias at the replaced fraction (rtd_prior 0.15) passes 0.40 by step 150, ends at 0.63 and fine-tuned
# below scratch (docs/records.md, "Health: the readout's share of the last layer").
TOP_SHARE_WARN = 0.40


def health_sums(hidden: jax.Array, batch: dict) -> dict[str, jax.Array]:
    """Additive sums over one batch of the last layer's ``hidden`` [batch, length, embed]: real
    tokens' count, per-feature sum and sum of squares; the same over each example's first token
    (``cls_positions`` weighted by ``nsp_weights`` for packed rows, else position 0 of rows that
    have a real token there)."""
    h = hidden.astype(jnp.float32)  # [B, L, H]
    real = batch["input_mask"].astype(jnp.float32)  # [B, L]
    if "cls_positions" in batch:
        cls = jnp.take_along_axis(h, batch["cls_positions"][..., None], axis=1)  # [B, K, H]
        w = (batch["nsp_weights"] if "nsp_weights" in batch
             else jnp.ones(batch["cls_positions"].shape, jnp.float32))  # [B, K]
    else:
        cls, w = h[:, :1], real[:, :1]  # [B, 1, H], [B, 1]
    # Weighted sums as multiply-and-reduce, not einsums: no matrix products, so the step's FLOPs stay
    # the model's (tests/benchmark/test_flops.py counts them exactly).
    real3, w3 = real[..., None], w[..., None]  # [B, L, 1], [B, K, 1]
    return {"token_count": real.sum(), "token_sum": (real3 * h).sum((0, 1)),
            "token_sumsq": (real3 * h * h).sum((0, 1)),
            "cls_count": w.sum(), "cls_sum": (w3 * cls).sum((0, 1)),
            "cls_sumsq": (w3 * cls * cls).sum((0, 1))}


def held_out_sums(hidden: jax.Array, batch: dict, vocab_size: int) -> dict[str, jax.Array]:
    """The evaluation's extra additive sums: the real tokens' sum of outer products ``token_outer``
    [embed, embed] of the last layer's ``hidden`` [batch, length, embed] (with `health_sums`'s count
    and sum: their covariance), and ``mlm_label_counts`` [vocab_size], how often each token id is
    a real masked-LM label. A matrix product: kept out of the training step, whose FLOPs stay the
    model's."""
    h = hidden.astype(jnp.float32) * batch["input_mask"].astype(jnp.float32)[..., None]  # [B, L, H], 0 on padding
    ids = batch["masked_lm_ids"].reshape(-1)
    weights = batch["masked_lm_weights"].astype(jnp.float32).reshape(-1)
    return {"token_outer": jnp.einsum("bld,ble->de", h, h),
            "mlm_label_counts": jnp.zeros((vocab_size,), jnp.float32).at[ids].add(weights)}


def rtd_histograms(logits: jax.Array, labels: jax.Array, real: jax.Array) -> dict[str, jax.Array]:
    """Counts [RTD_BINS] of the discriminator's ``logits`` [batch, length] over real tokens
    (``real`` [batch, length], 1/0), for replaced (``labels`` 1) and original tokens."""
    scaled = (logits.astype(jnp.float32) + RTD_LOGIT_RANGE) * (RTD_BINS / (2 * RTD_LOGIT_RANGE))
    bins = jnp.clip(jnp.floor(scaled), 0, RTD_BINS - 1).astype(jnp.int32).reshape(-1)
    real = real.astype(jnp.float32).reshape(-1)
    replaced = labels.astype(jnp.float32).reshape(-1) * real
    zeros = jnp.zeros((RTD_BINS,), jnp.float32)
    return {"rtd_hist_replaced": zeros.at[bins].add(replaced), "rtd_hist_original": zeros.at[bins].add(real - replaced)}


def auc_from_histograms(positive, negative) -> jax.Array:
    """ROC AUC from score histograms over the same bins (ascending scores): the probability that a
    positive scores above a negative, ties (same bin) counted one half. NaN without both kinds."""
    positive, negative = jnp.asarray(positive, jnp.float32), jnp.asarray(negative, jnp.float32)
    below = jnp.cumsum(negative) - negative  # negatives in lower bins
    pairs = positive.sum() * negative.sum()
    wins = (positive * (below + 0.5 * negative)).sum()
    return jnp.where(pairs > 0, wins / jnp.where(pairs > 0, pairs, 1.0), jnp.nan)


def _spread(count, total, squares):
    n = jnp.maximum(count, 1.0)
    mean = total / n
    return jnp.sqrt(jnp.maximum(squares / n - mean * mean, 0.0)).mean()


def binary_entropy(p) -> jax.Array:
    """H(p) in nats (what a constant prediction of p scores in BCE); 0 at p = 0 or 1."""
    p = jnp.clip(jnp.asarray(p, jnp.float32), 0.0, 1.0)
    return -(jax.scipy.special.xlogy(p, p) + jax.scipy.special.xlogy(1.0 - p, 1.0 - p))


def top_share(count, total, outer) -> jax.Array:
    """The largest eigenvalue of the covariance (from the count, the sum [H] and the sum of outer
    products [H, H]) over their sum: the first principal direction's share of the variance."""
    n = jnp.maximum(jnp.asarray(count, jnp.float32), 1.0)
    mean = jnp.asarray(total, jnp.float32) / n
    cov = jnp.asarray(outer, jnp.float32) / n - jnp.outer(mean, mean)
    eig = jnp.maximum(jnp.linalg.eigvalsh((cov + cov.T) / 2), 0.0)
    return eig[-1] / jnp.maximum(eig.sum(), 1e-12)


def unigram_entropy(counts) -> jax.Array:
    """Entropy in nats of the distribution the ``counts`` give (NaN without any)."""
    counts = jnp.asarray(counts, jnp.float32)
    total = counts.sum()
    p = counts / jnp.where(total > 0, total, 1.0)
    return jnp.where(total > 0, -jax.scipy.special.xlogy(p, p).sum(), jnp.nan)


class LabelCounts:
    """How often each token id is a real masked-LM label in the numpy batches a process trains on.
    `add` notes a batch's labels where it is read (a prefetch thread may read ahead); `commit` counts
    the oldest noted batch when the step takes it, so ``counts`` covers exactly the batches taken."""

    def __init__(self, vocab_size: int):
        self.counts = np.zeros(int(vocab_size), np.int64)
        self.pending: collections.deque[np.ndarray] = collections.deque()

    def add(self, batch: dict) -> dict:
        """Notes ``batch``'s labels (``masked_lm_ids`` where ``masked_lm_weights`` > 0) and returns it."""
        ids = np.zeros(0, np.int64)
        if "masked_lm_ids" in batch and "masked_lm_weights" in batch:
            ids = np.asarray(batch["masked_lm_ids"])[np.asarray(batch["masked_lm_weights"]) > 0]
        self.pending.append(ids[(ids >= 0) & (ids < self.counts.size)])
        return batch

    def commit(self) -> None:
        """Counts the oldest batch noted by `add`."""
        self.counts += np.bincount(self.pending.popleft(), minlength=self.counts.size)


def unigram_cross_entropy(train, held_out) -> float:
    """Cross-entropy in nats of the ``held_out`` label counts under the ``train`` counts' frequencies,
    add-one smoothed over the vocabulary: the masked-LM loss of a unigram model fitted on the training
    labels (NaN without held-out or training labels)."""
    train, held_out = np.asarray(train, np.float64), np.asarray(held_out, np.float64)
    if not held_out.sum() or not train.sum():
        return float("nan")
    log_q = np.log((train + 1.0) / (train.sum() + train.size))
    return float(-(held_out * log_q).sum() / held_out.sum())


def summarize_health(m: dict) -> dict[str, jax.Array]:
    """The sums of `health_sums` (and `held_out_sums`, `rtd_histograms`, RTD sums) → the metrics
    named in the module docstring; keys whose sums are absent are left out."""
    out = {}
    if "token_sum" in m:
        out["token_spread"] = _spread(m["token_count"], m["token_sum"], m["token_sumsq"])
        out["cls_spread"] = _spread(m["cls_count"], m["cls_sum"], m["cls_sumsq"])
        out["cls_spread_ratio"] = out["cls_spread"] / jnp.maximum(out["token_spread"], 1e-12)
    if "token_outer" in m:
        out["token_top_share"] = top_share(m["token_count"], m["token_sum"], m["token_outer"])
    if "mlm_label_counts" in m:
        out["mlm_unigram_entropy"] = unigram_entropy(m["mlm_label_counts"])
    if "rtd_loss_sum" in m:
        tokens = jnp.maximum(m["rtd_tokens"], 1e-5)
        prior = binary_entropy(m["rtd_replaced"] / tokens)
        out["rtd_prior_entropy"] = prior
        out["rtd_bce_over_prior"] = (m["rtd_loss_sum"] / tokens) / jnp.maximum(prior, 1e-12)
    if "rtd_hist_replaced" in m:
        out["rtd_auc"] = auc_from_histograms(m["rtd_hist_replaced"], m["rtd_hist_original"])
    return out


def collapse_signs(metrics: dict, reference: dict | None, *, step: int, warmup_steps: int,
                   split: str) -> tuple[list[str], list[str]]:
    """(hard, soft) signs of a collapse in ``metrics`` (a train window or an evaluation at ``step``),
    against ``reference`` (the step-0 metrics; None: the spread tests are skipped). Train windows
    give hard signs only (with dropout their spread is the dropout noise's: ~0.2 in a collapsed run)."""
    hard, soft = [], []
    spread, start = metrics.get("token_spread"), (reference or {}).get("token_spread")
    if step > 0 and _finite(spread) and _finite(start) and start > 0:
        fraction = spread / start
        text = (f"token_spread {spread:.4g} is {fraction:.1%} of its step-0 value {start:.4g} (every token has "
                f"nearly the same last-layer vector)")
        if fraction < TOKEN_SPREAD_COLLAPSED:
            hard.append(text)
        elif fraction < TOKEN_SPREAD_LOW and split == "eval":
            soft.append(text)
    ratio, auc = metrics.get("rtd_bce_over_prior"), metrics.get("rtd_auc")
    if (split == "eval" and step >= warmup_steps and _finite(ratio) and _finite(auc)
            and abs(ratio - 1.0) <= RTD_BCE_BAND and abs(auc - 0.5) < RTD_AUC_MARGIN):
        soft.append(f"held-out RTD BCE is {ratio:.3f} x the label prior's entropy "
                    f"{metrics.get('rtd_prior_entropy', float('nan')):.4f} and rtd_auc is {auc:.3f} "
                    "(the discriminator predicts only the replaced fraction)")
    return hard, soft


def readout_sign(metrics: dict, *, step: int) -> str | None:
    """Why an ELECTRA evaluation's last layer looks taken over by one direction (`TOP_SHARE_WARN`),
    else None. Masked-LM runs log ``token_top_share`` without this test: their shares were not
    measured against transfer."""
    share = metrics.get("token_top_share")
    if step > 0 and "rtd_auc" in metrics and _finite(share) and share > TOP_SHARE_WARN:
        return (f"token_top_share {share:.0%}: one direction holds that share of the discriminator's last-layer "
                f"variance (above {TOP_SHARE_WARN:.0%}), the replaced-token readout taking over the "
                "representation, which then fine-tunes worse (try --config.electra.rtd_prior nearer 0.5)")
    return None


def unigram_sign(metrics: dict) -> str | None:
    """Why an ELECTRA evaluation's generator predicts no better than token frequencies — its held-out
    ``mlm_loss`` at or above ``mlm_unigram_cross_entropy``, a unigram model fitted on the training
    batches — else None. BERT's runs are judged by accuracy, not by this."""
    loss, reference = metrics.get("mlm_loss"), metrics.get("mlm_unigram_cross_entropy")
    if "rtd_loss" not in metrics or not (_finite(loss) and _finite(reference) and loss >= reference):
        return None
    return (f"the generator's held-out loss {loss:.2f} nats is above the unigram cross-entropy {reference:.2f} "
            "nats of the masked tokens (the loss of predicting each by its frequency in the training batches): "
            "it predicts them no better than token frequencies would")


def _finite(x) -> bool:
    """A finite number (metrics.jsonl stores NaN/Inf as strings)."""
    return isinstance(x, (int, float)) and math.isfinite(x)


class HealthMonitor:
    """Checks each train window and evaluation against the step-0 ``reference`` and prints ONE
    warning line (and logs it) the first time a run looks collapsed: a hard sign at once, soft signs
    once they have held at every evaluation for `COLLAPSE_PERSIST_STEPS` steps (`collapse_signs`).
    ``advice``: what to try, in the job's own flags (`advice`). Evaluations get two more warnings,
    each printed once: the readout taking over the last layer (`readout_sign`), and at the last
    step (``total_steps``; 0: unknown, not checked) a masked LM no better than unigram frequencies
    (`unigram_sign`)."""

    def __init__(self, *, warmup_steps: int, advice: str, enabled: bool = True, reference: dict | None = None,
                 total_steps: int = 0):
        self.warmup_steps, self.advice, self.enabled = int(warmup_steps), advice, enabled
        self.reference, self.total_steps = reference, int(total_steps)
        self.soft_since: int | None = None  # the first of the evaluations in a row with soft signs
        self.warning: str | None = None  # the collapse line printed, once
        self.readout_warning: str | None = None
        self.unigram_warning: str | None = None

    def check(self, step: int, metrics: dict, split: str) -> str | None:
        """The warning lines printed by this check (joined by newlines), else None."""
        if not self.enabled:
            return None
        lines = [self._collapse(step, metrics, split)] if self.warning is None else []
        if split == "eval" and self.readout_warning is None and (sign := readout_sign(metrics, step=step)):
            self.readout_warning = self._say(f"WARNING: the readout took over the last layer at step {step} "
                                             f"(held-out evaluation): {sign}.")
            lines.append(self.readout_warning)
        if (split == "eval" and self.total_steps and step >= self.total_steps and self.unigram_warning is None
                and (sign := unigram_sign(metrics))):
            self.unigram_warning = self._say(f"WARNING: at the end of pre-training (step {step}, held-out "
                                             f"evaluation) {sign}.")
            lines.append(self.unigram_warning)
        lines = [line for line in lines if line]
        return "\n".join(lines) if lines else None

    @staticmethod
    def _say(line: str) -> str:
        print(line, flush=True)
        log.warning("%s", line)
        return line

    def _collapse(self, step: int, metrics: dict, split: str) -> str | None:
        hard, soft = collapse_signs(metrics, self.reference, step=step, warmup_steps=self.warmup_steps, split=split)
        if split == "eval":
            self.soft_since = (step if self.soft_since is None else self.soft_since) if soft else None
        if hard:
            reasons = hard
        elif soft and step - self.soft_since >= COLLAPSE_PERSIST_STEPS:
            reasons = [*soft, f"at every evaluation since step {self.soft_since}"]
        else:
            return None
        where = "held-out evaluation" if split == "eval" else "training"
        self.warning = self._say(f"WARNING: the representation collapsed at step {step} ({where}): "
                                 + "; ".join(reasons)
                                 + f". {self.advice} (docs/robustness.md, 'Representation health').")
        return self.warning


def advice(optimizer) -> str:
    """What to try against a collapse, naming ``optimizer``'s (a ConfigDict or dict) current values."""
    tries = [f"a lower learning rate (--config.optimizer.learning_rate, now {optimizer['learning_rate']:g})",
             f"a longer warmup (--config.optimizer.warmup_steps, now {optimizer['warmup_steps']})"]
    if not optimizer["bias_correction"]:
        tries.append("Adam bias correction (--config.optimizer.bias_correction=True)")
    return "Try " + ", ".join(tries[:-1]) + " or " + tries[-1]

"""Pre-training's objective: what runs inside the jitted step.

The model (`BertForPreTraining` for MLM + NSP | SOP | none, `ElectraForPreTraining` for ELECTRA's
replaced-token detection), its losses and metric sums (with the last layer's health sums,
`bert_jax.pretraining.health`), the pure ``train_step(state, batch, rng) -> (state, metrics)``
(gradient accumulation over micro-batches in a ``lax.scan``: `bert_jax.training.steps.train_step`)
and ``eval_step`` (the held-out metric sums), jitted by `bert_jax.training.steps.jit_steps` from the
job config (`jit_pretraining_steps`: the same function serves the trainer, the dry run, the benchmark
and ahead-of-time compilation). Batches have the layout of `input_pipeline.pretraining.batch`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from bert_jax.model.config import BertConfig
from bert_jax.model.electra import ElectraForPreTraining, ElectraOutput
from bert_jax.model.models import BertForPreTraining
from bert_jax.pretraining import health
from bert_jax.pretraining.cross_entropy import softmax_cross_entropy
from bert_jax.training import compiler_options
from bert_jax.training import steps as steps_lib
from bert_jax.training.sharding_rules import config_rules
from bert_jax.training.steps import Steps, TrainState, accumulation_steps, jit_steps, new_state
from input_pipeline.pretraining.batch import MODEL_INPUT_KEYS

OBJECTIVES = ("nsp", "sop", "none", "rtd")  # rtd: ELECTRA's replaced-token detection


def pretraining_model(cfg: BertConfig, objective: str, electra: dict | None = None) -> Callable[[int], nnx.Module]:
    """seed -> the pre-training model (what `bert_jax.training.steps.state_layout` builds from):
    `BertForPreTraining` for MLM + nsp | sop | none, `ElectraForPreTraining` for "rtd" (``electra``:
    its generator_fraction, rtd_weight and rtd_prior, the job config's ``electra`` block)."""
    if objective == "rtd":
        return lambda seed: ElectraForPreTraining(cfg, rngs=nnx.Rngs(seed), **(electra or {}))
    if electra:
        raise ValueError(f"electra settings {sorted(electra)} need objective 'rtd', not {objective!r}")
    return lambda seed: BertForPreTraining(cfg, rngs=nnx.Rngs(seed), objective=objective)


def model_graphdef(cfg: BertConfig, objective: str, electra: dict | None = None) -> nnx.GraphDef:
    """The model's static structure (allocates nothing)."""
    return nnx.graphdef(nnx.eval_shape(lambda: pretraining_model(cfg, objective, electra)(0)))


def init_state(cfg: BertConfig, objective: str, tx: optax.GradientTransformation, seed: int,
               electra: dict | None = None) -> TrainState:
    """A fresh state on the default device (tests and small tools; the trainer creates its state
    in its shards with `bert_jax.training.steps.StateLayout.create`)."""
    model = pretraining_model(cfg, objective, electra)(seed)
    return new_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), tx)


def pretraining_losses(out, batch, held_out: bool = False) -> dict[str, jax.Array]:
    """Sums over one batch: masked-LM cross-entropy and accuracy over real predictions (weights),
    NSP/SOP, ELECTRA's RTD (and how often the generator's sample is the original token), and the
    last layer's health sums (`bert_jax.pretraining.health`; ``held_out``: also the evaluation's, the
    discriminator's logit histograms for the AUC, the tokens' covariance and the masked tokens'
    unigram counts)."""
    logits = out.mlm_logits  # [batch, P, vocab] float32
    labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]  # [batch, P]
    ce = softmax_cross_entropy(logits, labels)  # [batch, P]
    total_weight = weights.sum()
    correct = (jnp.argmax(logits, -1) == labels) * weights  # [batch, P]
    # One weight per example slot: [batch], or [batch·K] for packed rows (1 = a real example).
    w = (batch["nsp_weights"].reshape(-1) if "nsp_weights" in batch
         else jnp.ones(labels.shape[:1], jnp.float32))  # [examples]
    m = {"mlm_loss_sum": (ce * weights).sum(), "mlm_correct": correct.sum(), "mlm_weight": total_weight,
         "examples": w.sum()}
    if out.nsp_logits is not None:
        nsp_logits = out.nsp_logits.reshape(-1, 2)  # [examples, 2]
        nsp_labels = batch["next_sentence_labels"].reshape(-1)  # [examples]: [batch] or [batch·K] packed
        nsp_ce = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, nsp_labels)  # [examples]
        m["nsp_loss_sum"] = (nsp_ce * w).sum()
        m["nsp_correct"] = ((jnp.argmax(nsp_logits, -1) == nsp_labels) * w).sum()
    if isinstance(out, ElectraOutput):
        real = batch["input_mask"].astype(jnp.float32)  # [batch, length]: ELECTRA's BCE runs over real tokens
        bce = optax.sigmoid_binary_cross_entropy(out.rtd_logits, out.rtd_labels)  # [batch, length]
        m["rtd_loss_sum"] = (bce * real).sum()
        m["rtd_correct"] = (((out.rtd_logits > 0) == (out.rtd_labels > 0)) * real).sum()
        m["rtd_replaced"] = (out.rtd_labels * real).sum()
        m["rtd_tokens"] = real.sum()
        # The generator's sampled accuracy (google-research/electra's sampled_masked_lm_accuracy): a
        # masked position whose sample is the original token is labelled original.
        replaced_at_masks = jnp.take_along_axis(out.rtd_labels, batch["masked_lm_positions"], axis=1)  # [batch, P]
        m["mlm_sampled_correct"] = ((1.0 - replaced_at_masks) * weights).sum()
        if held_out:
            m.update(health.rtd_histograms(out.rtd_logits, out.rtd_labels, real))
    if out.encoder is not None:
        m.update(health.health_sums(out.encoder.sequence_output, batch))
        if held_out:
            m.update(health.held_out_sums(out.encoder.sequence_output, batch, logits.shape[-1]))
    return m


def loss_denominators(batch) -> dict[str, jax.Array]:
    """What each loss term of `_loss` divides by, counted over the whole ``batch``: masked-LM
    predictions, examples (NSP/SOP) and real tokens (ELECTRA's RTD). Micro-batches divide by the whole
    batch's counts, so their summed gradients are the whole batch's gradient, however unevenly the
    predictions fall among them."""
    examples = batch["nsp_weights"].sum() if "nsp_weights" in batch else batch["input_ids"].shape[0]
    return {"mlm_weight": batch["masked_lm_weights"].sum(), "examples": jnp.asarray(examples, jnp.float32),
            "rtd_tokens": batch["input_mask"].astype(jnp.float32).sum()}


def _loss(params, graphdef, batch, rng, deterministic: bool, denominators: dict | None = None,
          held_out: bool = False):
    model = nnx.merge(graphdef, params)
    optional = {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}
    rngs = None if deterministic else nnx.Rngs(dropout=rng)
    args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"], batch["masked_lm_positions"])
    if isinstance(model, ElectraForPreTraining):
        if "cls_positions" in optional:
            raise ValueError("ELECTRA has no sentence-level head: packed batches with cls_positions do not apply")
        # Evaluation draws its replacements from a fixed key: the same held-out numbers every time.
        sample_key = jax.random.fold_in(rng, 1) if rng is not None else jax.random.key(0)
        out = model(*args, batch["masked_lm_ids"], batch["masked_lm_weights"], sample_key=sample_key,
                    deterministic=deterministic, rngs=rngs, **optional)
    else:
        out = model(*args, deterministic=deterministic, rngs=rngs, **optional)
    m = pretraining_losses(out, batch, held_out)
    if isinstance(model, ElectraForPreTraining):
        m["rtd_weighted_loss_sum"] = model.rtd_weight * m["rtd_loss_sum"]  # λ · BCE, summed like the rest
    d = m if denominators is None else denominators  # this batch's counts, or the whole batch's
    loss = m["mlm_loss_sum"] / jnp.maximum(d["mlm_weight"], 1e-5)
    if "nsp_loss_sum" in m:
        loss = loss + m["nsp_loss_sum"] / jnp.maximum(d["examples"], 1e-5)
    if "rtd_loss_sum" in m:
        loss = loss + m["rtd_weighted_loss_sum"] / jnp.maximum(d["rtd_tokens"], 1e-5)
    return loss, m


def metrics_from_sums(m: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Sums (as accumulated over micro-batches or eval batches) → means, accuracies and the health
    metrics (`bert_jax.pretraining.health.summarize_health`)."""
    out = {"mlm_loss": m["mlm_loss_sum"] / jnp.maximum(m["mlm_weight"], 1e-5),
           "mlm_accuracy": m["mlm_correct"] / jnp.maximum(m["mlm_weight"], 1e-5)}
    if "nsp_loss_sum" in m:
        out["nsp_loss"] = m["nsp_loss_sum"] / jnp.maximum(m["examples"], 1e-5)
        out["nsp_accuracy"] = m["nsp_correct"] / jnp.maximum(m["examples"], 1e-5)
    rtd = {}
    if "rtd_loss_sum" in m:
        tokens = jnp.maximum(m["rtd_tokens"], 1e-5)
        out["rtd_loss"] = m["rtd_loss_sum"] / tokens
        out["rtd_accuracy"] = m["rtd_correct"] / tokens
        out["rtd_replaced_fraction"] = m["rtd_replaced"] / tokens  # how often the generator fooled the mask
        out["mlm_sampled_accuracy"] = m["mlm_sampled_correct"] / jnp.maximum(m["mlm_weight"], 1e-5)
        rtd = {"weighted": m["rtd_weighted_loss_sum"] / tokens}
    out["loss"] = out["mlm_loss"] + out.get("nsp_loss", 0.0) + rtd.get("weighted", 0.0)
    out["examples"] = m["examples"]  # examples in the summed batches (packed rows hold several)
    out.update(health.summarize_health(m))
    return out


def _train_loss(params, graphdef, batch, rng, denominators: dict | None):
    return _loss(params, graphdef, batch, rng, False, denominators)


def train_step(state: TrainState, batch: dict, rng: jax.Array, *, graphdef, tx, schedule,
               accumulation_steps: int = 1, norm: Callable = optax.tree.norm) -> tuple[TrainState, dict]:
    """One optimizer step on the pre-training loss (`bert_jax.training.steps.train_step`: micro-batches
    dividing by the whole batch's counts, `loss_denominators`)."""
    return steps_lib.train_step(state, batch, rng, graphdef=graphdef, tx=tx, schedule=schedule, loss=_train_loss,
                                denominators=loss_denominators, summarize=metrics_from_sums,
                                accumulation_steps=accumulation_steps, norm=norm)


def eval_step(params: dict, batch: dict, *, graphdef) -> dict:
    """Sums over one batch (add them up across batches, then `metrics_from_sums`), with the held-out extras
    (`pretraining_losses`)."""
    _, sums = _loss(params, graphdef, batch, None, True, held_out=True)
    return sums


def electra_settings(config) -> dict | None:
    """``config.electra`` (generator_fraction, rtd_weight, rtd_prior, tie_embeddings) for objective
    "rtd", else None."""
    if config.objective != "rtd":
        return None
    if "electra" not in config:
        raise ValueError("objective 'rtd' needs config.electra (generator_fraction, rtd_weight): "
                         "use configs/pretrain.py:model=electra")
    prior = config.electra.rtd_prior
    if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0.0 <= prior < 1.0:
        raise ValueError(f"config.electra.rtd_prior={prior!r}: expected 0 (the discriminator's output bias "
                         "starts at 0) or the replaced fraction it starts at, in (0, 1)")
    return dict(config.electra)


def jit_pretraining_steps(config, model_config: BertConfig, mesh: Mesh) -> Steps:
    """Pre-training's model, objective and optimizer (``config.optimizer``) through the shared
    builder (`bert_jax.training.steps.jit_steps`). Gradient accumulation is a ``lax.scan`` inside
    the step (one call = one optimizer step over `accumulation_steps` micro-batches)."""
    optimizer = config.optimizer.to_dict()
    if optimizer["generator_lr_scale"] != 1.0 and config.objective != "rtd":
        raise ValueError(f"--config.optimizer.generator_lr_scale={optimizer['generator_lr_scale']}: ELECTRA's "
                         f"generator rate (objective 'rtd'); objective {config.objective!r} has no generator")
    rules = config_rules(config)
    accumulation = accumulation_steps(config, mesh, rules)
    make_model = pretraining_model(model_config, config.objective, electra_settings(config))
    return jit_steps(make_model, optimizer, mesh, rules,
                     functools.partial(train_step, accumulation_steps=accumulation), eval_step, accumulation,
                     config.get("global_norm", "per_leaf"), compiler_options.of_config(config))

"""Pure pre-training state and steps: ``train_step(state, batch, rng) -> (state, metrics)``.

Batches have the layout of `input_pipeline.batch`. The model's structure (``graphdef``) and the
optimizer are static; the state is a
`bert_jax.training.state.TrainState` (step, parameters as a pure dict, optimizer state). The
trainer jits these functions once with explicit in/out shardings and donates the state
(`bert_jax.training.trainer.build_steps`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.models import BertForPreTraining
from bert_jax.training.state import TrainState, new_state
from input_pipeline.batch import MODEL_INPUT_KEYS


def pretraining_model(cfg: BertConfig, objective: str) -> Callable[[int], BertForPreTraining]:
    """seed -> the pre-training model (what `bert_jax.training.state.state_layout` builds from)."""
    return lambda seed: BertForPreTraining(cfg, rngs=nnx.Rngs(seed), objective=objective)


def model_graphdef(cfg: BertConfig, objective: str) -> nnx.GraphDef:
    """The model's static structure (allocates nothing)."""
    return nnx.graphdef(nnx.eval_shape(lambda: pretraining_model(cfg, objective)(0)))


def init_state(cfg: BertConfig, objective: str, tx: optax.GradientTransformation, seed: int) -> TrainState:
    """A fresh state on the default device (tests and small tools; the trainer creates its state
    in its shards with `bert_jax.training.state.StateLayout.create`)."""
    return new_state(nnx.state(pretraining_model(cfg, objective)(seed), nnx.Param).to_pure_dict(), tx)


def pretraining_losses(out, batch) -> dict[str, jax.Array]:
    """Masked-LM cross-entropy averaged over real predictions (weights), plus NSP/SOP."""
    logits = out.mlm_logits  # [batch, P, vocab] float32
    labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]  # [batch, P]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [batch, P]
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
    return m


def _loss(params, graphdef, batch, rng, deterministic: bool):
    model = nnx.merge(graphdef, params)
    optional = {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}
    out = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"], batch["masked_lm_positions"],
                deterministic=deterministic, rngs=None if deterministic else nnx.Rngs(dropout=rng), **optional)
    m = pretraining_losses(out, batch)
    loss = m["mlm_loss_sum"] / jnp.maximum(m["mlm_weight"], 1e-5)
    if "nsp_loss_sum" in m:
        loss = loss + m["nsp_loss_sum"] / jnp.maximum(m["examples"], 1e-5)
    return loss, m


def summarize(m: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Sums (as accumulated over micro-batches or eval batches) → means and accuracies."""
    out = {"mlm_loss": m["mlm_loss_sum"] / jnp.maximum(m["mlm_weight"], 1e-5),
           "mlm_accuracy": m["mlm_correct"] / jnp.maximum(m["mlm_weight"], 1e-5)}
    if "nsp_loss_sum" in m:
        out["nsp_loss"] = m["nsp_loss_sum"] / jnp.maximum(m["examples"], 1e-5)
        out["nsp_accuracy"] = m["nsp_correct"] / jnp.maximum(m["examples"], 1e-5)
    out["loss"] = out["mlm_loss"] + out.get("nsp_loss", 0.0)
    out["examples"] = m["examples"]  # examples in the summed batches (packed rows hold several)
    return out


def train_step(state: TrainState, batch: dict, rng: jax.Array, *, graphdef, tx, schedule,
               accumulation_steps: int = 1) -> tuple[TrainState, dict]:
    """One optimizer step. With ``accumulation_steps`` k the batch's leading axis is split into k
    micro-batches whose gradients are summed in a ``lax.scan`` (one update per call; the schedule
    counts optimizer steps). Dropout keys: ``rng`` folded with the step (and micro-batch)."""
    rng = jax.random.fold_in(rng, state.step)
    grad_fn = jax.grad(_loss, has_aux=True)

    if accumulation_steps == 1:
        grads, sums = grad_fn(state.params, graphdef, batch, rng, False)
    else:
        if "token_index" in batch:
            raise ValueError("unpadded batches (token_index) cannot be split into micro-batches: "
                             "use accumulation_steps=1 or unpad_multiple=0")
        micro = jax.tree.map(lambda x: x.reshape(accumulation_steps, -1, *x.shape[1:]), batch)

        def body(carry, xs):
            i, mb = xs
            g, m = grad_fn(state.params, graphdef, mb, jax.random.fold_in(rng, i), False)
            return jax.tree.map(jnp.add, carry, (g, m)), None

        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
            lambda: grad_fn(state.params, graphdef, jax.tree.map(lambda x: x[0], micro), rng, False)))
        (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(accumulation_steps), micro))
        grads = jax.tree.map(lambda g: g / accumulation_steps, grads)

    return apply_gradients(state, grads, tx, schedule, summarize(sums))


def apply_gradients(state: TrainState, grads, tx, schedule, metrics: dict) -> tuple[TrainState, dict]:
    """The optimizer update, shared by pre-training and fine-tuning; adds the learning rate and the
    gradient and parameter norms to ``metrics``."""
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, learning_rate=schedule(state.step), grad_norm=optax.global_norm(grads),
                   param_norm=optax.global_norm(params))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(state: TrainState, batch: dict, *, graphdef) -> dict:
    """Sums over one batch (add them up across batches, then `summarize`)."""
    _, sums = _loss(state.params, graphdef, batch, None, True)
    return sums

"""Pure fine-tuning steps for the four task kinds (see ``input_pipeline/tasks/base.py``).

| kind | model | output | loss |
|---|---|---|---|
| classification | `BertClassifier` (pooled [CLS]) | logits [B, C] | cross-entropy on ``label`` |
| regression | `BertClassifier` with 1 label | predictions [B] | mean squared error on ``label`` |
| tagging | `BertTagger` | logits [B, L, C] | cross-entropy on ``label_ids`` where ``label_mask`` |
| span | `BertForQuestionAnswering` | start/end logits [B, L] | mean of start and end cross-entropy |

The state is the pre-training `TrainState` (step, pure-dict params, optimizer state); the steps
are jitted once by the fine-tuning loop with explicit shardings and donation. Every batch carries
``weight`` [B] (1 real row, 0 padding) so a padded last eval batch counts only its real rows, and
may carry ``token_index`` [shards, tokens] (``config.unpad_multiple``, `bert_jax.finetuning.lengths`):
then the encoder's blocks run on the real tokens only, with the same outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.models import BertClassifier, BertForQuestionAnswering, BertTagger
from bert_jax.training.state import TrainState
from bert_jax.training.train_step import apply_gradients
from input_pipeline.tasks.base import KINDS


def make_model(cfg: BertConfig, kind: str, num_labels: int, seed: int) -> nnx.Module:
    """The task model (eager construction; call under `jax.jit`/`nnx.jit` or `jax.eval_shape`)."""
    rngs = nnx.Rngs(seed)
    if kind == "classification":
        return BertClassifier(cfg, num_labels, rngs=rngs)
    if kind == "regression":
        return BertClassifier(cfg, 1, rngs=rngs)
    if kind == "tagging":
        return BertTagger(cfg, num_labels, rngs=rngs)
    if kind == "span":
        return BertForQuestionAnswering(cfg, rngs=rngs)
    raise ValueError(f"unknown task kind {kind!r}; expected one of {KINDS}")


def forward(params, graphdef, batch, rng, kind: str, deterministic: bool) -> dict[str, jax.Array]:
    model = nnx.merge(graphdef, params)
    rngs = None if deterministic else nnx.Rngs(dropout=rng)
    args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
    kw = dict(deterministic=deterministic, rngs=rngs, token_index=batch.get("token_index"))  # unpadded blocks
    if kind == "span":
        start, end = model(*args, **kw)
        return {"start_logits": start, "end_logits": end}  # [batch, length] each
    out = model(*args, **kw)
    if kind == "regression":
        return {"predictions": out[:, 0]}  # [batch]
    return {"logits": out}  # [batch, labels] or [batch, length, labels]


def losses(out: dict, batch: dict, kind: str) -> dict[str, jax.Array]:
    """Sums over the batch (``loss_sum`` / ``count``, and ``correct`` where it means something)."""
    w = batch["weight"].astype(jnp.float32)  # [batch]
    if kind == "classification":
        logits, labels = out["logits"], batch["label"]  # [batch, labels], [batch]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [batch]
        correct = (jnp.argmax(logits, -1) == labels) * w
        return {"loss_sum": (ce * w).sum(), "count": w.sum(), "correct": correct.sum()}
    if kind == "regression":
        err = (out["predictions"] - batch["label"].astype(jnp.float32)) ** 2  # [batch]
        return {"loss_sum": (err * w).sum(), "count": w.sum()}
    if kind == "tagging":
        logits, labels = out["logits"], batch["label_ids"]  # [batch, length, labels], [batch, length]
        tw = batch["label_mask"].astype(jnp.float32) * w[:, None]  # [batch, length]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [batch, length]
        correct = (jnp.argmax(logits, -1) == labels) * tw
        return {"loss_sum": (ce * tw).sum(), "count": tw.sum(), "correct": correct.sum()}
    ce = sum(optax.softmax_cross_entropy_with_integer_labels(out[f"{s}_logits"], batch[f"{s}_positions"])
             for s in ("start", "end")) / 2  # [batch]
    return {"loss_sum": (ce * w).sum(), "count": w.sum()}


def summarize(sums: dict) -> dict:
    out = {"loss": sums["loss_sum"] / jnp.maximum(sums["count"], 1e-9)}
    if "correct" in sums:
        out["accuracy"] = sums["correct"] / jnp.maximum(sums["count"], 1e-9)
    return out


def _loss(params, graphdef, batch, rng, kind):
    sums = losses(forward(params, graphdef, batch, rng, kind, False), batch, kind)
    return sums["loss_sum"] / jnp.maximum(sums["count"], 1e-9), sums


def train_step(state: TrainState, batch: dict, rng: jax.Array, *, graphdef, tx, schedule,
               kind: str) -> tuple[TrainState, dict]:
    """One optimizer step on the mean loss of the batch's real rows; dropout key = rng ⊕ step."""
    rng = jax.random.fold_in(rng, state.step)
    grads, sums = jax.grad(_loss, has_aux=True)(state.params, graphdef, batch, rng, kind)
    return apply_gradients(state, grads, tx, schedule, summarize(sums))


def eval_step(params: dict, batch: dict, *, graphdef, kind: str) -> tuple[dict, dict]:
    """Deterministic outputs for a batch (the task post-processes them) and the loss sums (test
    splits have all-zero labels: their sums mean nothing and are ignored)."""
    out = forward(params, graphdef, batch, None, kind, True)
    return out, losses(out, batch, kind)

"""The jitted steps every trainer runs: one builder for pre-training and fine-tuning.

A task supplies what differs — the model (``make_model(seed)``), a pure ``train_step(state,
batch, rng, *, graphdef, tx, schedule)`` and a pure ``eval_step(params, batch, *, graphdef)``
(`bert_jax.training.train_step` for pre-training's objectives, `bert_jax.finetuning.steps` for the
four task kinds) — and `jit_steps` does the rest the same way for both: the optimizer (its
per-layer trust ratios see the model's stacked axes), the state's layout and shardings under the
config's logical-axis rules, and the two steps jitted once with explicit in/out shardings and the
state donated. The trainers, the benchmark and ahead-of-time compilation all run what this returns,
so what they measure is what trains.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
from jax.sharding import Mesh, NamedSharding

from bert_jax.model.activation_sharding import rules_in_effect
from bert_jax.training import sharding as sh
from bert_jax.training.optim import make_optimizer
from bert_jax.training.state import StateLayout, model_stacked_axes, state_layout


@dataclasses.dataclass(frozen=True)
class Steps:
    """A task's steps as the trainer runs them: jitted with explicit shardings, state donated."""

    layout: StateLayout
    train_fn: Callable  # (state, batch, rng) -> (state, metrics)
    eval_fn: Callable  # (params, batch) -> the task's evaluation outputs (pre-training: metric sums)
    mesh: Mesh
    rules: tuple
    batch_sharding: NamedSharding
    schedule: Callable  # optimizer step -> learning rate
    accumulation_steps: int = 1  # micro-batches per optimizer step (a `lax.scan` inside train_fn)


def traced_under(fn: Callable, mesh: Mesh, rules: tuple) -> Callable:
    """``fn`` with the activation rules in effect while it runs: under ``jax.jit``, while it is traced
    (`bert_jax.model.activation_sharding`)."""

    def run(*args, **kwargs):
        with rules_in_effect(mesh, rules):
            return fn(*args, **kwargs)

    return run


def jit_steps(make_model: Callable, optimizer: dict, mesh: Mesh, rules: tuple, train_step: Callable,
              eval_step: Callable, accumulation_steps: int = 1) -> Steps:
    """``optimizer``: `make_optimizer`'s settings (learning rate, schedule, warmup and total steps,
    decay, clipping); ``train_step`` / ``eval_step`` with their task's arguments already bound
    (``functools.partial``); ``accumulation_steps``: what ``train_step`` was bound with, recorded."""
    tx, schedule = make_optimizer(optimizer, stacked=model_stacked_axes(make_model))
    layout = state_layout(make_model, tx, mesh, rules)
    batch_sh = sh.batch_sharding(mesh, rules)
    train_fn = jax.jit(traced_under(functools.partial(train_step, graphdef=layout.graphdef, tx=tx, schedule=schedule),
                                    mesh, rules),
                       in_shardings=(layout.shardings, batch_sh, None), out_shardings=(layout.shardings, None),
                       donate_argnums=0)
    eval_fn = jax.jit(traced_under(functools.partial(eval_step, graphdef=layout.graphdef), mesh, rules),
                      in_shardings=(layout.shardings.params, batch_sh))
    return Steps(layout, train_fn, eval_fn, mesh, rules, batch_sh, schedule, accumulation_steps)

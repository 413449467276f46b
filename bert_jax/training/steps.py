"""The training state, its place on the mesh and the jitted steps: one builder for pre-training,
fine-tuning, the benchmark and ahead-of-time compilation.

`state_layout` takes any model constructor, evaluates it abstractly (nothing is allocated), reads
each parameter's logical axis names and turns them, through the config's sharding rules, into a
``NamedSharding`` for every leaf of the state (parameters, optimizer moments, step). The state is
then created directly in its shards (`StateLayout.create`), or from given parameters
(`StateLayout.from_params`, fine-tuning's warm start), or restored into them (`StateLayout.target`).

`jit_steps` does the rest the same way for every task: a task supplies the model (``make_model(seed)``),
a pure ``train_step(state, batch, rng, *, graphdef, tx, schedule)`` and a pure ``eval_step(params,
batch, *, graphdef)`` (`bert_jax.pretraining.objective`, `bert_jax.finetuning.task`); this builds the
optimizer (its per-layer trust ratios see the model's stacked axes) and the state's layout, and jits
the two steps once with explicit in/out shardings and the state donated. The trainer, the benchmark
and ahead-of-time compilation all run what it returns, so what they measure is what trains.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.model.activation_sharding import rules_in_effect
from bert_jax.model.axes import stacked_axes
from bert_jax.training import sharding as sh
from bert_jax.training.global_norm import norm_fn
from bert_jax.training.optim import make_optimizer


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 [], optimizer steps taken
    params: dict  # the model's parameters as a pure nested dict (nnx.merge(graphdef, params))
    opt_state: Any


def new_state(params: dict, tx: optax.GradientTransformation) -> TrainState:
    """A fresh state (step 0) over ``params`` (a pure dict)."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def _params(model: nnx.Module) -> dict:
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """A model's structure and its state's shapes and shardings."""

    make_model: Callable[[int], nnx.Module]  # seed -> model (eager; called under jit or eval_shape)
    tx: optax.GradientTransformation
    graphdef: nnx.GraphDef
    abstract: TrainState  # jax.ShapeDtypeStruct leaves
    shardings: TrainState  # NamedSharding leaves

    def target(self) -> TrainState:
        """ShapeDtypeStructs that carry the shardings: what Orbax restores into and what
        ahead-of-time compilation lowers with."""
        return jax.tree.map(lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                            self.abstract, self.shardings)

    def create(self, seed: int, compiler_options: dict | None = None) -> TrainState:
        """A new state, each parameter initialised directly in its shards (never whole on one device)."""
        init = jax.jit(lambda: new_state(_params(self.make_model(seed)), self.tx), out_shardings=self.shardings)
        return (init.lower().compile(compiler_options=compiler_options) if compiler_options else init)()

    def from_params(self, params: dict) -> TrainState:
        """A new state over given parameters (e.g. a warm-started model's), placed in its shards."""
        return jax.jit(functools.partial(new_state, tx=self.tx), out_shardings=self.shardings)(params)


def model_stacked_axes(make_model: Callable[[int], nnx.Module]) -> dict:
    """The layers axis of each of ``make_model``'s parameters (`bert_jax.model.axes.stacked_axes`;
    what LAMB's per-layer trust ratio needs), read abstractly: nothing is allocated."""
    return stacked_axes(nnx.state(nnx.eval_shape(lambda: make_model(0)), nnx.Param))


def state_layout(make_model: Callable[[int], nnx.Module], tx: optax.GradientTransformation, mesh: Mesh,
                 rules) -> StateLayout:
    """The layout of ``make_model``'s training state on ``mesh`` under the sharding ``rules``."""
    graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: make_model(0)), nnx.Param)
    abstract = jax.eval_shape(functools.partial(new_state, tx=tx), nnx.to_pure_dict(abstract_params))
    params = sh.param_shardings(abstract_params, mesh, rules)
    shardings = TrainState(step=NamedSharding(mesh, PartitionSpec()), params=params,
                           opt_state=sh.optimizer_shardings(tx, abstract.opt_state, params, mesh))
    return StateLayout(make_model, tx, graphdef, abstract, shardings)


def apply_gradients(state: TrainState, grads, tx, schedule, metrics: dict, norm: Callable = optax.tree.norm
                    ) -> tuple[TrainState, dict]:
    """The optimizer update every task's ``train_step`` ends with; adds the learning rate and the
    gradient and parameter norms (``norm``: bert_jax/training/global_norm.py) to ``metrics``."""
    with jax.named_scope("optimizer"):  # the profile's "optimizer" row (bert_jax/benchmark/profile.py)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, learning_rate=schedule(state.step), grad_norm=norm(grads), param_norm=norm(params))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def train_step(state: TrainState, batch: dict, rng: jax.Array, *, graphdef, tx, schedule, loss: Callable,
               denominators: Callable, summarize: Callable, accumulation_steps: int = 1,
               norm: Callable = optax.tree.norm) -> tuple[TrainState, dict]:
    """One optimizer step of a task: ``loss(params, graphdef, batch, rng, denominators) -> (loss,
    sums)`` (``denominators`` None: the batch's own counts), its gradients, the update.

    With ``accumulation_steps`` k the batch's leading axis is split into k micro-batches whose
    gradients are summed in a ``lax.scan`` (one update per call; the schedule counts optimizer
    steps). Each micro-batch's loss divides by the whole batch's counts (``denominators(batch)``), so
    the sum is the whole batch's loss and gradient up to rounding. Dropout keys: ``rng`` folded with
    the step (and micro-batch); ``summarize`` turns the summed metrics into the logged ones."""
    rng = jax.random.fold_in(rng, state.step)
    grad_fn = jax.grad(loss, has_aux=True)
    if accumulation_steps == 1:
        grads, sums = grad_fn(state.params, graphdef, batch, rng, None)
    else:
        if "token_index" in batch:
            raise ValueError("unpadded batches (token_index) cannot be split into micro-batches: "
                             "use per_device_batch=0 or unpad_multiple=0")
        # Micro-batch i takes rows i, i + k, i + 2k, ...: each device keeps its own rows in every
        # micro-batch (a [k, rows/k] split of contiguous blocks would gather the batch across devices
        # and repeat the work k times over them). [k, batch / k, ...]
        micro = jax.tree.map(lambda x: x.reshape(-1, accumulation_steps, *x.shape[1:]).swapaxes(0, 1), batch)
        whole = denominators(batch)

        def body(carry, xs):
            i, mb = xs
            g, m = grad_fn(state.params, graphdef, mb, jax.random.fold_in(rng, i), whole)
            return jax.tree.map(jnp.add, carry, (g, m)), None

        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
            lambda: grad_fn(state.params, graphdef, jax.tree.map(lambda x: x[0], micro), rng, whole)))
        (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(accumulation_steps), micro))
    return apply_gradients(state, grads, tx, schedule, summarize(sums), norm)


def accumulation_steps(config, mesh: Mesh, rules) -> int:
    """Micro-batches per optimizer step, pre-training's and fine-tuning's, from the one knob,
    ``config.per_device_batch`` (resolved to a number at the job's start, `bert_jax.resolve`): N > 0
    rows per batch shard (data x fsdp devices) in a micro-batch gives ``batch_size / (N * batch
    shards)`` of them, so one recipe runs on any slice; 0: one."""
    per_device = config.per_device_batch
    if isinstance(per_device, bool) or not isinstance(per_device, int):
        raise ValueError(f"per_device_batch={per_device!r} is not resolved: resolve the config first "
                         "(bert_jax.resolve)")
    if not per_device:
        return 1
    shards = sh.batch_shards(mesh, rules)
    if config.batch_size % (per_device * shards):
        raise ValueError(f"batch_size {config.batch_size} is not a multiple of per_device_batch {per_device} x "
                         f"{shards} batch shards (mesh {dict(mesh.shape)}): choose per_device_batch dividing "
                         f"{config.batch_size // shards if config.batch_size % shards == 0 else 'batch_size / shards'}")
    return config.batch_size // (per_device * shards)


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
    norm: Callable = optax.tree.norm  # the global norm of the clip and the logged norms (`global_norm.norm_fn`)


def traced_under(fn: Callable, mesh: Mesh, rules: tuple) -> Callable:
    """``fn`` with the activation rules in effect while it runs: under ``jax.jit``, while it is traced
    (`bert_jax.model.activation_sharding`)."""

    def run(*args, **kwargs):
        with rules_in_effect(mesh, rules):
            return fn(*args, **kwargs)

    return run


def jit_steps(make_model: Callable, optimizer: dict, mesh: Mesh, rules: tuple, train_step: Callable,
              eval_step: Callable, accumulation_steps: int = 1, global_norm: str = "per_leaf",
              compiler_options: dict | None = None) -> Steps:
    """``optimizer``: `make_optimizer`'s settings (learning rate, schedule, warmup and total steps,
    decay, clipping); ``train_step`` / ``eval_step`` with their task's arguments already bound
    (``functools.partial``); ``accumulation_steps``: what ``train_step`` was bound with, recorded;
    ``global_norm``: how the clip's and the logged norms are computed (a config's resolved
    ``global_norm``, bert_jax/training/global_norm.py); ``compiler_options``: XLA's, for both steps'
    compiles (a config's ``xla_options``, bert_jax/training/compiler_options.py)."""
    tx, schedule = make_optimizer(optimizer, stacked=model_stacked_axes(make_model), global_norm=global_norm)
    norm = norm_fn(global_norm)
    layout = state_layout(make_model, tx, mesh, rules)
    batch_sh = sh.batch_sharding(mesh, rules)
    train_fn = jax.jit(traced_under(functools.partial(train_step, graphdef=layout.graphdef, tx=tx, schedule=schedule,
                                                      norm=norm), mesh, rules),
                       in_shardings=(layout.shardings, batch_sh, None), out_shardings=(layout.shardings, None),
                       donate_argnums=0, compiler_options=compiler_options)
    eval_fn = jax.jit(traced_under(functools.partial(eval_step, graphdef=layout.graphdef), mesh, rules),
                      in_shardings=(layout.shardings.params, batch_sh), compiler_options=compiler_options)
    return Steps(layout, train_fn, eval_fn, mesh, rules, batch_sh, schedule, accumulation_steps, norm)

"""The training state and its place on the mesh: one builder for pre-training, fine-tuning, the
benchmark and ahead-of-time compilation.

`state_layout` takes any model constructor, evaluates it abstractly (nothing is allocated), reads
each parameter's logical axis names and turns them, through the config's sharding rules, into a
``NamedSharding`` for every leaf of the state (parameters, optimizer moments, step). The state is
then created directly in its shards (`StateLayout.create`), or from given parameters
(`StateLayout.from_params`, fine-tuning's warm start), or restored into them (`StateLayout.target`).
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

from bert_jax.model.axes import stacked_axes
from bert_jax.training import sharding as sh


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 [], optimizer steps taken
    params: dict  # the model's parameters as a pure nested dict (nnx.merge(graphdef, params))
    opt_state: Any


def new_state(params: dict, tx: optax.GradientTransformation) -> TrainState:
    """A fresh state (step 0) over ``params`` (a pure dict)."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def _params(model: nnx.Module) -> dict:
    return nnx.state(model, nnx.Param).to_pure_dict()


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
    abstract = jax.eval_shape(functools.partial(new_state, tx=tx), abstract_params.to_pure_dict())
    params = sh.param_shardings(abstract_params, mesh, rules)
    shardings = TrainState(step=NamedSharding(mesh, PartitionSpec()), params=params,
                           opt_state=sh.optimizer_shardings(tx, abstract.opt_state, params, mesh))
    return StateLayout(make_model, tx, graphdef, abstract, shardings)

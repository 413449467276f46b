"""Activation sharding: where the model says how its activations are split over the mesh.

Without it the compiler propagates the *weights'* split into the activations: under FSDP
(``embed -> fsdp``) the embedding output comes out split on its hidden width, and from there every
block runs as if FSDP were tensor parallelism on the width — the whole fsdp group's batch on every
device, feed-forward intermediates of the group's batch saved for the backward pass, all-reduces
of [batch, length, mlp] (issue 30: BERT-base on v5e-8, 11.9 GiB of temporaries per chip under
FSDP against 3.8 data parallel). As MaxText does, the model names its activations' logical axes
(`bert_jax.model.axes`, ``activation_*``) at every layer boundary and inside the block, and the
job's rules (``config.sharding_rules``, beside the weights') map them to mesh axes.

The rules and the mesh are in effect while a step is traced (`rules_in_effect`, which the step
builder enters); a model traced outside it (one device, a test, the server) is unconstrained, as
before. A name without a rule, or a dimension its mesh axes do not divide, is left to the compiler
(``PartitionSpec.UNCONSTRAINED``), never forced to be replicated.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

_IN_EFFECT: contextvars.ContextVar[tuple[Mesh, dict] | None] = contextvars.ContextVar("activation_rules",
                                                                                      default=None)


@contextlib.contextmanager
def rules_in_effect(mesh: Mesh, rules: Sequence[tuple]) -> Iterator[None]:
    """Within: `constrain` splits activations over ``mesh`` by ``rules`` (logical name -> mesh axis,
    axes or None). Enter it around the *tracing* of a step (jit traces on the first call)."""
    token = _IN_EFFECT.set((mesh, dict((name, target) for name, target in rules)))
    try:
        yield
    finally:
        _IN_EFFECT.reset(token)


def spec(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: dict) -> PartitionSpec:
    """The PartitionSpec of an activation of ``shape`` with these logical ``names``: a mesh axis at
    most once, a size-1 mesh axis dropped; no rule, or a dimension that does not divide, is left
    UNCONSTRAINED; a rule of None means replicated."""
    used: set[str] = set()
    out = []
    for name, dim in zip(names, shape, strict=True):
        if name is None or name not in rules:
            out.append(PartitionSpec.UNCONSTRAINED)
            continue
        target = rules[name]
        mesh_axes = (target,) if isinstance(target, str) else tuple(target or ())
        mesh_axes = tuple(a for a in mesh_axes if a not in used and mesh.shape[a] > 1)
        if not mesh_axes:
            out.append(None)
        elif dim % math.prod(mesh.shape[a] for a in mesh_axes) == 0:
            used.update(mesh_axes)
            out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
        else:
            out.append(PartitionSpec.UNCONSTRAINED)
    return PartitionSpec(*out)


def constrain(x: jax.Array, *names: str | None) -> jax.Array:
    """``x`` constrained to the split its logical axis ``names`` (one per dimension) give under the
    rules in effect; ``x`` itself when none are, or when no name has a rule."""
    in_effect = _IN_EFFECT.get()
    if in_effect is None:
        return x
    mesh, rules = in_effect
    if len(names) != x.ndim:
        raise ValueError(f"{len(names)} axis names {names} for an activation of shape {x.shape}")
    if not any(name in rules for name in names) or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec(names, x.shape, mesh, rules)))


def per_shard(fn, *names: Sequence[str | None]):
    """``fn`` run once per shard (``jax.shard_map``) when rules are in effect on a mesh of several
    devices: a kernel XLA does not partition (a Pallas call) would otherwise be gathered whole onto
    every device. ``names``: each argument's logical axis names; an axis without a split is whole
    in every shard; the output is split like the first argument. Without rules, ``fn`` itself."""
    in_effect = _IN_EFFECT.get()
    if in_effect is None or in_effect[0].size == 1:
        return fn
    mesh, rules = in_effect

    def whole(p: PartitionSpec) -> PartitionSpec:  # UNCONSTRAINED: not split inside the kernel's call
        return PartitionSpec(*(None if a is PartitionSpec.UNCONSTRAINED else a for a in p))

    def run(*args):
        specs = tuple(whole(spec(n, a.shape, mesh, rules)) for n, a in zip(names, args, strict=True))
        return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=specs[0], check_vma=False)(*args)

    return run

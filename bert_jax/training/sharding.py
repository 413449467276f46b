"""Logical axis names → mesh shardings.

The rules that map the model's logical axis names (`bert_jax.model.axes`) to the mesh axes
('data', 'fsdp', 'tensor') live in the job config (``config.sharding_rules``;
`bert_jax.training.sharding_rules.DEFAULT_RULES` is the default both pre-training and fine-tuning
configs use); this module turns them into ``NamedSharding``s for the parameters, the optimizer state
and the batches, and builds a config's mesh (`config_mesh`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from bert_jax.model.axes import BATCH
from bert_jax.training.sharding_rules import MESH_AXES


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh; one -1 entry takes the remaining devices.

    A single CPU or GPU is the mesh (1, 1, 1): there is no separate single-device code path.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = list(shape)
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"mesh shape {tuple(shape)} must have {len(MESH_AXES)} entries {MESH_AXES}")
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh shape {tuple(shape)}: positive sizes and at most one -1 allowed")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if len(devices) % known:
            raise ValueError(f"mesh shape {tuple(shape)} does not divide {len(devices)} devices")
        shape[shape.index(-1)] = len(devices) // known
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh shape {tuple(shape)} needs {math.prod(shape)} devices, found {len(devices)}")
    return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def config_mesh(config, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh of ``config.mesh_shape`` (`make_mesh`) over ``devices`` (default: all)."""
    return make_mesh(tuple(config.mesh_shape), devices)


def logical_to_mesh(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Sequence[tuple[str, Any]]) -> PartitionSpec:
    """Mesh PartitionSpec for an array with these logical axis names.

    A mesh axis is used at most once per array, and a dimension that the mesh axes do not divide
    evenly stays replicated (vocab 30522 over 4 tensor shards, say) rather than failing.
    """
    table = dict(rules)
    used: set[str] = set()
    out = []
    for name, dim in zip(names, shape, strict=True):
        target = table.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
        if axes and dim % math.prod(mesh.shape[a] for a in axes) == 0:
            used.update(axes)
            out.append(axes[0] if len(axes) == 1 else axes)
        else:
            out.append(None)
    return PartitionSpec(*out)


def param_shardings(abstract_params: nnx.State, mesh: Mesh, rules) -> dict:
    """A pure dict of NamedShardings for parameters whose Variables carry logical names."""
    specs = nnx.to_pure_dict(nnx.get_partition_spec(abstract_params))
    shapes = nnx.to_pure_dict(abstract_params)
    return jax.tree.map(lambda spec, a: NamedSharding(mesh, logical_to_mesh(tuple(spec), a.shape, mesh, rules)),
                        specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec))


def optimizer_shardings(tx, abstract_opt_state, params_sharding: dict, mesh: Mesh) -> Any:
    """Optimizer state leaves shaped like parameters (Adam moments, momentum) are sharded like
    them; counters and other leaves are replicated."""
    import optax

    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(tx, lambda _, sharding: sharding, abstract_opt_state, params_sharding,
                                 transform_non_params=lambda _: replicated)


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
    """Batch arrays are split along their leading axis by the 'batch' rule (any rank)."""
    spec = logical_to_mesh((BATCH,), (math.prod(mesh.devices.shape),), mesh, rules)
    return NamedSharding(mesh, PartitionSpec(spec[0]))


def batch_shards(mesh: Mesh, rules) -> int:
    """How many pieces the batch axis is split into (the data-parallel devices)."""
    spec = batch_sharding(mesh, rules).spec[0]
    axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    return math.prod(mesh.shape[a] for a in axes)


def global_batch(local: dict[str, np.ndarray], mesh: Mesh, rules) -> dict[str, jax.Array]:
    """Each process's slice of the batch → global arrays (multi-host: every host feeds its rows)."""
    sharding = batch_sharding(mesh, rules)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}


def process_block(mesh: Mesh, rules, batch_size: int) -> tuple[int, int]:
    """(i, n): this process feeds rows ``[i * batch_size / n, (i + 1) * batch_size / n)`` of every
    global batch, the rows its devices hold under the batch sharding (n = the number of processes).
    A mesh that gives a process anything else (rows of several blocks, or rows that another process
    also holds) is refused: each process reads its own share of the input."""
    n = jax.process_count()
    if n == 1:
        return 0, 1
    if batch_size % n:
        raise ValueError(f"batch_size {batch_size} is not divisible by {n} processes")
    local = batch_size // n
    rows = set()
    for index in batch_sharding(mesh, rules).addressable_devices_indices_map((batch_size,)).values():
        rows.update(range(*index[0].indices(batch_size)))
    first = min(rows)
    if rows != set(range(first, first + local)) or first % local:
        raise ValueError(
            f"mesh {dict(mesh.shape)}: process {jax.process_index()}'s devices hold {len(rows)} batch rows from "
            f"{first} of {batch_size}, not one block of {local} rows; put each process's devices on its own "
            "rows of the 'batch' axes (e.g. the 'data' axis across processes)")
    return first // local, n


def global_batch_from_host(batch: dict[str, np.ndarray], mesh: Mesh, rules) -> dict[str, jax.Array]:
    """A global batch that every process holds whole in host memory → global arrays (each
    process places the rows of its own devices)."""
    sharding = batch_sharding(mesh, rules)
    return {k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index]) for k, v in batch.items()}

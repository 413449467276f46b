"""The rules that map the model's logical axis names to the mesh axes, as data (no JAX here: the
job configs import it): the default table every config copies, and a config's rules as the tuple
the sharding functions take (`bert_jax.training.sharding`)."""

from __future__ import annotations

MESH_AXES = ("data", "fsdp", "tensor")
# The default rules of every job config: batch over data and fsdp, parameters fully sharded over
# fsdp (FSDP/ZeRO-3) on their model axis and split over tensor on heads, mlp and vocab (Megatron);
# activations split like the batch over data and fsdp (each device computes its own rows, with the
# weights gathered per layer: FSDP, not tensor parallelism on the width), and over tensor on heads,
# the feed-forward intermediate and the logits (bert_jax/model/activation_sharding.py).
DEFAULT_RULES = (("batch", ("data", "fsdp")), ("vocab", "tensor"), ("embed", "fsdp"), ("heads", "tensor"),
                 ("kv", None), ("mlp", "tensor"), ("layers", None), ("length", None),
                 ("activation_batch", ("data", "fsdp")), ("activation_length", None), ("activation_embed", None),
                 ("activation_heads", "tensor"), ("activation_kv", None), ("activation_mlp", "tensor"),
                 ("activation_vocab", "tensor"))


def config_rules(config) -> tuple:
    """``config.sharding_rules`` (lists, as config.json holds them) as a tuple of (name, mesh axes) tuples."""
    return tuple(tuple(rule) for rule in config.sharding_rules)

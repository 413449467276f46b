"""Activation sharding (bert_jax/model/activation_sharding.py) on the 8 fake CPU devices: under FSDP
the compiled step keeps each device on its own rows, so its temporaries are at most data
parallel's; without the activation rules the weights' split spreads into the activations and the
same step needs several times more (the control, so the bound can fail)."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax.model import activation_sharding as act
from bert_jax.pretraining import objective
from bert_jax.resolve import described_model, resolve
from bert_jax.training import sharding as sh
from bert_jax.training.sharding_rules import DEFAULT_RULES
from input_pipeline.pretraining.batch import shapes as batch_shapes


def test_spec_leaves_what_has_no_rule_to_the_compiler():
    mesh = sh.make_mesh((2, 2, 2))
    rules = dict(DEFAULT_RULES)
    names = ("activation_batch", "activation_length", "activation_embed")
    assert act.spec(names, (8, 16, 32), mesh, rules) == P(("data", "fsdp"), None, None)
    assert act.spec(("activation_batch", None, "activation_mlp"), (8, 16, 64), mesh, rules) == \
        P(("data", "fsdp"), P.UNCONSTRAINED, "tensor")
    assert act.spec(("activation_batch", "activation_vocab"), (6, 101), mesh, rules) == \
        P(P.UNCONSTRAINED, P.UNCONSTRAINED)  # 6 rows over 4 shards, 101 over 2: the compiler's choice
    assert act.spec(("activation_batch", "nope"), (8, 3), mesh, {}) == P(P.UNCONSTRAINED, P.UNCONSTRAINED)


def test_without_rules_in_effect_nothing_is_constrained():
    x = jax.numpy.ones((8, 4))
    assert act.constrain(x, "activation_batch", "activation_embed") is x
    with act.rules_in_effect(sh.make_mesh((8, 1, 1)), ()):  # rules that name no activation
        assert act.constrain(x, "activation_batch", "activation_embed") is x
    with act.rules_in_effect(sh.make_mesh((8, 1, 1)), DEFAULT_RULES), pytest.raises(ValueError, match="3 axis"):
        act.constrain(x, "activation_batch", "activation_length", "activation_embed")


# The step is compiled only for its buffer assignment, never run: XLA assigns buffers before LLVM
# generates code, so LLVM's optimisations only cost time (~40% of each compile here; the bytes were
# the same to the byte with and without them, 2026-11-26).
NO_LLVM_OPTIMISATION = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _temporaries(load_config, mesh_shape, arg="size=tiny", activation_rules=True, **config) -> int:
    """Per-device bytes of temporaries of the compiled pre-training step (batch 64 x 128)."""
    c = load_config("pretrain", f"{arg},synthetic")
    c.batch_size, c.per_device_batch, c.mesh_shape = 64, 0, mesh_shape
    for key, value in config.items():
        c[key] = value
    if not activation_rules:
        c.sharding_rules = tuple(r for r in c.sharding_rules if not r[0].startswith("activation_"))
    c = resolve(c, "cpu", batch_shards=1)
    steps = objective.jit_pretraining_steps(c, described_model(c.model, vocab_size=1000), sh.make_mesh(mesh_shape))
    shapes = batch_shapes(c.batch_size, c.data.max_seq_length, c.data.max_predictions_per_seq)
    if c.unpad_multiple:  # each of the 8 batch shards: its 8 rows' real tokens, here half of them
        shapes["token_index"] = ((8, 8 * c.data.max_seq_length // 2), "int32")
    batch = {k: jax.ShapeDtypeStruct(s, d, sharding=steps.batch_sharding) for k, (s, d) in shapes.items()}
    rng = jax.eval_shape(lambda: jax.random.key(0))
    compiled = steps.train_fn.lower(steps.layout.target(), batch, rng).compile(compiler_options=NO_LLVM_OPTIMISATION)
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow  # ~20 s: two compiles on 8 devices; the rules themselves: the two tests above
def test_fsdp_needs_no_more_temporaries_than_data_parallel(load_config):
    """~20 s on 2 cores (three compiles). Measured 2026-11-26: tiny, batch 64 x 128, vocabulary 1,000:
    data parallel 37.7 MiB, FSDP 36.0 MiB, FSDP without the activation rules 170.6 MiB."""
    data_parallel = _temporaries(load_config, (8, 1, 1))
    fsdp = _temporaries(load_config, (1, 8, 1))
    assert fsdp <= data_parallel, (fsdp, data_parallel)
    unconstrained = _temporaries(load_config, (1, 8, 1), activation_rules=False)
    assert unconstrained > 2 * data_parallel, (unconstrained, data_parallel)


@pytest.mark.slow  # ~1 min each: the same bound for the family and the other execution paths
@pytest.mark.parametrize("arg,config", [
    ("model=albert", {}), ("model=electra", {}), ("size=tiny", {"unpad_multiple": 64}),
    ("size=tiny", {"per_device_batch": 2}),  # 4 micro-batches: the accumulation carry
])
def test_fsdp_bound_holds_for_the_family_unpadded_and_accumulated(load_config, arg, config):
    data_parallel = _temporaries(load_config, (8, 1, 1), arg, **config)
    fsdp = _temporaries(load_config, (1, 8, 1), arg, **config)
    assert fsdp <= 1.05 * data_parallel, (fsdp, data_parallel)

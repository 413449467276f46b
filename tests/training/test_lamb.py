"""LAMB with one trust ratio per layer on the stacked pre-training tree (issue 21).

The reference here is written independently of bert_jax.training: a per-variable LAMB in numpy
(float64), as Google's/ALBERT's ``lamb_optimizer.py`` run it on a TF graph where every layer's
matrix is its own variable, applied to the same tree split into layers. Layer 1's weights are 3x
layer 0's, so one ratio per stacked array (``optax.scale_by_trust_ratio`` on it, the old behaviour)
differs from one per layer, and the test shows that it fails the comparison.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bert_jax.model.axes import stacked_axes
from bert_jax.model.config import BertConfig
from bert_jax.pretraining import objective as ts
from bert_jax.training import optim
from bert_jax.training import sharding as sh
from bert_jax.training.optim import make_optimizer
from bert_jax.training.steps import model_stacked_axes, state_layout
from tests.fixtures.optimizer import optimizer_config

LR, STEPS, WD, CLIP = 1e-2, 3, 0.01, 1.0
RULES = (("batch", ("data", "fsdp")), ("vocab", "tensor"), ("embed", "fsdp"), ("heads", "tensor"),
         ("mlp", "tensor"), ("kv", None), ("layers", None), ("length", None))
# The layers axis itself split over devices: the per-layer sums must not mix the layers' shards.
LAYER_RULES = (("batch", ("data", "fsdp")), ("layers", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"),
               ("vocab", None), ("embed", None), ("kv", None), ("length", None))


def tiny(**kw):
    return BertConfig.from_size("tiny", vocab_size=96, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                attention_dropout_prob=0.0, **kw)


def lamb_config(bias_correction=True):
    return optimizer_config(optimizer="lamb", learning_rate=LR, warmup_steps=0, num_train_steps=10,
                            weight_decay=WD, clip_norm=CLIP, bias_correction=bias_correction)


def pretraining_tree(cfg):
    """The real pre-training parameters, with every stacked leaf's layer 1 scaled by 3."""
    params = nnx.to_pure_dict(nnx.state(ts.pretraining_model(cfg, "nsp")(0), nnx.Param))
    scale = np.ones([cfg.stored_layers], np.float32)
    scale[1:] = 3.0
    return jax.tree_util.tree_map_with_path(
        lambda path, p: p * scale.reshape(-1, *[1] * (p.ndim - 1)) if "layers" in names(path) else p, params)


def names(path):
    return tuple(str(k.key) for k in path)


def gradients(params, seed):
    r = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(0.01 * r.normal(size=p.shape), jnp.float32), params)


# --- the independent reference ----------------------------------------------------------------

def split_into_variables(tree):
    """{"bert/layers/ffn/output/kernel/1": layer 1's matrix, ...}: leaves under ``layers`` are the
    encoder's blocks stacked on axis 0 (one variable per layer, as a TF checkpoint has them)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        key, a = "/".join(names(path)), np.asarray(leaf, np.float64)
        if "layers" in names(path):
            out.update({f"{key}/{i}": a[i] for i in range(a.shape[0])})
        else:
            out[key] = a
    return out


def reference_lamb_updates(params, grads_seq, bias_correction=True, b1=0.9, b2=0.999, eps=1e-6):
    """Per-variable LAMB: global-norm clip, Adam, decoupled decay and trust ratio on every variable
    except LayerNorm and biases (Google's exclusion list), lr decaying linearly from LR over 10 steps.
    Returns each step's updates (``-lr * u``)."""
    p = split_into_variables(params)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    out = []
    for t, grads in enumerate(grads_seq):
        g = split_into_variables(grads)
        norm = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
        lr = LR * (1 - t / 10)
        step = {}
        for k in p:
            gk = g[k] * min(1.0, CLIP / norm)
            m[k] = b1 * m[k] + (1 - b1) * gk
            v2[k] = b2 * v2[k] + (1 - b2) * gk ** 2
            mh, vh = (m[k] / (1 - b1 ** (t + 1)), v2[k] / (1 - b2 ** (t + 1))) if bias_correction else (m[k], v2[k])
            u = mh / (np.sqrt(vh) + eps)
            if adapted(k):
                u = u + WD * p[k]
                w_norm, u_norm = np.linalg.norm(p[k]), np.linalg.norm(u)
                u = u * (w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0)
            step[k] = -lr * u
            p[k] = p[k] + step[k]
        out.append(step)
    return out


def adapted(key):
    """Whether the reference gives variable ``key`` a trust ratio (not LayerNorm, not a bias)."""
    leaf = key.split("/")[-2] if "/layers/" in f"/{key}" else key.split("/")[-1]
    return not (leaf == "scale" or leaf.endswith("bias"))


def worst_relative_error(updates_seq, reference_seq):
    """(trust-ratio variables, plain-Adam variables): max over steps and variables (one per layer)
    of max|u - ref| / max|ref|.

    The plain-Adam steps (LayerNorm, biases) carry optax's float32 bias correction: 1 - 0.999^2
    loses about four digits, so they sit near 1e-5 against the float64 reference; the trust ratio
    rescales each adapted update to lr * ||w||, which cancels that common factor."""
    worst = [0.0, 0.0]
    for updates, ref in zip(updates_seq, reference_seq, strict=True):
        got = split_into_variables(updates)
        assert got.keys() == ref.keys()
        for k, r in ref.items():
            i = 0 if adapted(k) else 1
            worst[i] = max(worst[i], np.max(np.abs(got[k] - r)) / np.max(np.abs(r)))
    return tuple(worst)


def run_updates(tx, params, grads_seq, jit=None):
    """Each step's updates of ``tx`` over ``grads_seq`` (one jitted update, called per step)."""
    jit = jit or fast_jit

    @jit
    def update(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return updates, state, optax.apply_updates(params, updates)

    state, out = tx.init(params), []
    for g in grads_seq:
        updates, state, params = update(g, state, params)
        out.append(jax.device_get(updates))
    return out


def fast_jit(f, **kw):
    return jax.jit(f, compiler_options={"xla_backend_optimization_level": 0}, **kw)


# --- the tests --------------------------------------------------------------------------------

def per_layer(tree):
    """The stacked tree with the encoder's blocks as the unrolled encoder holds them: layers/0, layers/1."""
    layers = tree["bert"]["layers"]
    n = jax.tree.leaves(layers)[0].shape[0]
    return {**tree, "bert": {**tree["bert"], "layers": {str(i): jax.tree.map(lambda a, i=i: a[i], layers)
                                                        for i in range(n)}}}


def restacked(tree):
    blocks = tree["bert"]["layers"]
    stack = jax.tree.map(lambda *a: np.stack(a), *[blocks[str(i)] for i in range(len(blocks))])
    return {**tree, "bert": {**tree["bert"], "layers": stack}}


@pytest.mark.parametrize("case", ["scanned", "unrolled", pytest.param("albert_shared", marks=pytest.mark.slow),
                                  pytest.param("scanned_no_bias_correction", marks=pytest.mark.slow)])
def test_stacked_update_equals_per_variable_reference(case):
    """The scanned encoder stacks its blocks (one ratio per layer of each stack), the unrolled one
    holds them per layer (one ratio per array); ALBERT's shared block is a layers axis of length 1.
    Both give the per-variable reference's updates."""
    cfg = {"scanned": tiny(), "scanned_no_bias_correction": tiny(), "unrolled": tiny(scan_layers=False),
           "albert_shared": tiny(share_layers=True, embedding_size=64)}[case]
    params = pretraining_tree(tiny() if case == "unrolled" else cfg)  # stacked; layer 1 is 3x layer 0
    stacked = model_stacked_axes(ts.pretraining_model(cfg, "nsp"))
    layers = params["bert"]["layers"]["ffn"]["intermediate"]["kernel"].shape[0]
    assert layers == (1 if case == "albert_shared" else cfg.num_layers)
    if case == "unrolled":
        assert stacked["bert"]["layers"]["1"]["ffn"]["intermediate"]["kernel"] is None  # no layers axis
    else:
        assert stacked["bert"]["layers"]["ffn"]["intermediate"]["kernel"] == 0
    assert stacked["bert"]["embeddings"]["word_embeddings"]["embedding"] is None
    grads_seq = [gradients(params, s) for s in range(STEPS)]
    bc = case != "scanned_no_bias_correction"
    tx, _ = make_optimizer(lamb_config(bc), stacked=stacked)
    if case == "unrolled":
        updates = [restacked(u) for u in run_updates(tx, per_layer(params), [per_layer(g) for g in grads_seq])]
    else:
        updates = run_updates(tx, params, grads_seq)
    reference = reference_lamb_updates(params, grads_seq, bias_correction=bc)
    ratio_error, adam_error = worst_relative_error(updates, reference)
    assert ratio_error < 1e-5, ratio_error
    assert adam_error < (3e-5 if bc else 1e-5), adam_error


def test_one_ratio_per_stacked_array_fails_the_reference():
    """The old behaviour (one norm per array) is caught by the comparison above."""
    cfg = tiny()
    params = pretraining_tree(cfg)
    grads_seq = [gradients(params, s) for s in range(STEPS)]
    lr = optim.make_schedule(lamb_config())
    old = optax.chain(optax.clip_by_global_norm(CLIP), optax.scale_by_adam(eps=1e-6),
                      optax.add_decayed_weights(WD, mask=optim.decay_mask),
                      optax.masked(optax.scale_by_trust_ratio(), optim.decay_mask), optax.scale_by_learning_rate(lr))
    ratio_error, adam_error = worst_relative_error(run_updates(old, params, grads_seq),
                                                   reference_lamb_updates(params, grads_seq))
    assert ratio_error > 0.1, ratio_error
    assert adam_error < 3e-5, adam_error  # only the trust ratio differs


def test_lamb_needs_the_stacked_axes():
    with pytest.raises(ValueError, match="stacked"):
        make_optimizer(lamb_config())
    tx, _ = make_optimizer(lamb_config(), stacked={"a": None})
    with pytest.raises(KeyError, match="b/kernel"):
        other = {"b": {"kernel": jnp.ones(2)}}
        tx.update(other, tx.init(other), other)


@pytest.mark.parametrize("mesh_shape,rules", [
    pytest.param((1, 2, 4), RULES, marks=pytest.mark.slow), pytest.param((1, 8, 1), RULES, marks=pytest.mark.slow),
    pytest.param((1, 2, 4), LAYER_RULES, marks=pytest.mark.slow)], ids=["fsdp_tensor", "fsdp", "layers_sharded"])
def test_sharded_update_equals_one_device(mesh_shape, rules):
    cfg = tiny()
    make_model = ts.pretraining_model(cfg, "nsp")
    tx, _ = make_optimizer(lamb_config(), stacked=model_stacked_axes(make_model))
    mesh = sh.make_mesh(mesh_shape)
    shardings = state_layout(make_model, tx, mesh, rules).shardings.params
    kernel = shardings["bert"]["layers"]["attention"]["query"]["kernel"]  # [layers, embed, heads, kv]
    assert kernel.spec != jax.sharding.PartitionSpec(), "the test must shard the stacked leaves"
    params = pretraining_tree(cfg)
    grads_seq = [gradients(params, s) for s in range(STEPS)]
    sharded = run_updates(tx, jax.device_put(params, shardings), jax.device_put(grads_seq, [shardings] * STEPS),
                          functools.partial(fast_jit, in_shardings=(shardings, None, shardings)))
    ratio_error, adam_error = worst_relative_error(sharded, reference_lamb_updates(params, grads_seq))
    assert ratio_error < 1e-5, ratio_error
    assert adam_error < 3e-5, adam_error


@pytest.mark.slow
def test_accumulation_with_lamb_matches_one_big_batch():
    """Two micro-batches of 4 give the same LAMB step as one batch of 8 (FSDP mesh, equal weights).
    The key biases' true gradient is 0 (softmax ignores a shift of every score), so their Adam step is
    rounding noise over eps (~1e-8), and Adam's first step g / (|g| + eps) magnifies the rounding of
    the summation order on gradients near eps: the absolute tolerance is 1e-4 of the largest step."""
    cfg = tiny()
    make_model = ts.pretraining_model(cfg, "nsp")
    tx, schedule = make_optimizer(lamb_config(), stacked=model_stacked_axes(make_model))
    mesh = sh.make_mesh((2, 4, 1))
    layout = state_layout(make_model, tx, mesh, RULES)
    r = np.random.default_rng(0)
    batch = {"input_ids": r.integers(5, 96, (8, 16)).astype(np.int32), "input_mask": np.ones((8, 16), np.int32),
             "segment_ids": np.zeros((8, 16), np.int32),
             "masked_lm_positions": np.sort(r.choice(16, (8, 4)), axis=1).astype(np.int32),
             "masked_lm_ids": r.integers(5, 96, (8, 4)).astype(np.int32),
             "masked_lm_weights": np.ones((8, 4), np.float32),
             "next_sentence_labels": r.integers(0, 2, 8).astype(np.int32)}
    out = []
    for k in (1, 2):
        step = jax.jit(functools.partial(ts.train_step, graphdef=layout.graphdef, tx=tx, schedule=schedule,
                                         accumulation_steps=k),
                       in_shardings=(layout.shardings, sh.batch_sharding(mesh, RULES), None))
        state = layout.create(0)
        before = jax.device_get(state.params)
        state, _ = step(state, sh.global_batch(batch, mesh, RULES), jax.random.key(0))
        out.append(jax.tree.map(lambda a, b: np.asarray(a) - b, jax.device_get(state.params), before))
    stacked = stacked_axes(nnx.state(nnx.eval_shape(lambda: make_model(0)), nnx.Param))
    assert stacked["bert"]["layers"]["attention"]["query"]["kernel"] == 0
    largest = max(np.max(np.abs(a)) for a in jax.tree.leaves(out[0]))
    for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1]), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * largest)

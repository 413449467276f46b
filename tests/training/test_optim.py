"""bert_jax.training.optim: schedules, decay mask, Adam without bias correction, LAMB, clipping, accumulation."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from bert_jax.config_args import load_config_file
from bert_jax.model.config import BertConfig
from bert_jax.model.models import BertForPreTraining
from bert_jax.training import optim
from bert_jax.training.optim import OptimizerConfig, make_optimizer
from tests.fixtures.optimizer import optimizer_config, optimizer_settings

LR, W, N = 1e-4, 100, 1000


def fast_jit(f):
    """``jax.jit`` for tiny test programs: XLA's backend optimisations cost more compile time than
    they save here (about half of each test's time)."""
    return jax.jit(f, compiler_options={"xla_backend_optimization_level": 0})


def small_params(seed=0):
    """A pure-dict pytree with every kind of BERT leaf name."""
    r = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(r.normal(size=s), jnp.float32)  # noqa: E731
    return {"dense": {"kernel": f(3, 4), "bias": f(4)},
            "layer_norm": {"scale": f(4), "bias": f(4)},
            "word_embeddings": {"embedding": f(5, 3)},
            "output_bias": f(5)}


def unstacked(params):
    """The stacked-axes tree of a params tree without a layers axis (LAMB's ``stacked=``)."""
    return jax.tree.map(lambda _: None, params)


def grads_like(params, seed, scale=1.0):
    r = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(scale * r.normal(size=p.shape), jnp.float32), params)


def run(*jobs):
    """``[(final params, last updates)]`` of each ``(tx, params, grads_seq)`` job, all traced into
    one jitted program: one compile per test (eager optax dispatches op by op, slow on CPU)."""
    txs = [tx for tx, _, _ in jobs]

    @fast_jit
    def body(args):
        out = []
        for tx, (params, grads_seq) in zip(txs, args, strict=True):
            state, updates = tx.init(params), None
            for g in grads_seq:
                updates, state = tx.update(g, state, params)
                params = optax.apply_updates(params, updates)
            out.append((params, updates))
        return out

    return body([(p, list(gs)) for _, p, gs in jobs])


def final(*jobs):
    return [p for p, _ in run(*jobs)]


def assert_trees_close(a, b, rtol=1e-5, atol=1e-7):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol, atol), a, b)


# --- schedules ------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, expected", [
    # steps:  0,    50,      99,       100 (warmup end), 550 (mid-decay), 1000 (end), 1500
    ("bert", [0.0, 0.5e-4, 0.99e-4, 0.9e-4, 0.45e-4, 0.0, 0.0]),  # decay counted from step 0
    ("linear", [0.0, 0.5e-4, 0.99e-4, 1.0e-4, 0.5e-4, 0.0, 0.0]),  # decay from the end of warmup
])
def test_schedule_values(schedule, expected):
    cfg = optimizer_config(learning_rate=LR, warmup_steps=W, num_train_steps=N, schedule=schedule)
    _, fn = make_optimizer(cfg)
    steps = [0, 50, 99, 100, 550, 1000, 1500]
    np.testing.assert_allclose([float(fn(s)) for s in steps], expected, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(jax.jit(fn)(jnp.asarray(steps)), expected, rtol=1e-6, atol=1e-12)


def test_schedule_formulas_match_references():
    steps = np.arange(0, 1200, 7)
    bert = optim.bert_schedule(LR, W, N)(steps)
    google = np.where(steps < W, LR * steps / W, LR * (1 - np.minimum(steps, N) / N))
    np.testing.assert_allclose(bert, google, rtol=1e-5, atol=1e-12)
    optax_linear = optax.join_schedules(
        [optax.linear_schedule(0.0, LR, W), optax.linear_schedule(LR, 0.0, N - W)], [W])
    np.testing.assert_allclose(optim.linear_schedule(LR, W, N)(steps), optax_linear(steps),
                               rtol=1e-5, atol=1e-12)
    # no warmup: both start at the full lr
    assert float(optim.bert_schedule(LR, 0, N)(0)) == pytest.approx(LR)
    assert float(optim.linear_schedule(LR, 0, N)(0)) == pytest.approx(LR)


# --- decay mask -----------------------------------------------------------------------------------

def test_decay_mask_on_bert_pretraining_state():
    model = nnx.eval_shape(lambda: BertForPreTraining(BertConfig.from_size("tiny"), rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    mask = optim.decay_mask(state)
    assert jax.tree.structure(mask) == jax.tree.structure(state)
    named = {optim.path_names(p): m for p, m in jax.tree_util.tree_leaves_with_path(mask)}
    decayed = {"/".join(k) for k, m in named.items() if m}
    kept = {"/".join(k) for k, m in named.items() if not m}
    # 3 embeddings + q/k/v/o + 2 FFN kernels (stacked over layers) + pooler, MLM transform, NSP
    assert len(decayed) == 12 and len(kept) == 18
    assert all(k.endswith(("/kernel", "/embedding")) for k in decayed)
    assert "bert/embeddings/word_embeddings/embedding" in decayed
    assert "bert/layers/attention/query/kernel" in decayed
    for k in ("bert/embeddings/layer_norm/scale", "bert/embeddings/layer_norm/bias",
              "bert/layers/attention_norm/scale", "bert/layers/output_norm/bias",
              "mlm/layer_norm/scale", "mlm/output_bias", "bert/layers/ffn/intermediate/bias"):
        assert k in kept
    # Google's deny-list (LayerNorm / layer_norm / bias by name; our LayerNorms are *_norm)
    for k, m in named.items():
        assert m == (not any("norm" in n or "bias" in n for n in k)), k
    # the pure-dict form gives the same mask
    pure = optim.decay_mask(nnx.to_pure_dict(state))
    assert jax.tree.leaves(pure) == jax.tree.leaves(mask)


def test_state_and_pure_dict_give_same_updates():
    """An ``nnx.State`` (leaves are ``nnx.Param`` variables, as ``nnx.state(model, nnx.Param)``
    gives; the mask test covers the real model's paths) and its pure dict update alike."""
    pure, gpure = small_params(), grads_like(small_params(), 1)
    state, gstate = (nnx.State(jax.tree.map(nnx.Param, t)) for t in (pure, gpure))
    stable = dict(clip_norm=0.0, bias_correction=True)
    txs = [make_optimizer(optimizer_config(optimizer=name, warmup_steps=0, learning_rate=0.1,
                                           **(stable if name == "stableadamw" else {})),
                          stacked=unstacked(pure))[0] for name in optim.OPTIMIZERS]
    out = final(*[(tx, state, [gstate]) for tx in txs], *[(tx, pure, [gpure]) for tx in txs])
    for a, b in zip(out[:len(txs)], out[len(txs):], strict=True):
        assert isinstance(a, nnx.State)
        assert_trees_close(nnx.to_pure_dict(a), b)


# --- Adam ---------------------------------------------------------------------------------------

def test_adam_without_bias_correction_matches_numpy():
    cfg = optimizer_config(learning_rate=0.1, warmup_steps=2, num_train_steps=10, weight_decay=0.1,
                          clip_norm=1.0, bias_correction=False)
    params = small_params()
    gs = [grads_like(params, s, scale=0.5 if s == 1 else 0.05) for s in range(1, 4)]  # 1st clipped
    [got] = final((make_optimizer(cfg)[0], params, gs))

    names = [optim.path_names(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    p = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    assert float(optax.tree.norm(gs[0])) > 1 > float(optax.tree.norm(gs[1]))
    for t, gt in enumerate(gs):
        g = [np.asarray(x, np.float64) for x in jax.tree.leaves(gt)]
        norm = np.sqrt(sum((x ** 2).sum() for x in g))
        g = [x * min(1.0, cfg.clip_norm / norm) for x in g]
        lr = cfg.learning_rate * (t / cfg.warmup_steps if t < cfg.warmup_steps
                                  else 1 - t / cfg.num_train_steps)
        for i in range(len(p)):
            m[i] = cfg.b1 * m[i] + (1 - cfg.b1) * g[i]
            v[i] = cfg.b2 * v[i] + (1 - cfg.b2) * g[i] ** 2
            u = m[i] / (np.sqrt(v[i]) + cfg.eps)
            if names[i][-1] in ("kernel", "embedding"):
                u = u + cfg.weight_decay * p[i]
            p[i] = p[i] - lr * u
    for x, y in zip(jax.tree.leaves(got), p, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_bias_correction_matches_optax_adamw():
    cfg = optimizer_config(learning_rate=0.05, warmup_steps=2, num_train_steps=10, weight_decay=0.1,
                          bias_correction=True)
    params = small_params()
    gs = [grads_like(params, s, scale=0.3) for s in range(3)]
    ref_tx = optax.chain(optax.clip_by_global_norm(1.0),
                         optax.adamw(optim.bert_schedule(0.05, 2, 10), b1=0.9, b2=0.999, eps=1e-6,
                                     weight_decay=0.1, mask=optim.decay_mask))
    adamw_tx = make_optimizer(dataclasses.replace(cfg, optimizer="adamw"))[0]
    ours, ref, adamw = final(*[(tx, params, gs) for tx in (make_optimizer(cfg)[0], ref_tx, adamw_tx)])
    assert_trees_close(ours, ref)
    assert_trees_close(ours, adamw)


def stable_adamw_numpy(params, grads_seq, lr_fn, cfg, layers_axis=None):
    """StableAdamW as Wortsman et al. (2023, Algorithm 2) and optimi's ``StableAdamW(decouple_lr=True)``
    write it, in float64: debiased moments, the per-tensor (per-layer) RMS of g^2 / max(v_hat, eps^2),
    the rate over max(1, RMS), the decay weight_decay * lr / lr_peak on kernels and embeddings."""
    names = [optim.path_names(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    p = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
    m, v = [np.zeros_like(x) for x in p], [np.zeros_like(x) for x in p]
    rms_seen = []
    for t, gt in enumerate(grads_seq, start=1):
        lr = float(lr_fn(t - 1))
        for i, g in enumerate(np.asarray(x, np.float64) for x in jax.tree.leaves(gt)):
            beta1_hat = (cfg.b1**t - cfg.b1) / (cfg.b1**t - 1)  # optimi's debias_beta
            beta2_hat = (cfg.b2**t - cfg.b2) / (cfg.b2**t - 1)
            m[i] = beta1_hat * m[i] + (1 - beta1_hat) * g
            v[i] = beta2_hat * v[i] + (1 - beta2_hat) * g**2
            ratio = g**2 / np.maximum(v[i], cfg.eps**2)
            axes = tuple(a for a in range(g.ndim) if a != layers_axis) if layers_axis is not None else None
            rms = np.sqrt(ratio.mean(axis=axes, keepdims=layers_axis is not None))
            rms_seen.append(np.max(rms))
            rate = lr / np.maximum(1.0, rms)
            if names[i][-1] in ("kernel", "embedding"):
                p[i] = p[i] * (1 - rate / cfg.learning_rate * cfg.weight_decay)
            p[i] = p[i] - rate * m[i] / (np.sqrt(v[i]) + cfg.eps)
    return p, max(rms_seen)


def test_stable_adamw_matches_the_formula():
    """A gradient ten times the ones before it: the RMS term exceeds 1 and the step is cut per tensor."""
    cfg = optimizer_config(optimizer="stableadamw", learning_rate=0.1, warmup_steps=2, num_train_steps=10,
                           weight_decay=0.05, b2=0.98, eps=1e-6, clip_norm=0.0, bias_correction=True,
                           schedule="wsd", decay_steps=3)
    params = small_params()
    gs = [grads_like(params, s, scale=10.0 if s == 6 else 0.1) for s in range(1, 8)]
    tx, lr_fn = make_optimizer(cfg, stacked=unstacked(params))
    [got] = final((tx, params, gs))
    want, largest_rms = stable_adamw_numpy(params, gs, lr_fn, cfg)
    assert largest_rms > 2  # the clipping acted
    for x, y in zip(jax.tree.leaves(got), want, strict=True):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-7)


def test_stable_adamw_takes_the_rms_per_layer_of_a_stacked_leaf():
    """Layer 0 of a stacked kernel gets a sudden large gradient, layer 1 does not: only layer 0's step
    is cut, as two separate tensors would have it."""
    cfg = optimizer_config(optimizer="stableadamw", learning_rate=0.1, warmup_steps=0, weight_decay=0.0,
                           clip_norm=0.0, bias_correction=True, schedule="wsd", decay_steps=0)
    r = np.random.default_rng(0)
    params = {"layers": {"kernel": jnp.asarray(r.normal(size=(2, 3, 4)), jnp.float32)}}
    g1 = {"layers": {"kernel": jnp.asarray(0.1 * r.normal(size=(2, 3, 4)), jnp.float32)}}
    g2 = {"layers": {"kernel": jnp.asarray(r.normal(size=(2, 3, 4)) * np.array([30.0, 0.1])[:, None, None],
                                           jnp.float32)}}
    tx, lr_fn = make_optimizer(cfg, stacked={"layers": {"kernel": 0}})
    [got] = final((tx, params, [g1, g2]))
    want, _ = stable_adamw_numpy(params, [g1, g2], lr_fn, cfg, layers_axis=0)
    np.testing.assert_allclose(jax.tree.leaves(got)[0], want[0], rtol=2e-5, atol=1e-7)
    whole, _ = stable_adamw_numpy(params, [g1, g2], lr_fn, cfg)  # one RMS for both layers: not this
    assert np.abs(whole[0][1] - want[0][1]).max() > 1e-3


def test_stable_adamw_refuses_a_global_clip():
    with pytest.raises(ValueError, match="'stableadamw' with clip_norm 0"):
        optimizer_config(optimizer="stableadamw", clip_norm=1.0, bias_correction=True)


def test_clipping_caps_global_norm():
    # eps=1 makes Adam's first step depend on the gradient's scale, so clipping shows in the update
    base = optimizer_config(warmup_steps=0, learning_rate=1.0, eps=1.0, weight_decay=0.0)
    params = small_params()
    g = grads_like(params, 5)
    big = jax.tree.map(lambda x: 100 * x, g)
    unit = jax.tree.map(lambda x: x / optax.tree.norm(big) * 100, g)  # norm exactly 1
    small = jax.tree.map(lambda x: 0.5 * x, unit)
    tx, _ = make_optimizer(base)
    no_clip, _ = make_optimizer(dataclasses.replace(base, clip_norm=None))
    big_c, unit_n, small_c, small_n, big_n = final(
        (tx, params, [big]), (no_clip, params, [unit]), (tx, params, [small]),
        (no_clip, params, [small]), (no_clip, params, [big]))
    assert_trees_close(big_c, unit_n)
    assert_trees_close(small_c, small_n)  # norm below 1: untouched
    assert not np.allclose(big_n["dense"]["kernel"], unit_n["dense"]["kernel"])


# --- LAMB -----------------------------------------------------------------------------------------

def test_lamb_trust_ratio():
    cfg = optimizer_config(optimizer="lamb", learning_rate=0.01, warmup_steps=0, num_train_steps=100,
                          weight_decay=0.01, bias_correction=True, clip_norm=None)
    params = small_params()
    g = grads_like(params, 3)
    ref_lamb = optax.lamb(0.01, eps=1e-6, weight_decay=0.01, mask=optim.decay_mask)
    ref_adam = optax.adam(0.01, eps=1e-6)
    (_, updates), (_, lamb), (_, adam) = run(
        *[(tx, params, [g]) for tx in (make_optimizer(cfg, stacked=unstacked(params))[0], ref_lamb, ref_adam)])
    for path, u in jax.tree_util.tree_leaves_with_path(updates):
        names = optim.path_names(path)
        p = _get(params, names)
        if optim.decays(names):  # trust ratio: ||update|| = lr * ||p||
            np.testing.assert_allclose(np.linalg.norm(u), 0.01 * np.linalg.norm(p), rtol=1e-5)
            np.testing.assert_allclose(u, _get(lamb, names), rtol=1e-5, atol=1e-8)
        else:  # LayerNorm / biases: plain Adam step, no layer adaptation
            np.testing.assert_allclose(u, _get(adam, names), rtol=1e-5, atol=1e-8)


def _get(tree, names):
    for n in names:
        tree = tree[n]
    return tree


# --- config and errors ----------------------------------------------------------------------------

def test_settings_come_from_the_config_only():
    """No defaults in the optimizer: configs/pretrain.py holds the paper's recipe, and a missing
    setting is an error naming its config key."""
    c = OptimizerConfig.from_config_dict(load_config_file("pretrain").optimizer)
    assert (c.optimizer, c.learning_rate, c.b1, c.b2, c.eps) == ("adamw_bert", 1e-4, 0.9, 0.999, 1e-6)
    assert (c.weight_decay, c.clip_norm, c.warmup_steps, c.num_train_steps) == (0.01, 1.0, 10_000,
                                                                               1_000_000)
    assert (c.bias_correction, c.schedule, c.decay_power, c.generator_lr_scale) == (False, "bert", 1.0, 1.0)
    partial = {k: v for k, v in optimizer_settings().items() if k not in ("b2", "decay_power")}
    with pytest.raises(ValueError, match=r"config\.optimizer\.b2, config\.optimizer\.decay_power: not set"):
        make_optimizer(partial)
    with pytest.raises(TypeError):
        OptimizerConfig(learning_rate=1e-4)


def test_config_dict_and_dataclass_inputs():
    cd = ml_collections.ConfigDict(optimizer_settings(optimizer="lamb", learning_rate=2e-3, warmup_steps=5.0,
                                                      num_train_steps=50))
    c = OptimizerConfig.from_config_dict(cd)
    assert c == optimizer_config(optimizer="lamb", learning_rate=2e-3, warmup_steps=5, num_train_steps=50)
    tx, fn = make_optimizer(cd, stacked=unstacked(small_params()))
    assert float(fn(5)) == pytest.approx(2e-3 * 0.9)
    tx.init(small_params())

    Other = dataclasses.make_dataclass("Other", list(optimizer_settings()))
    assert OptimizerConfig.from_config_dict(Other(**optimizer_settings(schedule="linear"))).schedule == "linear"
    with pytest.raises(ValueError, match="unknown optimizer config field.*warmup_step"):
        OptimizerConfig.from_config_dict({"warmup_step": 10})
    extra = {**optimizer_settings(), "batch_size": 8}
    assert OptimizerConfig.from_config_dict(extra, ignore_unknown=True) == optimizer_config()


@pytest.mark.parametrize("kw, match", [
    ({"optimizer": "sgd"}, r"optimizer='sgd'.*adamw_bert.*adamw.*lamb"),
    ({"schedule": "cosine"}, r"schedule='cosine'.*bert.*linear"),
    ({"learning_rate": -1e-4}, "learning_rate"),
    ({"warmup_steps": 2000, "num_train_steps": 1000}, r"warmup_steps=2000.*num_train_steps=1000"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"num_train_steps": 0}, "num_train_steps"),
    ({"b2": 1.0}, "b2"),
    ({"clip_norm": -1.0}, "clip_norm"),
    ({"weight_decay": float("nan")}, "weight_decay"),
])
def test_bad_values_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        optimizer_config(**kw)
    with pytest.raises(ValueError, match=match):
        make_optimizer(optimizer_settings(**kw))


def test_accumulation_is_not_an_optimizer_field():
    # Gradient accumulation is the training step's lax.scan (objective.jit_pretraining_steps pops it).
    with pytest.raises(ValueError, match=r"unknown optimizer config field.*accumulation_steps"):
        OptimizerConfig.from_config_dict({"accumulation_steps": 2})


def test_generator_lr_scale_scales_only_the_generator():
    """ELECTRA's generator at its own rate: its updates x the factor, every other parameter's unchanged."""
    params = {"generator": {"w": jnp.ones((3,))}, "mlm": {"b": jnp.zeros((2,))}, "bert": {"w": jnp.ones((3,))}}
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    cfg = optimizer_settings(learning_rate=1e-3, warmup_steps=0, num_train_steps=10, bias_correction=True)
    base, _ = make_optimizer(cfg)
    scaled, _ = make_optimizer({**cfg, "generator_lr_scale": 4.0})
    u1, _ = base.update(grads, base.init(params), params)
    u4, _ = scaled.update(grads, scaled.init(params), params)
    np.testing.assert_allclose(u4["generator"]["w"], 4 * u1["generator"]["w"], rtol=1e-6)
    np.testing.assert_allclose(u4["mlm"]["b"], 4 * u1["mlm"]["b"], rtol=1e-6)
    np.testing.assert_array_equal(u4["bert"]["w"], u1["bert"]["w"])
    assert float(jnp.abs(u1["bert"]["w"]).max()) > 0
    with pytest.raises(ValueError, match="generator_lr_scale"):
        optimizer_config(generator_lr_scale=0.0)


def test_wsd_schedule_warms_up_holds_and_decays_as_one_minus_sqrt():
    """ModernBERT's warmup-stable-decay: the peak from the end of warmup to N - D, then 1 - sqrt."""
    cfg = optimizer_config(learning_rate=LR, warmup_steps=W, num_train_steps=N, schedule="wsd", decay_steps=400)
    _, fn = make_optimizer(cfg)
    steps = [0, 50, 100, 350, 600, 700, 900, 999, 1000, 1200]
    d = [(t - 600) / 400 for t in steps]
    want = [LR * t / W if t < W else LR * (1 - np.sqrt(min(max(x, 0.0), 1.0))) for t, x in zip(steps, d, strict=True)]
    np.testing.assert_allclose(jax.jit(fn)(jnp.asarray(steps)), want, rtol=1e-4, atol=1e-12)  # float32 sqrt
    assert float(fn(600)) == pytest.approx(LR, rel=1e-7) and float(fn(1000)) == 0.0
    with pytest.raises(ValueError, match=r"decay_steps=901: .*for schedule 'wsd' an integer in \[0, num_train_steps"):
        optimizer_config(learning_rate=LR, warmup_steps=W, num_train_steps=N, schedule="wsd", decay_steps=N - W + 1)
    stable = optimizer_config(learning_rate=LR, warmup_steps=W, num_train_steps=N, schedule="wsd", decay_steps=0)
    np.testing.assert_allclose(make_optimizer(stable)[1](jnp.asarray([50, 100, 999, 1000])), [LR / 2, LR, LR, LR],
                               rtol=1e-6)  # no decay in this run: a later phase decays

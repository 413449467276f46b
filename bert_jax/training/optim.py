"""Optimizers for pre-training and fine-tuning: the paper's Adam, plain AdamW and LAMB, with warmup
+ linear decay, a weight-decay mask and global-norm clipping.

Everything here is plain optax over a params pytree: an ``nnx.State`` from
``nnx.state(model, nnx.Param)`` or ``nnx.to_pure_dict`` of it. One entry point:

    tx, lr_fn = make_optimizer(config.optimizer)        # every field of OptimizerConfig, from configs/
    opt_state = tx.init(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)

Per update (``g`` the gradient, ``p`` the parameter, ``t`` the optimizer step from 0):

    g <- g * min(1, clip_norm / ||g||_global)                      (clip_by_global_norm)
    m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
    u  = m / (sqrt(v) + eps)                      adamw_bert, bias_correction=False (Google's)
    u  = m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^(t+1)), v_hat = v / (1 - b2^(t+1))
    u <- u + weight_decay * p                     only where decay_mask(p) (kernels, embeddings)
    u <- u * ||p|| / ||u||                        LAMB only, per layer and matrix, same mask (see make_optimizer)
    p <- p - lr(t) * u

Weight decay is decoupled from the gradient (it never enters m or v) but scaled by lr(t), exactly
as Google's ``AdamWeightDecayOptimizer`` and ``optax.adamw`` do.

``"stableadamw"`` (ModernBERT's; Wortsman et al., 2023, Algorithm 2, as optimi's ``StableAdamW``
with ``decouple_lr``) replaces the clip with a per-tensor one and decouples the decay from the rate:

    r  = sqrt(mean over the tensor of g^2 / max(v_hat, eps^2))     (v_hat after this step's update)
    s  = 1 / max(1, r)                                             per tensor
    p <- p - lr(t) * s * (m_hat / (sqrt(v_hat) + eps) + weight_decay / lr_peak * p)

so the decay is ``weight_decay`` per step at the peak rate, ``weight_decay * lr(t) / lr_peak`` on
the way (the same mask), and no gradient clipping applies (``clip_norm`` must be 0).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bert_jax.training.global_norm import clip_by_global_norm, norm_fn
from bert_jax.training.trust_ratio import axes_by_path, path_names, scale_by_layerwise_trust_ratio

OPTIMIZERS = ("adamw_bert", "adamw", "lamb", "stableadamw")
SCHEDULES = ("bert", "linear", "wsd")
DECAYED_NAMES = ("kernel", "embedding")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """`make_optimizer`'s settings, every one given: no defaults here. The configs set them all
    (``config.optimizer``: the paper's recipe in configs/pretrain.py, the fine-tuning one in
    configs/finetune.py; docs/reference/config.md).

    ``bias_correction=False`` is Google's ``AdamWeightDecayOptimizer``, which has none (docs/records.md
    works out by how much it matters with a warmup).

    ``warmup_steps``/``num_train_steps`` and the schedule count optimizer steps. Gradient
    accumulation is not the optimizer's business: the training step sums micro-batch gradients in a
    ``lax.scan`` (as many micro-batches as a job config's ``per_device_batch`` gives:
    `bert_jax.training.steps.accumulation_steps`), so one call is one optimizer step.
    """

    optimizer: str  # one of OPTIMIZERS
    learning_rate: float  # the peak
    warmup_steps: int
    num_train_steps: int  # where the decay reaches 0
    weight_decay: float  # only where `decays` (kernels and embeddings)
    b1: float
    b2: float
    eps: float
    clip_norm: float | None  # global norm; None or 0 turns clipping off
    bias_correction: bool
    schedule: str  # one of SCHEDULES
    # The decay's power: 1 is linear (the paper's); 0.5 NVIDIA's LAMB recipe (bert_schedule).
    decay_power: float
    # "wsd": the last decay_steps of num_train_steps decay (1 - sqrt; 0: none in this run, a later
    # phase decays); the other schedules ignore it (0).
    decay_steps: int
    # "wsd" only: from step late_from_step on, the stable rate is late_rate instead of learning_rate
    # (ModernBERT-large's roll-back to 5e-5 after 900B tokens); late_rate 0: none (late_from_step 0).
    late_rate: float
    late_from_step: int
    # A multiplier on the learning rate of ELECTRA's generator (its encoder ``generator`` and its
    # masked-LM head ``mlm``; the embedding tables are the discriminator's and keep the base rate).
    # 1: the reference's one rate.
    generator_lr_scale: float

    def __post_init__(self):
        def bad(field, expected):
            raise ValueError(f"OptimizerConfig.{field}={getattr(self, field)!r}: expected {expected}")

        if self.optimizer not in OPTIMIZERS:
            bad("optimizer", f"one of {OPTIMIZERS}")
        if self.schedule not in SCHEDULES:
            bad("schedule", f"one of {SCHEDULES}")
        for f in ("learning_rate", "weight_decay", "eps"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                bad(f, "a finite number >= 0")
        g = self.generator_lr_scale
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or g <= 0:
            bad("generator_lr_scale", "a finite number > 0")
        p = self.decay_power
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p <= 0:
            bad("decay_power", "a finite number > 0")
        for f in ("b1", "b2"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                bad(f, "a number in [0, 1)")
        c = self.clip_norm
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))
                              or not math.isfinite(c) or c < 0):
            bad("clip_norm", "None, 0 (no clipping) or a finite number > 0")
        for f, lo in (("warmup_steps", 0), ("num_train_steps", 1)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                bad(f, f"an integer >= {lo}")
        if self.warmup_steps > self.num_train_steps:
            bad("warmup_steps", f"at most num_train_steps={self.num_train_steps}")
        d = self.decay_steps
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            bad("decay_steps", "an integer >= 0")
        if self.schedule == "wsd" and not d <= self.num_train_steps - self.warmup_steps:
            bad("decay_steps", f"for schedule 'wsd' an integer in [0, num_train_steps - warmup_steps = "
                               f"{self.num_train_steps - self.warmup_steps}] (0: no decay in this run)")
        if not isinstance(self.bias_correction, bool):
            bad("bias_correction", "a bool")
        late, start = self.late_rate, self.late_from_step
        if isinstance(late, bool) or not isinstance(late, (int, float)) or not math.isfinite(late) or late < 0:
            bad("late_rate", "a finite number >= 0 (0: none)")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            bad("late_from_step", "an integer >= 0")
        if late and not (self.schedule == "wsd" and self.warmup_steps <= start <= self.num_train_steps - d):
            bad("late_rate", f"with schedule 'wsd' and late_from_step in [warmup_steps, num_train_steps - "
                             f"decay_steps] = [{self.warmup_steps}, {self.num_train_steps - d}] (0: no late rate)")
        if self.optimizer == "stableadamw" and (self.clip_norm or not self.bias_correction):
            bad("optimizer", "'stableadamw' with clip_norm 0 (it clips each tensor's update itself) and "
                             "bias_correction True (its moments are debiased)")

    @classmethod
    def from_config_dict(cls, cfg: Any, *, ignore_unknown: bool = False) -> OptimizerConfig:
        """From an ``ml_collections.ConfigDict``, a mapping or a dataclass with every field; a missing
        field is an error naming ``config.optimizer.<field>``, and so is an unknown key (a typo) unless
        ``ignore_unknown``."""
        if isinstance(cfg, cls):
            return cfg
        if hasattr(cfg, "to_dict"):  # ml_collections.ConfigDict / FrozenConfigDict
            d = dict(cfg.to_dict())
        elif isinstance(cfg, Mapping):
            d = dict(cfg)
        elif dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
            d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
        else:
            raise TypeError(f"expected a ConfigDict, mapping or dataclass, got {type(cfg).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown and not ignore_unknown:
            raise ValueError(f"unknown optimizer config field(s) {unknown}; known fields: {names}")
        missing = [n for n in names if n not in d]
        if missing:
            raise ValueError(f"{', '.join(f'config.optimizer.{n}' for n in missing)}: not set; the optimizer "
                             f"has no defaults of its own (configs/pretrain.py and configs/finetune.py set "
                             f"every field)")
        kw = {k: v for k, v in d.items() if k in names}
        for k in ("warmup_steps", "num_train_steps"):  # 1e4 from a CLI
            if isinstance(kw.get(k), float) and float(kw[k]).is_integer():
                kw[k] = int(kw[k])
        return cls(**kw)


# ---------------------------------------------------------------------------------------------
# Learning-rate schedules: step -> lr, step = optimizer steps already taken (0 for the first update).


def bert_schedule(learning_rate: float, warmup_steps: int, num_train_steps: int, power: float = 1.0
                  ) -> optax.Schedule:
    """Google's ``create_optimizer``: ``polynomial_decay(power=1)`` from step 0 with warmup
    overriding it while ``step < warmup_steps``:

        lr(t) = init_lr * t / warmup_steps                     t < warmup_steps
        lr(t) = init_lr * (1 - min(t, num_train_steps) / num_train_steps) ** power   otherwise

    ``power`` 1 is Google's; 0.5 is NVIDIA's LAMB recipe (``PolyWarmUpScheduler(degree=0.5)`` in
    DeepLearningExamples' PyTorch BERT ``schedulers.py``: warmup over a fraction of the steps, then
    ``(1 - t / N) ** 0.5`` from step 0, the same shape as this one).

    The decay runs from step 0, not from the end of warmup, so lr jumps down from ~init_lr to
    init_lr * (1 - warmup/N) at the end of warmup (0.99 x for the paper's 10k/1M; more for short
    fine-tuning runs with a 10% warmup: 0.9 x), and reaches init_lr only if warmup_steps = 0."""
    init, w, n = float(learning_rate), int(warmup_steps), int(num_train_steps)

    def schedule(step):
        t = jnp.asarray(step, jnp.float32)
        left = jnp.maximum(n - t, 0.0)  # exactly 0 from t = n on
        decay = init * left / n if power == 1 else init * (left / n) ** power
        if w == 0:
            return decay
        return jnp.where(t < w, init * t / w, decay)

    return schedule


def linear_schedule(learning_rate: float, warmup_steps: int, num_train_steps: int, power: float = 1.0
                    ) -> optax.Schedule:
    """Warmup then linear decay from the end of warmup (Hugging Face's
    ``get_linear_schedule_with_warmup``, optax ``join_schedules`` of two ``linear_schedule``s):

        lr(t) = init_lr * t / warmup_steps                                          t < warmup
        lr(t) = init_lr * max(0, (N - t) / (N - warmup_steps))                      otherwise

    Unlike ``"bert"`` it is continuous: it peaks at exactly init_lr at t = warmup_steps. ``power``
    raises the decaying factor to it (Hugging Face's ``get_polynomial_decay_schedule_with_warmup``)."""
    init, w, n = float(learning_rate), int(warmup_steps), int(num_train_steps)

    def schedule(step):
        t = jnp.asarray(step, jnp.float32)
        left = jnp.maximum(n - t, 0.0)
        decay = init * left / max(n - w, 1) if power == 1 else init * (left / max(n - w, 1)) ** power
        if w == 0:
            return decay
        return jnp.where(t < w, init * t / w, decay)

    return schedule


def wsd_schedule(learning_rate: float, warmup_steps: int, num_train_steps: int, decay_steps: int,
                 late_rate: float = 0.0, late_from_step: int = 0) -> optax.Schedule:
    """Warmup-stable-decay (ModernBERT, Warner et al., 2024, §2.2: a trapezoid with the 1 - sqrt
    decay of Hägele et al., 2024): linear warmup, then the peak held, then over the last
    ``decay_steps`` (D) of the N steps:

        lr(t) = init_lr * t / warmup_steps                           t < warmup
        lr(t) = init_lr                                              t < N - D
        lr(t) = init_lr * (1 - sqrt((t - (N - D)) / D))              otherwise (0 from t = N on)

    The stable phase has no end built in, so a run can be extended (a longer N) before its decay;
    ``decay_steps`` 0 holds the peak to the end (ModernBERT's phase 1: its decay is phase 2's).
    ``late_rate`` > 0: the stable rate is ``late_rate`` from step ``late_from_step`` on (the decay
    then starts from it): ModernBERT-large's roll-back."""
    init, w, n, d = float(learning_rate), int(warmup_steps), int(num_train_steps), int(decay_steps)

    def schedule(step):
        t = jnp.asarray(step, jnp.float32)
        stable = jnp.where(t < late_from_step, init, late_rate) if late_rate else init
        into = jnp.clip((t - (n - d)) / d, 0.0, 1.0) if d else 0.0  # the decay's progress, 0 before it
        lr = stable * (1.0 - jnp.sqrt(into))
        return lr if w == 0 else jnp.where(t < w, init * t / w, lr)

    return schedule


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    if cfg.schedule == "wsd":
        return wsd_schedule(cfg.learning_rate, cfg.warmup_steps, cfg.num_train_steps, cfg.decay_steps,
                            cfg.late_rate, cfg.late_from_step)
    fn = bert_schedule if cfg.schedule == "bert" else linear_schedule
    return fn(cfg.learning_rate, cfg.warmup_steps, cfg.num_train_steps, cfg.decay_power)


# ---------------------------------------------------------------------------------------------
# Weight-decay mask from parameter paths (`path_names`: bert_jax/training/trust_ratio.py, shared with LAMB).


def decays(names: tuple[str, ...]) -> bool:
    """Whether a parameter gets weight decay: only leaves named ``kernel`` or ``embedding``.

    An allow-list by leaf name: LayerNorm ``scale``/``bias``, every Dense ``bias`` and the MLM
    ``output_bias`` are excluded, as is anything a future module names otherwise. Google's original
    uses a deny-list instead (``exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]``
    matched against variable names); on BERT both select the same weights (the test checks this)."""
    return bool(names) and names[-1] in DECAYED_NAMES


def decay_mask(params):
    """Same-structure pytree of bools: True where weight decay applies (see ``decays``)."""
    return jax.tree_util.tree_map_with_path(lambda p, _: decays(path_names(p)), params)


# ---------------------------------------------------------------------------------------------
# Transformations.


def scale_by_adam_no_bias_correction(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                                     eps_root: float = 0.0, mu_dtype=None
                                     ) -> optax.GradientTransformation:
    """Adam's direction without bias correction, as Google's ``AdamWeightDecayOptimizer``:
    ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; u = m / (sqrt(v + eps_root) + eps)``.

    ``optax.scale_by_adam`` (0.2.8) always corrects bias and has no flag for it. The state is
    ``optax.ScaleByAdamState`` (count, mu, nu), the same layout as ``scale_by_adam``'s."""

    def init_fn(params):
        mu = optax.tree.zeros_like(params, dtype=mu_dtype)
        nu = optax.tree.zeros_like(params)
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        updates = jax.tree.map(lambda m, v: None if m is None else m / (jnp.sqrt(v + eps_root) + eps),
                               mu, nu, is_leaf=lambda x: x is None)
        mu = optax.tree.cast(mu, mu_dtype)
        nu = optax.tree.cast_like(nu, state.nu)
        count = optax.safe_increment(state.count)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def layer_mean(x: jax.Array, axis: int | None) -> jax.Array:
    """Mean over every axis but ``axis`` (kept as a length-1 axis): per layer of a stacked leaf, one
    value (``[]``) for ``axis=None``."""
    if axis is None:
        return jnp.mean(x)
    return jnp.mean(x, axis=tuple(a for a in range(x.ndim) if a != axis % x.ndim), keepdims=True)


def stable_adam_direction(g: jax.Array, m_hat: jax.Array, v_hat: jax.Array, p: jax.Array | None, *, eps: float,
                          decay: float, axis: int | None) -> jax.Array:
    """One tensor's StableAdamW direction: ``(m_hat / (sqrt(v_hat) + eps) + decay * p) / max(1, r)``,
    r the RMS of ``g^2 / max(v_hat, eps^2)`` per layer (``axis``, see `layer_mean`); no decay for ``p=None``."""
    r = jnp.sqrt(layer_mean(jnp.square(g) / jnp.maximum(v_hat, eps**2), axis))  # [] or per layer
    u = m_hat / (jnp.sqrt(v_hat) + eps)
    if p is not None:
        u = u + decay * p
    return u / jnp.maximum(1.0, r)


def scale_by_stable_adam(b1: float, b2: float, eps: float, decay: float = 0.0, mask=None, stacked: Any = None
                         ) -> optax.GradientTransformation:
    """StableAdamW's direction before the learning rate (see the module's docstring): per tensor,
    ``s * (m_hat / (sqrt(v_hat) + eps) + decay * p)`` with ``s = 1 / max(1, r)``, r the RMS of
    ``g^2 / max(v_hat, eps^2)`` over the tensor; ``decay`` (weight_decay / lr_peak) only where
    ``mask(params)`` is True. A tensor is one layer's: ``stacked`` (as `make_optimizer`'s) names the
    layers axis of stacked leaves, whose RMS is then taken per layer, as the reference's per-layer
    tensors have it. The state is ``optax.ScaleByAdamState``."""

    def init_fn(params):
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params),
                                      nu=optax.tree.zeros_like(params))

    def update_fn(grads, state, params=None):
        count = optax.safe_increment(state.count)
        mu = optax.tree.update_moment(grads, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(grads, state.nu, b2, 2)
        t = count.astype(jnp.float32)
        # Bias corrections 1 - b^t (optimi's debiased betas give the same m_hat, v_hat), as -expm1(t log b):
        # float32's b^t would make step 1's RMS term 1 + 1e-5 instead of 1, and cut every first step.
        c1, c2 = (-jnp.expm1(t * math.log(b)) if b > 0 else 1.0 for b in (b1, b2))
        decayed = mask(params) if mask is not None and decay else jax.tree.map(lambda _: False, grads)
        table = axes_by_path(stacked) if stacked is not None else {}
        updates = jax.tree_util.tree_map_with_path(
            lambda path, g, m, v, p, d: stable_adam_direction(g, m / c1, v / c2, p if d else None, eps=eps, decay=decay,
                                                              axis=table.get(path_names(path))),
            grads, mu, nu, grads if params is None else params, decayed)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(cfg: Any, *, ignore_unknown: bool = False, stacked: Any = None, global_norm: str = "per_leaf"
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(tx, schedule_fn)`` from an ``OptimizerConfig``, ``ConfigDict``, mapping or dataclass.

    - ``"adamw_bert"``: clip -> Adam (``bias_correction`` from the config; False = Google's)
      -> masked decay -> -lr(t). With ``bias_correction=True`` it equals ``"adamw"``.
    - ``"adamw"``: clip -> ``optax.adamw`` (always bias-corrected) with the same mask.
    - ``"stableadamw"``: `scale_by_stable_adam` (per-tensor update clipping, fully decoupled masked
      decay: ``weight_decay`` per step at the peak ``learning_rate``) -> -lr(t); no global clip.
    - ``"lamb"`` (You et al. 2019): clip -> Adam (``bias_correction`` as configured; a per-step
      scalar, it nearly cancels in the trust ratio) -> masked decay -> trust ratio -> -lr(t).
      The trust ratio ``||p|| / ||u||`` (1 where either norm is 0) is taken per layer and matrix:
      over every axis but the layers axis of a stacked leaf, per array otherwise
      (`bert_jax.training.trust_ratio`). ``stacked`` says which axis that is for each leaf (a pytree
      of ``Optional[int]`` like the params, from `bert_jax.model.axes.stacked_axes`); LAMB needs it.
      The ratio is applied only where weight decay is, as the reference LAMB implementations do
      (ALBERT's ``lamb_optimizer.py`` and tf-addons: ``exclude_from_layer_adaptation`` defaults to
      ``exclude_from_weight_decay``); LayerNorm and bias vectors take plain Adam steps (``optax.lamb``
      alone applies it to all).

    ``global_norm``: how the clip computes the global norm (a job config's resolved ``global_norm``):
    "per_leaf" is ``optax.clip_by_global_norm``'s own, "grouped" the same number in a few reductions
    (bert_jax/training/global_norm.py).

    ``schedule_fn(step)`` is the lr at optimizer step ``step``.
    """
    cfg = OptimizerConfig.from_config_dict(cfg, ignore_unknown=ignore_unknown)
    lr = make_schedule(cfg)
    parts = [clip_by_global_norm(cfg.clip_norm, norm_fn(global_norm))] if cfg.clip_norm else []
    if cfg.optimizer == "adamw":
        parts.append(optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                                 weight_decay=cfg.weight_decay, mask=decay_mask))
    elif cfg.optimizer == "stableadamw":
        decay = cfg.weight_decay / cfg.learning_rate if cfg.learning_rate else 0.0
        parts += [scale_by_stable_adam(cfg.b1, cfg.b2, cfg.eps, decay, decay_mask, stacked),
                  optax.scale_by_learning_rate(lr)]
    else:
        if cfg.bias_correction:
            parts.append(optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps))
        else:
            parts.append(scale_by_adam_no_bias_correction(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps))
        if cfg.weight_decay:
            parts.append(optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask))
        if cfg.optimizer == "lamb":
            if stacked is None:
                raise ValueError("optimizer 'lamb' needs stacked= (the layers axis of each parameter, "
                                 "bert_jax.model.axes.stacked_axes): one trust ratio per layer")
            parts.append(optax.masked(scale_by_layerwise_trust_ratio(stacked), decay_mask))
        parts.append(optax.scale_by_learning_rate(lr))
    if cfg.generator_lr_scale != 1.0:
        parts.append(scale_subtrees(GENERATOR_PARAMS, cfg.generator_lr_scale))
    return optax.chain(*parts), lr


GENERATOR_PARAMS = ("generator", "mlm")  # ElectraForPreTraining's generator: its encoder and its MLM head


def scale_subtrees(names: tuple[str, ...], factor: float) -> optax.GradientTransformation:
    """Updates of the parameters under the top-level keys ``names`` times ``factor``; others as they are."""

    def update(updates, state, params=None):
        del params
        return {k: jax.tree.map(lambda u: u * factor, v) if k in names else v for k, v in updates.items()}, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)

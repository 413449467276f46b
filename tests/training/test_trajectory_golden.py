"""The training trajectory against PyTorch (tests/golden/trajectory_golden.npz, `make golden`).

The golden is 20 optimizer steps of Hugging Face's ``BertForPreTraining`` and of ELECTRA's generator +
discriminator, in float64, from tiny random weights, on fixed batches, with bert-jax's ``adamw_bert``
(clip, Adam without bias correction, decoupled weight decay off LayerNorm and biases, the "bert"
warmup + linear-decay schedule) written out in torch (tests/golden/make_trajectory_golden.py). Here
the same weights go through the strict Hugging Face loader, the optimizer is `make_optimizer` of the
recorded settings, and bert-jax's own jitted `train_step` replays the batches: every step's losses
(taken before the update, as ``train_step`` reports them), the gradient's global norm, the learning
rate and the parameters' norm after the update must match. A change that bends the gradient, the loss
weighting, the optimizer or the schedule moves them far past the tolerances at once.

Tolerances, per step (float32 here vs the float64 reference): losses 2e-4 + 1e-5 x |loss| (ELECTRA's
total is ~30: 50 x the discriminator's BCE), the gradient's norm 1e-4 relative, the parameters' norm
2e-6 relative (~4e-5), the learning rate 1e-6 relative. Measured on this CPU: losses within 1e-6
(BERT) and 1.1e-5 (ELECTRA's total), gradient norm 5e-6, parameter norm 3e-6 — 20 times or more below
the tolerances, room for other CPUs, XLA versions and summation orders over 20 compounding steps
(torch's own float32 run is within 6e-7 and 3e-6 of its float64 one). The parameters' norm is the
tight one on purpose: weight decay moves it first, so a wrong decay mask shows there (by 4e-4 to 8e-3
within a few steps) even where the losses move by less than their tolerance.

ELECTRA's replacements: bert-jax samples them with ``jax.random.categorical``, which torch cannot
replay bit for bit, so the step here is traced with that one call answered by the tokens torch drew
from its generator's softmax at the same step (``electra_sampled``). Everything else — the generator's
MLM at the masked positions through the shared embeddings, the corrupted input and its labels, the
discriminator's BCE over real tokens, ``rtd_weight``, the gradient through both networks — is bert-jax's.
"""

from __future__ import annotations

import functools
import json
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.interop import pretrained
from bert_jax.pretraining.objective import model_graphdef, train_step
from bert_jax.training.optim import make_optimizer
from bert_jax.training.steps import new_state
from tests.fixtures.hf_dirs import write_dir

LOSS_ATOL, LOSS_RTOL = 2e-4, 1e-5
GRAD_NORM_RTOL = 1e-4  # the gradient's global norm before clipping
PARAM_NORM_RTOL = 2e-6  # the parameters' global norm after the update (~21: 4e-5 absolute)
LR_RTOL = 1e-6  # the schedule, in float32
FRACTION_ATOL = 1e-6  # ELECTRA: the share of real tokens replaced (exact: a count over a count)
# XLA CPU compile options that change how the step is compiled, not what it computes: LLVM's
# optimisations off and the older (non-"fusion emitter") CPU code generator. They take the compile
# of these tiny steps from ~6-12 s to ~2 s on 2 busy cores, with the same numbers.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
                "xla_cpu_use_fusion_emitters": False}
TOLERANCES = {"loss": (LOSS_RTOL, LOSS_ATOL), "mlm_loss": (LOSS_RTOL, LOSS_ATOL), "nsp_loss": (LOSS_RTOL, LOSS_ATOL),
              "rtd_loss": (LOSS_RTOL, LOSS_ATOL), "grad_norm": (GRAD_NORM_RTOL, 0.0),
              "param_norm": (PARAM_NORM_RTOL, 0.0), "learning_rate": (LR_RTOL, 0.0),
              "rtd_replaced_fraction": (0.0, FRACTION_ATOL)}


@pytest.fixture(scope="module")
def golden(golden_file):
    with np.load(golden_file("trajectory_golden.npz"), allow_pickle=False) as g:
        return dict(g)


def initial_params(model: nnx.Module) -> dict:
    """The loaded model's parameters; `pretrained` builds it abstractly, so none may be left abstract."""
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    left = [jax.tree_util.keystr(p) for p, v in jax.tree_util.tree_leaves_with_path(params)
            if isinstance(v, jax.ShapeDtypeStruct)]
    assert not left, f"not loaded: {left}"
    return params


def read_checkpoint(g: dict, prefix: str, directory):
    """The golden's ``{prefix}tensor/*`` + ``{prefix}config_json`` as an HF directory, read back by
    bert-jax's reader (the path a released checkpoint takes)."""
    tensors = {k.removeprefix(f"{prefix}tensor/"): v for k, v in g.items() if k.startswith(f"{prefix}tensor/")}
    write_dir(directory, tensors, json.loads(str(g[f"{prefix}config_json"])))
    return pretrained.read_checkpoint(f"hf:{directory}")


def batches(g: dict) -> list[dict[str, np.ndarray]]:
    stacked = {k.removeprefix("batch/"): v for k, v in g.items() if k.startswith("batch/")}
    return [{k: v[s] for k, v in stacked.items()} for s in range(len(g["bert_loss"]))]


def replay(model: nnx.Module, graphdef: nnx.GraphDef, optimizer: dict, steps: list[dict], step_fn=train_step,
           extra: list | None = None) -> dict[str, np.ndarray]:
    """bert-jax's jitted ``step_fn`` over ``steps`` from ``model``'s weights; per-step metrics.

    Compiled once, with `FAST_COMPILE`: the same XLA program, a fraction of the compile time."""
    # The golden's settings predate generator_lr_scale (1: the one rate its torch reference runs),
    # decay_steps and the late rate (0: the "bert" schedule has neither).
    tx, schedule = make_optimizer({"generator_lr_scale": 1.0, "decay_steps": 0, "late_rate": 0.0,
                                   "late_from_step": 0, **optimizer})
    state = new_state(initial_params(model), tx)
    extra = [()] * len(steps) if extra is None else [(e,) for e in extra]
    rng = jax.random.key(0)
    lowered = jax.jit(functools.partial(step_fn, graphdef=graphdef, tx=tx, schedule=schedule)).lower(
        state, steps[0], rng, *extra[0])
    try:
        step = lowered.compile(compiler_options=FAST_COMPILE)
    except Exception as e:  # an XLA without one of these options: the default compile, slower
        if "compile option" not in str(e):
            raise
        step = lowered.compile()
    out = []
    for batch, e in zip(steps, extra, strict=True):
        state, metrics = step(state, batch, rng, *e)
        out.append(metrics)
    out = jax.device_get(out)
    return {k: np.array([m[k] for m in out], np.float64) for k in out[0]}


def compare(ours: dict[str, np.ndarray], g: dict, run: str) -> dict[str, float]:
    """Every recorded metric of ``run`` within its tolerance at every step (one failure lists each metric
    that is off, from which step); returns the max |difference| per metric."""
    recorded = [k for k in TOLERANCES if f"{run}_{k}" in g]
    assert {"loss", "mlm_loss", "grad_norm", "param_norm", "learning_rate"} <= set(recorded)
    diffs, off = {}, []
    for k in recorded:
        rtol, atol = TOLERANCES[k]
        ref = g[f"{run}_{k}"]
        diff = np.abs(ours[k] - ref)
        bad = diff > atol + rtol * np.abs(ref)
        diffs[k] = float(diff.max())
        if bad.any():
            s = int(np.argmax(bad))
            off.append(f"{k} from step {s} ({ours[k][s]:.8g} vs {ref[s]:.8g}; max |diff| {diff.max():.2e}, "
                       f"allowed {atol:g} + {rtol:g} x |value|)")
    assert not off, f"{run}: the trajectory leaves PyTorch's: " + "; ".join(off)
    return diffs


def test_golden_exercises_what_it_should(golden):
    """The recorded runs reach the cases they are meant to pin: uneven predictions per row (some rows
    none), warmup from 0 then decay, BERT's clipping both on and off, ELECTRA replacing some tokens."""
    g = golden
    per_row = g["batch/masked_lm_weights"].sum(-1)  # [steps, batch]
    assert (per_row == 0).any() and (per_row == per_row.max()).any() and len(np.unique(per_row)) > 3
    for run in ("bert", "electra"):
        opt = json.loads(str(g[f"{run}_optimizer_json"]))
        lr = g[f"{run}_learning_rate"]
        assert lr[0] == 0 and np.argmax(lr) == opt["warmup_steps"] - 1 and lr[-1] < lr.max() / 4
    clip, norms = json.loads(str(g["bert_optimizer_json"]))["clip_norm"], g["bert_grad_norm"]
    assert (norms > clip).any() and (norms < clip).any()
    assert 0 < g["electra_rtd_replaced_fraction"].min() and g["electra_rtd_replaced_fraction"].max() < 0.5


def test_bert_trajectory_matches_pytorch(golden, tmp_path):
    """``BertForPreTraining`` (MLM + NSP): 20 steps of bert-jax's train step and optimizer."""
    g = golden
    ckpt = read_checkpoint(g, "bert_", tmp_path / "bert")
    model = pretrained.build_model(ckpt)
    assert type(model).__name__ == "BertForPreTraining" and model.objective == "nsp"
    optimizer = json.loads(str(g["bert_optimizer_json"]))
    ours = replay(model, model_graphdef(ckpt.config, "nsp"), optimizer, batches(g))
    diffs = compare(ours, g, "bert")
    print("bert max |diff|:", diffs)


def electra_step(state, batch, rng, sampled, **kw):
    """``train_step`` with ``jax.random.categorical`` answered by ``sampled`` [batch, P] (traced once)."""
    calls = []

    def categorical(key, logits, *args, **kwargs):
        calls.append(logits.shape)
        assert logits.shape == (*sampled.shape, logits.shape[-1])
        return sampled.astype(jnp.int32)

    with mock.patch.object(jax.random, "categorical", categorical):
        out = train_step(state, batch, rng, **kw)
    assert len(calls) == 1, calls
    return out


def test_electra_trajectory_matches_pytorch(golden, tmp_path):
    """ELECTRA's generator + discriminator (shared embeddings, rtd_weight 50): 20 steps."""
    g = golden
    disc = read_checkpoint(g, "disc_", tmp_path / "discriminator")
    gen = read_checkpoint(g, "gen_", tmp_path / "generator")
    model = pretrained.build_electra(disc, gen)
    settings = {"generator_fraction": float(g["electra_generator_fraction"]),
                "rtd_weight": float(g["electra_rtd_weight"])}
    assert model.rtd_weight == settings["rtd_weight"]
    optimizer = json.loads(str(g["electra_optimizer_json"]))
    graphdef = model_graphdef(disc.config, "rtd", settings)
    ours = replay(model, graphdef, optimizer, batches(g), step_fn=electra_step, extra=list(g["electra_sampled"]))
    diffs = compare(ours, g, "electra")
    print("electra max |diff|:", diffs)

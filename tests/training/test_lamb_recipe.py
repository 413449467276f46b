"""configs/pretrain.py:recipe=lamb (issue 21): both phases load with the published numbers, the
accumulation follows from the slice, the decay has NVIDIA's power 0.5, and phase 2 starts from phase
1's parameters at step 0 with a fresh optimizer (its warmup restarts)."""

import jax
import numpy as np
import pytest

from bert_jax import launch
from bert_jax.config_args import check_overrides
from bert_jax.pretraining import objective, start
from bert_jax.resolve import described_model, resolve
from bert_jax.training import sharding as sh
from bert_jax.training import steps as steps_lib
from bert_jax.training.checkpoints import Checkpointer
from bert_jax.training.optim import bert_schedule, make_schedule
from tests.fixtures.optimizer import optimizer_config


@pytest.mark.parametrize("phase,batch,steps,lr,warmup,length", [(1, 65_536, 7_038, 6e-3, 2_001, 128),
                                                                (2, 32_768, 1_563, 4e-3, 200, 512)])
def test_both_phases_load_with_the_published_numbers(load_config, phase, batch, steps, lr, warmup, length):
    c = load_config("pretrain", f"size=large,recipe=lamb,phase={phase}")
    assert (c.batch_size, c.num_train_steps, c.data.max_seq_length) == (batch, steps, length)
    o = c.optimizer
    assert (o.optimizer, o.learning_rate, o.num_train_steps, o.warmup_steps) == ("lamb", lr, steps, warmup)
    assert (o.decay_power, o.bias_correction, o.weight_decay, o.clip_norm) == (0.5, True, 0.01, 1.0)
    assert c.init_mode == ("params" if phase == 2 else "state")
    # The Adam recipe keeps its numbers: linear decay, continuing phase 1's state.
    adam = load_config("pretrain", f"size=large,phase={phase}")
    assert (adam.optimizer.decay_power, adam.init_mode, adam.per_device_batch) == (1.0, "state", "auto")
    # Warmup and decay follow a shorter run.
    short = load_config("pretrain", f"size=tiny,recipe=lamb,phase={phase}")
    short.num_train_steps = 100
    assert (short.optimizer.num_train_steps, short.optimizer.warmup_steps) == (100, round(100 * warmup / steps))
    with pytest.raises(ValueError, match="recipe=lamb applies to model=bert"):
        load_config("pretrain", "model=albert,recipe=lamb")
    with pytest.raises(ValueError, match="recipe='adam'"):
        load_config("pretrain", "recipe=adam")


def test_accumulation_follows_the_slice(load_config):
    c = load_config("pretrain", "size=large,recipe=lamb,phase=1")
    assert c.per_device_batch == 32
    rules = tuple(tuple(r) for r in c.sharding_rules)
    for shape, micro in (((8, 1, 1), 256), ((2, 4, 1), 256), ((2, 1, 4), 1024)):  # tensor shards share rows
        assert steps_lib.accumulation_steps(c, sh.make_mesh(shape), rules) == micro
    c.per_device_batch = 48
    with pytest.raises(ValueError, match=r"batch_size 65536 is not a multiple of per_device_batch 48 x 8 batch shards"):
        steps_lib.accumulation_steps(c, sh.make_mesh((8, 1, 1)), rules)
    with pytest.raises(ValueError, match="config has no key 'accumulation_steps'"):  # one knob: per_device_batch
        check_overrides(c, ["train.py", "--config.optimizer.accumulation_steps=2"])



def test_decay_power_is_nvidias_poly_warmup():
    """NVIDIA's PolyWarmUpScheduler: p = t / N; lr = base * p / warmup while p < warmup, else
    base * (1 - p) ** 0.5; power 1 is the old schedule, value for value."""
    n, frac, base = 7_038, 0.2843, 6e-3
    fn = make_schedule(optimizer_config(optimizer="lamb", learning_rate=base, warmup_steps=round(n * frac),
                                        num_train_steps=n, decay_power=0.5))
    for t in (0, 1, 1000, 2000, 2001, 2002, 5000, 7037, 7038, 8000):
        p = t / n
        want = base * p / frac if p < frac else base * max(1 - p, 0) ** 0.5
        assert float(fn(t)) == pytest.approx(want, rel=2e-3, abs=1e-9), t
    linear = bert_schedule(1e-4, 10_000, 1_000_000)
    for t in (0, 5_000, 10_000, 500_000, 1_000_000):
        assert float(linear(t)) == pytest.approx(1e-4 * t / 10_000 if t < 10_000 else 1e-4 * (1e6 - t) / 1e6,
                                                 rel=1e-6, abs=1e-12)


@pytest.mark.slow  # ~16 s: two trainer runs
def test_phase2_starts_from_phase1_params_with_a_fresh_optimizer(tmp_path, tiny_config):
    """init_mode=params: phase 1's parameters, step 0 (so lr 0: the warmup restarts), moments 0;
    init_mode=state (the Adam recipe's phase 2) carries step and moments over."""
    c = tiny_config()
    c.optimizer.update(optimizer="lamb", decay_power=0.5)
    mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])
    resolved = resolve(c, "cpu", batch_shards=1)  # as the job resolves it
    steps = objective.jit_pretraining_steps(resolved, described_model(resolved.model, vocab_size=101), mesh)
    state = steps.layout.create(0)
    state = state.replace(step=state.step + 5, opt_state=jax.tree.map(lambda x: x + 1, state.opt_state))
    ckpt = Checkpointer(tmp_path / "phase1", async_save=False)
    ckpt.save(5, state, {})
    ckpt.close()
    c.init_checkpoint = str(tmp_path / "phase1")
    for mode, step in (("params", 0), ("state", 5)):
        c.init_mode = mode
        got = start.start_state(c, steps.layout)
        assert int(got.step) == step
        for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(state.params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        mu = got.opt_state[1].mu["bert"]["layers"]["0"]["ffn"]["output"]["kernel"]  # unrolled on CPU ("auto")
        assert float(np.abs(np.asarray(mu)).max()) == (0.0 if mode == "params" else 1.0)
    assert float(steps.schedule(0)) == 0.0 < float(steps.schedule(5))  # phase 2's first lr: warmup from 0
    c.init_mode = "moments"
    with pytest.raises(ValueError, match="init_mode='moments'"):
        start.start_state(c, steps.layout)


@pytest.mark.slow
def test_both_phases_run_and_phase2_rewarms(tmp_path, load_config):
    """Phase 1 then phase 2 of the recipe, tiny and synthetic: phase 2's first step has lr 0 (its own
    warmup), its second the warmup's first slope, not phase 1's last lr; it starts from phase 1's loss."""
    from bert_jax.training.metric_writer import read_metrics

    def config(phase, steps):
        c = load_config("pretrain", f"size=tiny,recipe=lamb,phase={phase},runlocal,synthetic")
        c.model.update(vocab_size=101, max_position_embeddings=32)
        c.data.update(max_seq_length=16, max_predictions_per_seq=4)
        c.batch_size, c.per_device_batch, c.num_train_steps = 16, 1, steps  # 2 micro-batches on 8 devices
        c.log_every, c.checkpoint_every, c.eval_every = 1, steps, 0
        return c

    launch.run(config(1, 4), tmp_path / "p1")
    c2 = config(2, 20)
    c2.init_checkpoint = str(tmp_path / "p1")
    launch.run(c2, tmp_path / "p2")
    p1, p2 = read_metrics(tmp_path / "p1", "train"), read_metrics(tmp_path / "p2", "train")
    assert [r["step"] for r in p2][:2] == [1, 2]
    assert p2[0]["learning_rate"] == 0.0 < p2[1]["learning_rate"] == pytest.approx(4e-3 / 3)  # warmup: 3 steps
    assert p1[-1]["learning_rate"] > 0

"""Representation health (bert_jax/pretraining/health.py): the metrics' maths, their exact
accumulation over micro-batches and evaluation batches, the collapse rule, the readout and unigram
warnings, and the rule on real training: the old ELECTRA runlocal recipe (lr 1e-3, 30 warmup steps,
no bias correction) collapses on a small structured corpus and is flagged; the recipe of
configs/pretrain.py is not."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from bert_jax import launch
from bert_jax.model.config import BertConfig
from bert_jax.pretraining import evaluation, health, objective
from bert_jax.pretraining import objective as ts
from bert_jax.pretraining import task as pretraining_task
from bert_jax.resolve import described_model
from bert_jax.training import sharding as sh
from bert_jax.training import trainer
from bert_jax.training.metric_writer import MetricWriter, read_metrics
from bert_jax.training.optim import make_optimizer
from tests.fixtures.optimizer import optimizer_settings

OLD_RUNLOCAL = dict(learning_rate=1e-3, warmup_steps=30, bias_correction=False)  # before issue 28


# --- the maths ---------------------------------------------------------------------------------

def test_spreads_match_numpy():
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(6, 9, 5)).astype(np.float32) * np.arange(1, 6) + 3.0
    mask = (np.arange(9)[None] < rng.integers(1, 10, 6)[:, None]).astype(np.int32)
    mask[2, 0] = 0  # a row without a real first token: no [CLS] of its own
    got = health.summarize_health(health.health_sums(jnp.asarray(hidden), {"input_mask": mask}))
    tokens = hidden[mask > 0]  # [real tokens, H]
    np.testing.assert_allclose(got["token_spread"], tokens.std(0).mean(), rtol=1e-4)
    cls = hidden[mask[:, 0] > 0, 0]  # [rows with a real first token, H]
    np.testing.assert_allclose(got["cls_spread"], cls.std(0).mean(), rtol=1e-4)
    np.testing.assert_allclose(got["cls_spread_ratio"], cls.std(0).mean() / tokens.std(0).mean(), rtol=1e-4)


def test_packed_rows_take_each_examples_first_token():
    rng = np.random.default_rng(1)
    hidden = rng.normal(size=(3, 8, 4)).astype(np.float32)
    batch = {"input_mask": np.ones((3, 8), np.int32), "cls_positions": np.array([[0, 3], [0, 5], [0, 0]], np.int32),
             "nsp_weights": np.array([[1, 1], [1, 1], [1, 0]], np.float32)}  # row 2 holds one example
    got = health.summarize_health(health.health_sums(jnp.asarray(hidden), batch))
    cls = np.stack([hidden[0, 0], hidden[0, 3], hidden[1, 0], hidden[1, 5], hidden[2, 0]])
    np.testing.assert_allclose(got["cls_spread"], cls.std(0).mean(), rtol=1e-4)


def test_constant_vectors_have_no_spread():
    hidden = jnp.broadcast_to(jnp.linspace(-2.0, 2.0, 16), (4, 10, 16))
    got = health.summarize_health(health.health_sums(hidden, {"input_mask": np.ones((4, 10), np.int32)}))
    assert float(got["token_spread"]) < 1e-3 and float(got["cls_spread"]) < 1e-3


def test_auc_from_histograms_matches_sklearn():
    rng = np.random.default_rng(2)
    labels = (rng.random((16, 32)) < 0.15).astype(np.float32)
    logits = (rng.normal(size=(16, 32)) * 2.0 + 1.5 * labels - 2.0).astype(np.float32)
    real = (rng.random((16, 32)) < 0.9).astype(np.float32)
    h = health.rtd_histograms(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(real))
    keep = real > 0
    exact = roc_auc_score(labels[keep], logits[keep])
    assert 0.6 < exact < 0.95
    assert abs(float(health.auc_from_histograms(h["rtd_hist_replaced"], h["rtd_hist_original"])) - exact) < 2e-3
    # additive: two halves' histograms sum to the whole's
    halves = [health.rtd_histograms(jnp.asarray(logits[s]), jnp.asarray(labels[s]), jnp.asarray(real[s]))
              for s in (slice(0, 8), slice(8, 16))]
    for k in h:
        np.testing.assert_array_equal(halves[0][k] + halves[1][k], h[k])
    # a constant prediction ranks nothing: 0.5 exactly; no replaced token: undefined
    same = health.rtd_histograms(jnp.zeros((4, 8)), jnp.asarray(labels[:4, :8]), jnp.ones((4, 8)))
    assert float(health.auc_from_histograms(same["rtd_hist_replaced"], same["rtd_hist_original"])) == 0.5
    assert np.isnan(float(health.auc_from_histograms(np.zeros(4), np.ones(4))))


def test_prior_entropy_and_ratio():
    p = 0.15
    entropy = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    np.testing.assert_allclose(float(health.binary_entropy(p)), entropy, rtol=1e-6)
    assert float(health.binary_entropy(0.0)) == 0.0
    sums = {"rtd_loss_sum": 100 * entropy, "rtd_tokens": 100.0, "rtd_replaced": 100 * p}
    got = health.summarize_health(sums)
    np.testing.assert_allclose([got["rtd_prior_entropy"], got["rtd_bce_over_prior"]], [entropy, 1.0], rtol=1e-5)


def test_top_share_and_unigram_entropy_match_numpy_and_add_up():
    """token_top_share: the covariance's largest eigenvalue over its trace, over real tokens only;
    mlm_unigram_entropy: the entropy of the real masked labels' frequencies; both from sums that
    two halves of a batch add up to."""
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(6, 9, 5)).astype(np.float32)
    hidden[..., 0] += 4.0 * rng.normal(size=(6, 9)).astype(np.float32)  # one direction dominates
    mask = (np.arange(9)[None] < rng.integers(2, 10, 6)[:, None]).astype(np.int32)
    hidden[mask == 0] = 100.0  # padding must not count
    batch = {"input_mask": mask, "masked_lm_ids": rng.integers(0, 7, (6, 4)).astype(np.int32),
             "masked_lm_weights": (rng.random((6, 4)) < 0.8).astype(np.float32)}

    def sums(rows):
        part = {k: v[rows] for k, v in batch.items()}
        return {**health.health_sums(jnp.asarray(hidden[rows]), part),
                **health.held_out_sums(jnp.asarray(hidden[rows]), part, vocab_size=7)}

    got = health.summarize_health(sums(slice(None)))
    eig = np.linalg.eigvalsh(np.cov(hidden[mask > 0].T, bias=True))
    np.testing.assert_allclose(float(got["token_top_share"]), eig[-1] / eig.sum(), rtol=1e-4)
    assert 0.5 < float(got["token_top_share"]) < 1.0
    labels = batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]
    p = np.bincount(labels, minlength=7) / len(labels)
    np.testing.assert_allclose(float(got["mlm_unigram_entropy"]), -(p[p > 0] * np.log(p[p > 0])).sum(), rtol=1e-5)
    halves = [sums(slice(0, 3)), sums(slice(3, 6))]
    summed = health.summarize_health(jax.tree.map(lambda a, b: a + b, *halves))
    for k in ("token_top_share", "mlm_unigram_entropy"):
        np.testing.assert_allclose(float(summed[k]), float(got[k]), rtol=1e-4, err_msg=k)
    isotropic = rng.normal(size=(64, 32, 8)).astype(np.float32)
    share = health.summarize_health({**health.health_sums(jnp.asarray(isotropic), {"input_mask": np.ones((64, 32))}),
                                     **health.held_out_sums(jnp.asarray(isotropic), {
                                         "input_mask": np.ones((64, 32)), "masked_lm_ids": np.zeros((64, 1), np.int32),
                                         "masked_lm_weights": np.ones((64, 1))}, vocab_size=3)})
    assert 1 / 8 < float(share["token_top_share"]) < 0.16  # no direction preferred: about 1/8 each
    assert float(share["mlm_unigram_entropy"]) == 0.0  # one token only
    assert np.isnan(float(health.unigram_entropy(np.zeros(4))))


# --- exact accumulation in the real steps -------------------------------------------------------

TINY = dict(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=60,
            max_position_embeddings=16, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)


def _batch(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = (np.arange(16)[None] < rng.integers(6, 17, rows)[:, None]).astype(np.int32)
    positions = np.sort(rng.random((rows, 16))[:, 1:5].argsort(1)[:, :3] + 1, 1).astype(np.int32)
    return {"input_ids": (rng.integers(5, 60, (rows, 16)) * mask).astype(np.int32), "input_mask": mask,
            "segment_ids": np.zeros((rows, 16), np.int32), "masked_lm_positions": positions,
            "masked_lm_ids": rng.integers(5, 60, (rows, 3)).astype(np.int32),
            "masked_lm_weights": np.ones((rows, 3), np.float32),
            "next_sentence_labels": rng.integers(0, 2, rows).astype(np.int32)}


HEALTH = ("token_spread", "cls_spread", "cls_spread_ratio")


@pytest.mark.slow  # ~45 s: two steps compiled; the metrics' values: the numpy and ELECTRA tests here
def test_micro_batches_and_eval_batches_add_up_exactly():
    """A step of 2 micro-batches reports the health of the whole batch; two evaluation batches
    summed give the health of both together (dropout off: the same numbers up to rounding)."""
    cfg = BertConfig.from_size("tiny", **TINY)
    tx, schedule = make_optimizer(optimizer_settings(learning_rate=1e-3, warmup_steps=1, num_train_steps=10))
    state = ts.init_state(cfg, "nsp", tx, seed=0)
    graphdef = ts.model_graphdef(cfg, "nsp")
    batch = _batch(8)
    step = {k: jax.jit(lambda s, b, k=k: ts.train_step(s, b, jax.random.key(0), graphdef=graphdef, tx=tx,
                                                       schedule=schedule, accumulation_steps=k)[1])
            for k in (1, 2)}
    one, two = step[1](state, batch), step[2](state, batch)
    for k in (*HEALTH, "mlm_loss"):
        np.testing.assert_allclose(float(two[k]), float(one[k]), rtol=2e-5, err_msg=k)
    assert 0.1 < float(one["token_spread"]) < 10
    evaluate = jax.jit(lambda s, b: ts.eval_step(s.params, b, graphdef=graphdef))
    halves = [evaluate(state, {k: v[s] for k, v in batch.items()}) for s in (slice(0, 4), slice(4, 8))]
    summed = ts.metrics_from_sums(jax.tree.map(lambda a, b: a + b, *halves))
    whole = ts.metrics_from_sums(evaluate(state, batch))
    for k in HEALTH:
        np.testing.assert_allclose(float(summed[k]), float(whole[k]), rtol=2e-5, err_msg=k)


@pytest.mark.slow  # ~25 s; ELECTRA's health on a real run: test_old_electra_runlocal_recipe_is_flagged
def test_electra_reports_the_discriminators_health():
    cfg = BertConfig.from_size("tiny", **{**TINY, "use_pooler": False})
    tx, _ = make_optimizer(optimizer_settings(learning_rate=1e-3, warmup_steps=1, num_train_steps=10))
    electra = dict(generator_fraction=0.5, rtd_weight=50.0)
    state = ts.init_state(cfg, "rtd", tx, seed=0, electra=electra)
    graphdef = ts.model_graphdef(cfg, "rtd", electra)
    sums = jax.jit(lambda s, b: ts.eval_step(s.params, b, graphdef=graphdef))(state, _batch(4))
    assert sums["rtd_hist_replaced"].shape == (health.RTD_BINS,)
    assert float(sums["rtd_hist_replaced"].sum() + sums["rtd_hist_original"].sum()) == float(sums["rtd_tokens"])
    got = ts.metrics_from_sums(sums)
    assert {"rtd_auc", "rtd_prior_entropy", "rtd_bce_over_prior", "token_top_share", "mlm_unigram_entropy",
            "mlm_sampled_accuracy", *HEALTH} <= set(got)
    assert 0.0 <= float(got["rtd_auc"]) <= 1.0 and float(got["token_spread"]) > 0.1
    # Only masked positions can be replaced: the samples that are not the original are the replaced tokens.
    assert float(sums["mlm_weight"] - sums["mlm_sampled_correct"]) == float(sums["rtd_replaced"])
    assert 0.0 <= float(got["mlm_sampled_accuracy"]) < 0.5 and 0.0 < float(got["token_top_share"]) < 1.0
    assert float(sums["mlm_label_counts"].sum()) == float(sums["mlm_weight"])


# --- the rule ----------------------------------------------------------------------------------

REF = {"token_spread": 0.8}


def _monitor(**kw):
    return health.HealthMonitor(warmup_steps=30, advice="Try a lower learning rate", **{"reference": REF, **kw})


def test_hard_sign_warns_once(capsys):
    m = _monitor()
    assert m.check(10, {"token_spread": 0.5}, "eval") is None
    line = m.check(20, {"token_spread": 0.0004}, "eval")
    assert line.startswith("WARNING: the representation collapsed at step 20") and "lower learning rate" in line
    assert m.check(30, {"token_spread": 0.0001}, "eval") is None  # once per run
    assert capsys.readouterr().out.count("WARNING") == 1


def test_soft_signs_must_persist():
    """The prior phase of a healthy run (BCE = H(p), AUC ~0.5, spread dipping) passes; the same
    signs held for COLLAPSE_PERSIST_STEPS steps warn."""
    prior = {"token_spread": 0.6, "rtd_bce_over_prior": 1.001, "rtd_auc": 0.51, "rtd_prior_entropy": 0.42}
    healthy = {"token_spread": 0.6, "rtd_bce_over_prior": 0.8, "rtd_auc": 0.8}
    m = _monitor()
    assert m.check(20, prior, "eval") is None  # before warmup: not a sign
    assert m.check(40, prior, "eval") is None and m.soft_since == 40
    assert m.check(60, {"token_spread": 0.03}, "eval") is None  # low spread: still a sign
    assert m.check(80, healthy, "eval") is None and m.soft_since is None
    assert m.check(100, prior, "eval") is None and m.check(140, prior, "eval") is None
    assert "since step 100" in m.check(150, prior, "eval")
    untrained = {"token_spread": 0.6, "rtd_bce_over_prior": 1.3, "rtd_auc": 0.5}  # above the prior: not yet trained
    assert health.collapse_signs(untrained, REF, step=100, warmup_steps=30, split="eval") == ([], [])


def test_training_windows_give_hard_signs_only():
    m = _monitor()
    assert m.check(50, {"token_spread": 0.03}, "train") is None and m.soft_since is None
    assert m.check(100, {"token_spread": 0.001}, "train").startswith("WARNING")
    assert _monitor(reference=None).check(100, {"token_spread": 0.0}, "eval") is None  # no reference, no test
    assert _monitor(enabled=False).check(100, {"token_spread": 0.0}, "eval") is None


def test_readout_warning_once_above_the_threshold_at_evaluations(capsys):
    m = _monitor()
    below, above = health.TOP_SHARE_WARN - 0.05, health.TOP_SHARE_WARN + 0.05
    electra = {"token_spread": 0.8, "rtd_auc": 0.8}
    assert m.check(0, {**electra, "token_top_share": above}, "eval") is None  # step 0: not a sign
    assert m.check(100, {**electra, "token_top_share": below}, "eval") is None
    assert m.check(150, {**electra, "token_top_share": above}, "train") is None  # held-out only
    assert m.check(150, {"token_spread": 0.8, "token_top_share": above}, "eval") is None  # MLM: logged only
    line = m.check(200, {**electra, "token_top_share": above}, "eval")
    assert line.startswith("WARNING: the readout took over the last layer at step 200") and f"{above:.0%}" in line
    assert m.check(250, {**electra, "token_top_share": above}, "eval") is None  # once
    assert m.warning is None  # not a collapse
    assert capsys.readouterr().out.count("WARNING") == 1


def test_unigram_warning_at_the_last_evaluation_only():
    generator = {"token_spread": 0.8, "mlm_loss": 8.0, "mlm_unigram_cross_entropy": 7.01, "rtd_loss": 0.3,
                 "mlm_unigram_entropy": 6.4}
    m = _monitor(total_steps=250)
    assert m.check(100, generator, "eval") is None  # not the end yet
    assert m.check(250, generator, "train") is None  # the last train window is not held out
    line = m.check(250, generator, "eval")
    assert line == ("WARNING: at the end of pre-training (step 250, held-out evaluation) the generator's held-out "
                    "loss 8.00 nats is above the unigram cross-entropy 7.01 nats of the masked tokens (the loss of "
                    "predicting each by its frequency in the training batches): it predicts them no better than "
                    "token frequencies would.")
    # Between the held-out tokens' own entropy and the fitted unigram's loss: better than any unigram model.
    assert _monitor(total_steps=250).check(250, {**generator, "mlm_loss": 6.8}, "eval") is None
    no_reference = {k: v for k, v in generator.items() if k != "mlm_unigram_cross_entropy"}
    assert _monitor(total_steps=250).check(250, no_reference, "eval") is None  # no training labels counted
    bert = {k: v for k, v in generator.items() if k != "rtd_loss"}
    assert _monitor(total_steps=250).check(250, bert, "eval") is None  # a masked LM: judged by accuracy
    assert _monitor().check(250, generator, "eval") is None  # total_steps unknown: not checked


def test_advice_names_the_flags():
    text = health.advice({"learning_rate": 1e-3, "warmup_steps": 30, "bias_correction": False})
    assert "learning_rate, now 0.001" in text and "warmup_steps, now 30" in text and "bias_correction=True" in text
    assert "bias_correction" not in health.advice({"learning_rate": 2e-4, "warmup_steps": 30, "bias_correction": True})


def test_step0_reference_is_read_back(tmp_path):
    assert evaluation.step0_reference(tmp_path) is None
    w = MetricWriter(tmp_path)
    w.write(0, {"token_spread": 0.84, "loss": 30.0}, "eval")
    w.write(10, {"token_spread": 0.5, "loss": 20.0}, "train")
    w.write(100, {"token_spread": 0.6, "loss": 10.0}, "eval")
    w.close()
    assert evaluation.step0_reference(tmp_path)["token_spread"] == 0.84


# --- the rule on real training ------------------------------------------------------------------

V, LENGTH, P, ROWS = 100, 64, 10, 16


@dataclasses.dataclass
class MarkovBatches:
    """Pre-training batches of a first-order Markov language with structure to learn: each of
    V - 5 words has 2 possible successors; rows [CLS] w1 ... [SEP], P positions masked ([MASK])."""

    seed: int
    index: int = 0

    successors = np.random.default_rng(0).integers(5, V, (V, 2))

    def state(self) -> dict:
        return {"kind": "markov", "index": self.index}

    def restore(self, state: dict) -> None:
        self.index = state["index"]

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        rng = np.random.default_rng([self.seed, self.index])
        self.index += 1
        ids = np.zeros((ROWS, LENGTH), np.int32)
        ids[:, 0], ids[:, -1] = 2, 3
        word = rng.integers(5, V, ROWS)
        for t in range(1, LENGTH - 1):
            ids[:, t] = word
            word = self.successors[word, rng.integers(0, 2, ROWS)]
        positions = np.sort(rng.random((ROWS, LENGTH - 2)).argsort(1)[:, :P] + 1, 1).astype(np.int32)
        masked = ids.copy()
        np.put_along_axis(masked, positions, 4, 1)
        return {"input_ids": masked, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
                "masked_lm_positions": positions, "masked_lm_ids": np.take_along_axis(ids, positions, 1),
                "masked_lm_weights": np.ones((ROWS, P), np.float32), "next_sentence_labels": np.zeros(ROWS, np.int32)}


def _markov_config(load_config, steps: int, **optimizer):
    """The tiny ELECTRA of configs/pretrain.py:model=electra,runlocal,scratch (its recipe, unless
    ``optimizer`` overrides it) on `MarkovBatches`, evaluated every 10 steps on 4 batches."""
    c = load_config("pretrain", "model=electra,runlocal,scratch,synthetic")
    c.model.vocab_size = V
    c.data.update(max_seq_length=LENGTH, max_predictions_per_seq=P)
    c.batch_size, c.num_train_steps = ROWS, steps
    c.optimizer.update(**optimizer)
    c.log_every, c.eval_every, c.eval_steps, c.checkpoint_every = 10, 10, 4, 1000
    c.mesh_shape = (-1, 1, 1)
    return c


def _train_and_watch(c, capsys) -> tuple[list[dict], list[str]]:
    """``c``'s real jitted steps (`objective.jit_pretraining_steps`, `evaluation.held_out_metrics`) on
    `MarkovBatches`, watched as the trainer watches them (`health.HealthMonitor`): the evaluations (every
    ``c.eval_every`` steps from step 0) and the warning lines printed."""
    c = trainer.resolved(c)  # as the job resolves it
    steps = objective.jit_pretraining_steps(c, described_model(c.model, vocab_size=V), sh.config_mesh(c))
    state, data, rng = steps.layout.create(c.seed), MarkovBatches(seed=1), jax.random.key(c.seed)
    monitor = health.HealthMonitor(warmup_steps=c.optimizer.warmup_steps, advice=health.advice(c.optimizer))
    evals = []
    for step in range(c.num_train_steps + 1):
        if step % c.eval_every == 0:
            held_out = itertools.islice(MarkovBatches(seed=99), c.eval_steps)  # the same 4 batches every time
            evals.append({"step": step, **evaluation.held_out_metrics(steps.eval_fn, state, held_out, steps.mesh,
                                                                      steps.rules)})
            if step == 0:
                monitor.reference = evals[0]
            monitor.check(step, evals[-1], "eval")
        if step < c.num_train_steps:
            state, _ = steps.train_fn(state, sh.global_batch(next(data), steps.mesh, steps.rules), rng)
    out = capsys.readouterr().out
    return evals, [line for line in out.splitlines() if line.startswith("WARNING: the representation collapsed")]


@pytest.mark.slow  # ~10 s: a real run; the signs and warnings themselves: the tests above
def test_old_electra_runlocal_recipe_is_flagged(load_config, capsys):
    """~30 s on 2 cores. The recipe before issue 28 on a language with structure: every token's
    last-layer vector the same by step 20 (the discriminator predicts the replaced fraction only),
    and ONE warning line naming what to try."""
    evals, warnings = _train_and_watch(_markov_config(load_config, 30, **OLD_RUNLOCAL), capsys)
    assert len(warnings) == 1, warnings
    assert "token_spread" in warnings[0] and "bias_correction=True" in warnings[0]
    assert evals[-1]["token_spread"] < 0.01 * evals[0]["token_spread"]
    assert abs(evals[-1]["rtd_auc"] - 0.5) < 0.05 and abs(evals[-1]["rtd_bce_over_prior"] - 1) < 0.02


@pytest.mark.slow  # ~60 s on 2 cores
def test_runlocal_electra_recipe_stays_healthy(load_config, capsys):
    """configs/pretrain.py's one-stage ELECTRA runlocal recipe on the same data: no warning in 100 steps, and
    the discriminator ranks replaced tokens (the old recipe sits at AUC 0.5 from step 20 on)."""
    c = _markov_config(load_config, 100)
    assert (c.optimizer.learning_rate, c.optimizer.bias_correction) != (1e-3, False)
    evals, warnings = _train_and_watch(c, capsys)
    assert not warnings
    assert evals[-1]["step"] == 100 and evals[-1]["rtd_auc"] > 0.6, evals[-1]
    assert min(r["token_spread"] for r in evals) > 0.05 * evals[0]["token_spread"]


@pytest.mark.slow  # ~75 s on 2 cores: the whole trainer (TensorFlow, Orbax, the step-0 evaluation)
def test_trainer_prints_one_warning_and_records_step0(tmp_path, load_config, monkeypatch, capsys):
    """`trainer.run` with the old recipe: the step-0 evaluation is recorded in metrics.jsonl (a
    resumed run's reference) and exactly one warning line is printed."""
    class Eval(MarkovBatches):
        def __next__(self):
            batch = super().__next__()
            self.index %= 4  # each evaluation sees the same 4 batches
            return batch

    monkeypatch.setattr(pretraining_task, "make_input", lambda config, split, block=(0, 1):
                        Eval(seed=99) if split == "eval" else MarkovBatches(seed=1))
    launch.run(_markov_config(load_config, 30, **OLD_RUNLOCAL), tmp_path)
    out = capsys.readouterr().out
    assert sum(line.startswith("WARNING: the representation collapsed") for line in out.splitlines()) == 1, out
    evals = read_metrics(tmp_path, "eval")
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    assert evaluation.step0_reference(tmp_path)["token_spread"] == evals[0]["token_spread"]


def test_label_counts_and_the_fitted_unigram_cross_entropy():
    counts = health.LabelCounts(6)
    batch = {"masked_lm_ids": np.array([[1, 2, 2, 0], [5, 1, 1, 3]]),
             "masked_lm_weights": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)}
    assert counts.add(batch) is batch
    counts.add({"input_ids": np.zeros((2, 4), np.int32)})  # no labels: nothing counted
    counts.add({**batch, "masked_lm_weights": np.ones((2, 4), np.float32)})  # read ahead, not taken yet
    assert not counts.counts.any()  # noted, not counted
    counts.commit()
    counts.commit()
    np.testing.assert_array_equal(counts.counts, [0, 2, 2, 0, 0, 1])
    held_out = np.array([0, 3, 1, 0, 0, 0])
    # add-one over 6 ids: q(1) = 3/11, q(2) = 3/11
    assert health.unigram_cross_entropy(counts.counts, held_out) == pytest.approx(-np.log(3 / 11))
    rng = np.random.default_rng(0)
    train, held = rng.integers(0, 50, 200), rng.integers(0, 5, 200)
    p = held / held.sum()
    entropy = -(p[p > 0] * np.log(p[p > 0])).sum()
    assert health.unigram_cross_entropy(train, held) > entropy  # Gibbs: no fitted model beats their own frequencies
    assert np.isnan(health.unigram_cross_entropy(np.zeros(6), held_out))
    assert np.isnan(health.unigram_cross_entropy(counts.counts, np.zeros(6)))

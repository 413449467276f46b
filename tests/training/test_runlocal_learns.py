"""Every ``runlocal`` recipe learns within its smoke budget (slow: a few CPU minutes each).

``python train.py --config configs/pretrain.py:[model=M,]runlocal``, run as the README shows it, must
end with a held-out masked-LM accuracy of at least 1.5x the unigram baseline (always predicting the
token most often masked in the training split, measured on the same held-out documents and masks:
`bert_jax.demo.report.unigram_baseline`, as the demo measures it), with no collapse warning. ELECTRA
pre-trains its discriminator: its held-out AUC must reach 0.75, and its generator's masked-LM
accuracy must beat the unigram baseline. The fast tests guarding the same code:
tests/training/test_health.py (the warnings) and tests/training/test_trainer.py (the loop).
"""

import logging

import pytest

from bert_jax import launch
from bert_jax.demo.report import unigram_baseline

pytestmark = pytest.mark.slow


# No ELECTRA setting measured keeps its discriminator (AUC >= 0.75, no warning) once the generator
# passes the unigram baseline: trained from scratch in this budget the discriminator learns no context,
# on BERT's encoder or ModernBERT's, where ModernBERT's masked LM of the same size does
# (tests/measure_rtd_detectors.py). Started from that masked LM's encoder (ELECTRA's two-stage training,
# which the trainer cannot run yet) it meets the bars (docs/records.md, "The runlocal recipes").
# Strict, so the test says when a recipe fixes it.
ELECTRA_GENERATOR = pytest.mark.xfail(strict=True, reason="the discriminator collapses once the runlocal "
                                                          "generator passes the unigram baseline")


@pytest.mark.parametrize("model", ["bert", "roberta", "albert", pytest.param("electra", marks=ELECTRA_GENERATOR),
                                   "modernbert"])
def test_runlocal_learns(model, load_config, tmp_path, caplog, wikipedia_dump, minilm_dir):
    config = load_config("pretrain", "runlocal" if model == "bert" else f"model={model},runlocal")
    _, baseline = unigram_baseline(config, eval_epochs=1)
    with caplog.at_level(logging.WARNING):
        last = launch.run(config, tmp_path / model)
    warnings = [r.getMessage() for r in caplog.records if "WARNING: " in r.getMessage()]
    assert not warnings, warnings
    accuracy = last["eval"]["mlm_accuracy"]
    print(f"{model}: held-out MLM accuracy {accuracy:.4f}, unigram baseline {baseline['accuracy']:.4f}; "
          f"{last['eval']}")
    if model == "electra":
        assert last["eval"]["rtd_auc"] >= 0.75, last["eval"]
        assert accuracy > baseline["accuracy"], (accuracy, baseline)
    else:
        assert accuracy >= 1.5 * baseline["accuracy"], (accuracy, baseline)


def test_runlocal_modernbert_fine_tunes_on_the_reviews(load_config, tmp_path, minilm_dir):
    """ModernBERT's runlocal workdir fine-tunes on the demo's review sentences through the usual
    command (configs/sentiment.py with init_checkpoint = the workdir) and beats the majority class."""
    pretrain = load_config("pretrain", "model=modernbert,runlocal")
    pretrain.num_train_steps = pretrain.optimizer.num_train_steps = 200
    pretrain.optimizer.decay_steps = 50
    launch.run(pretrain, tmp_path / "pretrained")
    config = load_config("sentiment", "lr=2e-4")
    config.init_checkpoint = str(tmp_path / "pretrained")
    config.num_train_steps, config.batch_size, config.max_seq_length = 300, 32, 64
    config.unpad_multiple = 0  # padded batches: a few shapes to compile instead of one per token count
    results = launch.run(config, tmp_path / "reviews")
    accuracy = results["summary"]["dev"]["accuracy"]["mean"]
    print(f"modernbert runlocal -> reviews dev accuracy {accuracy:.4f}")
    assert accuracy > 0.6, results["summary"]  # the majority class is ~0.5 (labels by the sign of the score)


def test_a_bigram_table_detects_unigram_replacements(wikipedia_dump, minilm_dir):
    """tests/measure_rtd_detectors.py, the yardstick the ELECTRA bar is read against: with the masked
    positions refilled from the unigram distribution, token identity carries no signal and a bigram
    table does (docs/records.md: 0.747 against 0.508)."""
    import importlib.util
    from pathlib import Path

    from bert_jax.config_args import load_config_file

    path = Path(__file__).parents[1] / "measure_rtd_detectors.py"
    spec = importlib.util.spec_from_file_location("measure_rtd_detectors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.measure(load_config_file("pretrain", "model=electra,runlocal"), epochs=1, k=0.1, seed=0)
    print(got)
    assert 0.12 < got["replaced_fraction"] < 0.16, got
    assert abs(got["token_identity_auc"] - 0.5) < 0.03, got
    assert got["bigram_auc"] > 0.7, got

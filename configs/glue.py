r"""Fine-tuning on a GLUE task (Devlin et al., 2019, §4.1): batch 32, 3 epochs, lr from
{5e-5, 4e-5, 3e-5, 2e-5} (pick on dev; default 2e-5), warmup 10%, length 128.

Named arguments: ``task`` (cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli; the AX
diagnostic set is predicted by an MNLI run: ``--config.predict_splits='("test_matched","test_mismatched","ax")'``),
``size`` (from scratch only: tiny … large), ``lr``, ``runlocal`` (tiny model, 20 steps).

    python train.py --config configs/glue.py:task=mrpc --workdir /tmp/mrpc \
        --config.task.source=/data/glue --config.init_checkpoint=hf:/models/bert-base-uncased
    # from our own pre-training: --config.init_checkpoint=/tmp/bert_base_p2 (its workdir)
    # test-set submission files too: --config.predict_splits='("test",)'; 5 restarts: --config.seeds=5

``task.source``: the directory of the official GLUE download (``<dir>/MRPC/train.tsv`` …) or
``tfds`` (TFDS ``glue/<task>``; ``task.data_dir`` for its data directory). See docs/finetuning.md.
"""

from bert_jax.config_args import load_config_file, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, task="mrpc", size="base", lr=2e-5, runlocal=False)
    if args.task.lower() == "ax":
        raise ValueError("task=ax: the GLUE diagnostic set has no training data; it is predicted with an MNLI "
                         "classifier: task=mnli --config.predict_splits="
                         "'(\"test_matched\",\"test_mismatched\",\"ax\")' (writes AX.tsv)")
    # The paper's GLUE recipe: length 128, batch 32, 3 epochs (configs/finetune.py's defaults).
    config = load_config_file("finetune", f"size={args.size},lr={args.lr!r},runlocal={args.runlocal}")
    config.task = dict(family="glue", name=args.task, source="", data_dir="", on_error="skip")
    return config

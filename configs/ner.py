r"""Fine-tuning on CoNLL-2003 NER (Devlin et al., 2019, §5.3): a label on the first sub-token of
each word, the token classifier on the final layer; batch 32, 3 epochs, lr 5e-5, length 128 (the
paper does not state its NER hyper-parameters, only that they were picked on dev: these are from
its A.3 grid). Entity-level F1 (conlleval / seqeval semantics) on dev and test.

Named arguments: ``size`` (from scratch only), ``lr``, ``runlocal``.

    python train.py --config configs/ner.py --workdir /tmp/conll \
        --config.task.source=/data/conll2003 --config.init_checkpoint=hf:/models/bert-base-cased

``task.source``: a directory with train.txt, valid.txt (or dev.txt) and test.txt in CoNLL-2003
format, or ``tfds`` (TFDS ``conll2003``). Use a cased vocabulary: case matters for names.
"""

from bert_jax.config_args import load_config_file, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, size="base", lr=5e-5, runlocal=False)
    # Length 128, batch 32, 3 epochs: configs/finetune.py's defaults.
    config = load_config_file("finetune", f"size={args.size},lr={args.lr!r},runlocal={args.runlocal}")
    config.task = dict(family="ner", source="", data_dir="", on_error="skip")
    config.task.label_names = ""  # "": CoNLL-2003's nine tags
    return config

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

from bert_jax.config_args import parse_arg
from bert_jax.finetuning.config import base_config


def get_config(arg=None):
    args = parse_arg(arg, size="base", lr=5e-5, runlocal=False)
    task = dict(family="ner", source="", data_dir="", label_names="", on_error="skip")
    return base_config(task, size=args.size, max_seq_length=128, batch_size=32, epochs=3.0,
                       learning_rate=args.lr, runlocal=args.runlocal)

r"""``make demo``'s pre-training stage: a tiny encoder on the gensim Wikipedia excerpt and the review
task's unlabelled training sentences, a few minutes of 2 CPU cores: configs/pretrain.py's runlocal
recipe with the departures below (measured in docs/records.md, "The demo's pre-training and transfer").

Named arguments: model (electra, the demo's: replaced-token detection with a generator 1/4 as wide;
bert: MLM + NSP), steps (default `DEFAULT_STEPS`), lr (default `DEFAULT_LR`), batch (default 32).

    python train.py --config configs/demo.py:model=electra --workdir /tmp/demo_pretrain \
        --config.data.vocab=DEMO/vocab/vocab.txt \
        --config.data.input=pkg:wikipedia,DEMO/task_text/train_sentences.txt

`python -m bert_jax.demo` runs it after building the vocabulary (DEMO: its workdir).
"""

from bert_jax.config_args import load_config_file, parse_arg

DEFAULT_STEPS = {"bert": 400, "electra": 250}  # a few CPU minutes each: the whole demo within 15
# BERT: MLM accuracy's pick, 2e-3, transfers worse; ELECTRA: higher rates collapse the discriminator.
DEFAULT_LR = {"bert": 5e-4, "electra": 1e-4}
WARMUP_DIVISOR = {"bert": 10, "electra": 5}  # warmup = steps // this; ELECTRA's 20% with the bias below
# The output bias at logit(0.4): no phase at the label prior; nearer the prior (0.15) transfer suffers.
ELECTRA_RTD_PRIOR = 0.4


def get_config(arg=None):
    args = parse_arg(arg, model="bert", steps=0, lr=0.0, batch=32)
    if args.model not in DEFAULT_STEPS:
        raise ValueError(f"model={args.model!r}: expected one of {list(DEFAULT_STEPS)}")
    args.steps = args.steps or DEFAULT_STEPS[args.model]
    args.lr = args.lr or DEFAULT_LR[args.model]
    if args.model == "electra":
        config = load_config_file("pretrain", "model=electra,runlocal,scratch")  # one stage, from scratch
        config.model.update(embedding_size=None, use_pooler=False)
    else:
        config = load_config_file("pretrain", "size=tiny,objective=nsp,masking=dynamic,runlocal")
    # Dropout 0: a few epochs over the text do not overfit, and dropout is slow on a CPU.
    config.model.hidden_dropout_prob = 0.0
    config.model.attention_dropout_prob = 0.0
    config.data.input = "pkg:wikipedia"
    # "": the demo's own 8k WordPiece, set on the command line (a 30k softmax costs more than the tiny model).
    config.data.vocab = ""
    config.data.eval_fraction = 0.1
    config.data.masking = "dynamic"
    config.data.packing = "full"
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.batch_size = args.batch  # 32 x 128 with bias correction: chosen on held-out MLM accuracy
    config.num_train_steps = args.steps
    # Adam with bias correction and a schedule that ends with the run: a short run still warms up and anneals.
    config.optimizer.learning_rate = args.lr
    config.optimizer.warmup_steps = max(1, args.steps // WARMUP_DIVISOR[args.model])
    config.optimizer.num_train_steps = args.steps
    config.optimizer.bias_correction = True
    if args.model == "electra":
        config.electra.rtd_prior = ELECTRA_RTD_PRIOR
        # The tied generator at the discriminator's rate, as the bias and warmup were chosen with
        # (docs/records.md, "The demo keeps the tied generator").
        config.electra.tie_embeddings = True
        config.optimizer.generator_lr_scale = 1.0
    config.log_every, config.eval_every, config.checkpoint_every = 50, 100, 100
    config.eval_steps = 22  # the demo sets this to one pass over the held-out documents
    config.keep_checkpoints = 1
    return config

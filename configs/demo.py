r"""``make demo``'s pre-training stage: a tiny encoder on the gensim Wikipedia excerpt and the review
task's unlabelled training sentences, a few minutes of 2 CPU cores: configs/pretrain.py's runlocal
recipe with the departures below (measured in docs/records.md, "The demo's pre-training and transfer").

Named arguments: model (modernbert: the tiny ModernBERT's masked LM, the runlocal recipe; electra:
replaced-token detection with a generator 1/4 as wide; electra_mlm: joint ELECTRA training whose
discriminator starts from a modernbert workdir, --config.init_checkpoint=DIR; bert: MLM + NSP), steps (default
`DEFAULT_STEPS`), lr (default `DEFAULT_LR`), batch (default 32), seed (default 0: initialisation,
masks and the order of the rows).

    python train.py --config configs/demo.py:model=modernbert --workdir /tmp/demo_pretrain \
        --config.data.vocab=DEMO/vocab/vocab.txt \
        --config.data.input=DEMO/task_text/train_sentences.txt,pkg:wikipedia

`python -m bert_jax.demo` runs it after building the vocabulary (DEMO: its workdir).
"""

from bert_jax.config_args import load_config_file, parse_arg

DEFAULT_STEPS = {"modernbert": 600, "bert": 400, "electra": 250, "electra_mlm": 300}  # a few CPU minutes each
# BERT: MLM accuracy's pick, 2e-3, transfers worse; ELECTRA: higher rates collapse the discriminator;
# ModernBERT and ELECTRA from its masked LM: their runlocal rates.
DEFAULT_LR = {"modernbert": 1e-3, "bert": 5e-4, "electra": 1e-4, "electra_mlm": 1e-3}
# warmup = steps // this; ELECTRA's 20% with its bias below
WARMUP_DIVISOR = {"modernbert": 10, "bert": 10, "electra": 5, "electra_mlm": 10}
# The output bias at logit(0.4): no phase at the label prior; nearer the prior (0.15) transfer suffers.
ELECTRA_RTD_PRIOR = 0.4


def get_config(arg=None):
    args = parse_arg(arg, model="bert", steps=0, lr=0.0, batch=32, seed=0)
    if args.model not in DEFAULT_STEPS:
        raise ValueError(f"model={args.model!r}: expected one of {list(DEFAULT_STEPS)}")
    args.steps = args.steps or DEFAULT_STEPS[args.model]
    args.lr = args.lr or DEFAULT_LR[args.model]
    if args.model == "electra":
        config = load_config_file("pretrain", "model=electra,runlocal,scratch")  # one stage, from scratch
        config.model.update(embedding_size=None, use_pooler=False)
    elif args.model == "electra_mlm":  # the discriminator's encoder from a modernbert run (init_checkpoint)
        config = load_config_file("pretrain", "model=electra,runlocal")
        config.optimizer.decay_steps = max(1, args.steps // 4)
    elif args.model == "modernbert":
        # 30% masked, documents packed without attention between them, StableAdamW, WSD: its last 10% decaying.
        config = load_config_file("pretrain", "model=modernbert,runlocal")
        config.optimizer.decay_steps = max(1, args.steps // 10)
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
    config.data.max_seq_length = 128
    # ModernBERT (and ELECTRA on its encoder) keep whole documents packed apart and 38 predictions (30%).
    if args.model in ("bert", "electra"):
        config.data.packing = "full"
        config.data.max_predictions_per_seq = 20
    config.batch_size = args.batch  # 32 x 128 with bias correction: chosen on held-out MLM accuracy
    config.num_train_steps = args.steps
    # Adam with bias correction and a schedule that ends with the run: a short run still warms up and anneals.
    config.optimizer.learning_rate = args.lr
    config.optimizer.warmup_steps = max(1, args.steps // WARMUP_DIVISOR[args.model])
    config.optimizer.num_train_steps = args.steps
    config.optimizer.bias_correction = True
    config.seed = config.data.seed = args.seed
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

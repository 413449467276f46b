r"""``make demo``'s pre-training stage: a tiny encoder (2 layers × 128) on the English Wikipedia excerpt
of the gensim wheel plus the review task's unlabelled training sentences, a few minutes of 2 CPU
cores. `python -m bert_jax.demo` runs it after building the vocabulary; by hand:

    python train.py --config configs/demo.py:model=electra --workdir /tmp/demo_pretrain \
        --config.data.vocab=DEMO_WORKDIR/vocab/vocab.txt --config.data.input=pkg:wikipedia,TASK_TEXT

Named arguments: ``model`` (electra, the demo's default: replaced-token detection, the discriminator
the tiny BERT network, a generator 1/4 its width; bert: MLM + NSP), ``steps`` (optimizer steps;
default `DEFAULT_STEPS`), ``lr`` (default `DEFAULT_LR`), ``batch`` (default 32). The rest is
configs/pretrain.py's runlocal recipe with the departures commented below; the measurements behind
them: docs/records_demo.md.
"""


from bert_jax.config_args import load_config_file, parse_arg

DEFAULT_STEPS = {"bert": 400, "electra": 250}  # each about 2-3 CPU minutes: the whole demo within 15
# BERT 5e-4: MLM accuracy's pick 2e-3 transfers worse; ELECTRA 1e-4: 2e-3 collapses, 5e-4 decays to AUC 0.5.
DEFAULT_LR = {"bert": 5e-4, "electra": 1e-4}
WARMUP_DIVISOR = {"bert": 10, "electra": 5}  # warmup = steps // this; ELECTRA's 20% with the bias below: higher AUC
# Output bias at logit(0.4): the zero bias's phase at the label prior is gone; nearer 0.15 the readout takes over.
ELECTRA_RTD_PRIOR = 0.4


def get_config(arg=None):
    args = parse_arg(arg, model="bert", steps=0, lr=0.0, batch=32)
    if args.model not in DEFAULT_STEPS:
        raise ValueError(f"model={args.model!r}: expected one of {list(DEFAULT_STEPS)}")
    args.steps = args.steps or DEFAULT_STEPS[args.model]
    args.lr = args.lr or DEFAULT_LR[args.model]
    if args.model == "electra":
        c = load_config_file("pretrain", "model=electra,runlocal")
        c.model.update(embedding_size=None, use_pooler=False)
    else:
        c = load_config_file("pretrain", "size=tiny,objective=nsp,masking=dynamic,runlocal")
    # Dropout 0: a few epochs over the text do not overfit, and dropout costs ~30% of a CPU step.
    c.model.update(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
    # vocab: the demo's own 8k WordPiece (a 30k softmax costs more than the tiny model); 10% of documents held out.
    c.data.update(input="pkg:wikipedia", vocab="", eval_fraction=0.1, masking="dynamic", packing="full",
                  max_seq_length=128, max_predictions_per_seq=20)
    c.batch_size = args.batch  # 32 x 128, chosen with bias correction on held-out MLM accuracy
    c.num_train_steps = args.steps
    # Adam with bias correction and a schedule that ends with the run: a short run still warms up and anneals.
    c.optimizer.update(learning_rate=args.lr, warmup_steps=max(1, args.steps // WARMUP_DIVISOR[args.model]),
                       num_train_steps=args.steps, bias_correction=True)
    if args.model == "electra":
        c.electra.rtd_prior = ELECTRA_RTD_PRIOR
        # The tied generator at the discriminator's rate, as the bias and warmup were chosen with: runlocal's
        # untied generator at 5x collapses the discriminator here (AUC 0.54 at step 250; docs/records.md).
        c.electra.tie_embeddings = True
        c.optimizer.generator_lr_scale = 1.0
    c.log_every, c.eval_every, c.checkpoint_every = 50, 100, 100
    c.eval_steps = 22  # the demo sets this to one pass over the held-out documents
    c.keep_checkpoints = 1
    return c

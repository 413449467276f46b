r"""BERT pre-training (Devlin et al., 2019: MLM + NSP) and its family's recipes (docs/family.md).

Named arguments: ``model`` (bert | roberta | albert | electra: the recipe, `RECIPES`), ``size``
(bert/roberta: tiny | mini | small | medium | base | large; albert: base | large | xlarge | xxlarge;
electra: small | base | large), ``masking`` (static | dynamic), ``objective`` (nsp | sop | none),
``phase`` (1: length 128 for the first 90% of the steps; 2: length 512 for the last 10%, continuing
phase 1's state and schedule), ``runlocal`` (the tiny model on the gensim Wikipedia excerpt, a few CPU
minutes; another ``size`` with it is an error), ``synthetic`` (random batches), ``recipe`` (lamb: the
large-batch recipe of You et al. 2019 for model=bert, see `lamb`), ``per_device`` (rows per device in
one micro-batch; the step accumulates the rest).

    python train.py --config configs/pretrain.py:runlocal --workdir /tmp/bert_tiny

The paper's two phases on one host or a pod slice: docs/pretraining.md; the LAMB recipe: docs/lamb.md.
"""

import ml_collections
from ml_collections import config_dict

from bert_jax.config_args import parse_arg
from bert_jax.model.config import SIZES
from bert_jax.training.distributed import default_config as distributed_config
from bert_jax.training.sharding import DEFAULT_RULES

PAPER_STEPS = 1_000_000
PHASE1_STEPS = 900_000  # 90% at length 128, then 10% at 512 on the same schedule
MODELS = ("bert", "roberta", "albert", "electra")
FAMILY_SIZE_NAMES = {"albert": ("base", "large", "xlarge", "xxlarge"), "electra": ("small", "base", "large")}

# The family's recipes (docs/family.md): what each sets on top of BERT's config below, as data.
# "all": every size; a size name: that size on top; "runlocal": the CPU variant (batch 32, 600 steps,
# 10% warmup at "lr"), on top of BERT's runlocal data and cadence.
RECIPES = {
    # Adam with bias correction at this short warmup: without it the first steps are ~5x lr and the
    # tiny model collapses within 20 steps (docs/records.md, "Why runlocal collapsed").
    "bert": {"runlocal": dict(lr=1e-3, optimizer=dict(bias_correction=True))},
    # RoBERTa (Liu et al., 2019, Table 9): dynamic masking, no NSP, FULL-SENTENCES at length 512, batch
    # 8k, 500k steps, Adam (bias-corrected) b2 0.98; Hugging Face's layout (positions after the
    # padding id, one token type, LayerNorm eps 1e-5), so exports load as RobertaModel.
    "roberta": {
        "all": dict(
            model=dict(position_offset=2, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5),
            data=dict(max_seq_length=512, max_predictions_per_seq=80, packing="full", short_seq_prob=0.0),
            batch_size=8192, num_train_steps=500_000,
            optimizer=dict(optimizer="adamw", bias_correction=True, learning_rate=6e-4, warmup_steps=24_000,
                           num_train_steps=500_000, b2=0.98, eps=1e-6, schedule="linear")),
        "large": dict(optimizer=dict(learning_rate=4e-4, warmup_steps=30_000)),
        "runlocal": dict(lr=1e-3, data=dict(max_seq_length=128, max_predictions_per_seq=20)),
    },
    # ALBERT (Lan et al., 2020, §4.1): factorised embeddings E = 128, one shared block (the size
    # table), sentence-order prediction, n-grams of n <= 3 masked, LAMB lr 0.00176, batch 4096, 125k
    # steps at length 512, 3,125 warmup steps (as the released code), no dropout (as the v2 release).
    "albert": {
        "all": dict(
            model=dict(hidden_dropout_prob=0.0, attention_dropout_prob=0.0),
            data=dict(max_seq_length=512, max_predictions_per_seq=20, short_seq_prob=0.1, ngram_mask=3),
            batch_size=4096, num_train_steps=125_000,
            optimizer=dict(optimizer="lamb", learning_rate=0.00176, warmup_steps=3_125, num_train_steps=125_000,
                           b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, bias_correction=True, schedule="linear")),
        # Adam at 1e-3: LAMB at 2e-3 and batch 32 left the tiny model at the unigram baseline after 600
        # steps (0.053 against 0.054; Adam: 0.073; docs/records.md, "The runlocal recipes").
        "runlocal": dict(lr=1e-3, model=dict(size="tiny", embedding_size=64, share_layers=True, hidden_act="gelu_new"),
                         data=dict(max_seq_length=128, max_predictions_per_seq=20), optimizer=dict(optimizer="adamw")),
    },
    # ELECTRA (Clark et al., 2020, Table 6): replaced-token detection, generator 1/4 of the
    # discriminator (1/3 for base), loss MLM + 50 BCE, 15% masked (25% for large), 10k warmup.
    # rtd_prior 0: the discriminator's output bias starts at 0, as the paper's code (a bias at the prior
    # trades transfer for AUC: docs/records.md, "The discriminator's output bias").
    "electra": {
        "all": dict(electra=dict(generator_fraction=0.25, rtd_weight=50.0, rtd_prior=0.0, tie_embeddings=True),
                    data=dict(packing="full"),
                    optimizer=dict(warmup_steps=10_000)),
        "small": dict(data=dict(max_seq_length=128, max_predictions_per_seq=19, masked_lm_prob=0.15),
                      batch_size=128, num_train_steps=1_000_000,
                      optimizer=dict(learning_rate=5e-4, num_train_steps=1_000_000)),
        "base": dict(electra=dict(generator_fraction=1 / 3),
                     data=dict(max_seq_length=512, max_predictions_per_seq=77, masked_lm_prob=0.15),
                     batch_size=256, num_train_steps=766_000,
                     optimizer=dict(learning_rate=2e-4, num_train_steps=766_000)),
        "large": dict(data=dict(max_seq_length=512, max_predictions_per_seq=128, masked_lm_prob=0.25),
                      batch_size=2048, num_train_steps=400_000,
                      optimizer=dict(learning_rate=2e-4, num_train_steps=400_000)),
        # lr 2e-4 with Adam's bias correction: the family's lr 1e-3 without it collapses (every token
        # the same last-layer vector within 25 steps, held-out AUC 0.50); chosen on held-out AUC
        # among 10 settings (docs/records.md, "ELECTRA at small scale").
        "runlocal": dict(lr=2e-4, model=dict(size="tiny", embedding_size=64, use_pooler=False),
                         data=dict(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15),
                         # 300 steps, 30 warmup: the measured recipe. Its generator stays below the unigram
                         # baseline; a stronger one collapsed the discriminator (docs/records.md).
                         num_train_steps=300, optimizer=dict(bias_correction=True, num_train_steps=300,
                                                             warmup_steps=30)),
    },
}
# The LAMB recipe (You et al., 2019, §4: BERT-large, 8,599 steps in all) with NVIDIA's published
# settings for it (DeepLearningExamples, PyTorch BERT: phase 1 lr 6e-3 with 28.43% warmup of 7,038
# steps, phase 2 lr 4e-3 with 12.8% of 1,563). per_device: the paper's rows per TPU v3 core (batch /
# 2,048 cores, no accumulation on its v3-1024 pod); other slices accumulate the rest.
LAMB_PHASES = {
    1: dict(batch=65_536, steps=7_038, lr=6e-3, warmup=0.2843, per_device=32),
    2: dict(batch=32_768, steps=1_563, lr=4e-3, warmup=0.128, per_device=16),
}


def get_config(arg=None):
    args = parse_arg(arg, model="bert", size="", masking="", objective="", phase=1, runlocal=False,
                     synthetic=False, recipe="", per_device=0)
    check(args)
    if args.runlocal and args.model in FAMILY_SIZE_NAMES:  # size=tiny: what the family's runlocal trains
        args.size = ""
    args.size = args.size or {"albert": "base", "electra": "small"}.get(args.model, "base")
    sizes = FAMILY_SIZE_NAMES.get(args.model)
    long = args.phase == 2  # the paper's last 10% of steps at length 512

    c = ml_collections.ConfigDict()
    c.seed = 0
    # PRNG of the dropout keys (seed folded with the step). threefry2x32: the same masks on every
    # mesh; rbg: XLA's RngBitGenerator (faster on TPU), masks may differ between mesh shapes.
    c.rng_impl = "threefry2x32"
    c.prefetch_batches = 2  # batches read and placed on the devices in a background thread
    # M > 0: the blocks' projections and feed-forward run on the real tokens only, rounded up to M
    # per shard (the same numbers as padded; pays off with padding). Single process only.
    c.unpad_multiple = 0
    c.objective = args.objective or {"roberta": "none", "albert": "sop", "electra": "rtd"}.get(args.model, "nsp")
    c.multihost = False  # a pod slice or any job of several processes: jax.distributed with c.distributed
    c.distributed = distributed_config()

    c.model = ml_collections.ConfigDict(dict(
        size=f"{args.model}-{args.size}" if sizes else args.size,
        vocab_size=30522,  # from data.vocab unless the data is synthetic
        max_position_embeddings=512, dtype="auto", scan_layers="auto", remat_policy="none",
        attention_impl="auto", dropout_impl="auto", hidden_dropout_prob=0.1, attention_dropout_prob=0.1,
        # The family's switches (bert_jax/model/config.py; None = the size's value, docs/family.md).
        embedding_size=config_dict.placeholder(int), share_layers=config_dict.placeholder(bool),
        position_offset=config_dict.placeholder(int), type_vocab_size=config_dict.placeholder(int),
        layer_norm_eps=config_dict.placeholder(float), hidden_act=config_dict.placeholder(str),
        use_pooler=config_dict.placeholder(bool)))

    c.data = ml_collections.ConfigDict(dict(
        kind="synthetic" if args.synthetic else "pretraining",
        # static: pre-masked TFRecords (the paper); dynamic: a new mask every epoch (RoBERTa)
        masking=args.masking or ("static" if args.model == "bert" else "dynamic"),
        input="", eval_input="", vocab="",  # set on the command line (gs:// works)
        eval_fraction=0.0,  # > 0 with text input: hold out this fraction of documents for eval
        format="bert", max_seq_length=512 if long else 128, max_predictions_per_seq=80 if long else 20,
        masked_lm_prob=0.15, whole_word_mask=False, short_seq_prob=0.1, packing="full",
        ngram_mask=0,  # N > 0: spans of n <= N whole words masked, p(n) ~ 1/n (ALBERT: 3)
        pack_examples=0,  # K > 0: up to K examples per row, attention within each (batch_size counts rows)
        shuffle_buffer=10_000, seed=0))

    c.batch_size = 256  # global, across all devices and hosts
    # The one micro-batch knob: rows per batch shard in one micro-batch (N: the step accumulates
    # batch_size / (N x shards) of them, each loss divided by the whole batch's counts, so one recipe
    # runs on any slice); 0: the whole batch at once; "auto": 8 rows on the CPU, where that measured
    # faster, 0 on GPU/TPU (resolved to a number when the job starts). A number or "auto".
    c.per_device_batch = config_dict.FieldReference(args.per_device or "auto", field_type=object)
    c.num_train_steps = PAPER_STEPS if long else PHASE1_STEPS
    c.init_checkpoint = ""  # phase 2: phase 1's workdir
    # What init_checkpoint carries over: "state" (the paper's phase 2 continues phase 1's schedule)
    # or "params" (a fresh optimizer at step 0).
    c.init_mode = "state"
    # The paper's optimizer: Adam without bias correction as in the released code
    # (bert_jax/training/optim.py), lr 1e-4, 10k warmup, linear decay to 0 at step 1M over both phases.
    c.optimizer = ml_collections.ConfigDict(dict(
        optimizer="adamw_bert", learning_rate=1e-4, warmup_steps=10_000, num_train_steps=PAPER_STEPS,
        weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0, bias_correction=False,
        schedule="bert", decay_power=1.0,
        generator_lr_scale=1.0))  # ELECTRA: the generator's rate over the discriminator's (1: the reference)

    c.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); e.g. (-1, 8, 1) for FSDP on a pod slice
    c.sharding_rules = DEFAULT_RULES  # logical axis -> mesh axes (bert_jax/training/sharding.py)
    c.log_every = 100
    c.eval_every = 10_000
    c.eval_steps = 50
    c.checkpoint_every = 5_000
    c.keep_checkpoints = 3
    c.restore = "latest"  # or "previous" (the newest will not restore) or a step (docs/robustness.md)

    recipe = RECIPES.get(args.model, {})
    update(c, recipe.get("all", {}))
    update(c, recipe.get(args.size, {}))
    if args.runlocal:  # the gensim Wikipedia excerpt and MiniLM's vocabulary, a few CPU minutes
        c.model.size = "tiny"
        c.data.update(input="pkg:wikipedia", vocab="pkg:minilm/vocab.txt", eval_fraction=0.05,
                      masking="dynamic", shuffle_buffer=2_000)
        c.log_every, c.eval_every, c.eval_steps, c.checkpoint_every = 20, 100, 5, 100
        local = dict(recipe["runlocal"])
        c.batch_size, c.num_train_steps = 32, 600
        c.optimizer.update(learning_rate=local.pop("lr"), num_train_steps=600, warmup_steps=60)
        update(c, local)
    if args.recipe == "lamb":
        lamb(c, args)
    if args.synthetic and args.runlocal:
        c.model.vocab_size = 1000
    return c


def check(args):
    """One line for each argument out of range."""
    if args.model not in MODELS:
        raise ValueError(f"model={args.model!r}: expected one of {MODELS}")
    sizes = FAMILY_SIZE_NAMES.get(args.model, tuple(SIZES))
    if args.size and args.size not in sizes and not (args.runlocal and args.size == "tiny"):
        raise ValueError(f"size={args.size!r} for model={args.model}: expected one of {sizes}")
    if args.runlocal and args.size not in ("", "tiny"):  # never trained silently in place of the size asked for
        raise ValueError(f"size={args.size} with runlocal: runlocal trains the tiny model; leave out size= "
                         f"(or drop runlocal)")
    if args.phase not in (1, 2):
        raise ValueError(f"phase={args.phase}: expected 1 (length 128) or 2 (length 512)")
    if args.model != "bert" and args.phase != 1:
        raise ValueError(f"phase applies to model=bert; the {args.model} recipe has one phase")
    if args.recipe not in ("", "lamb"):
        raise ValueError(f"recipe={args.recipe!r}: expected lamb (or leave it out for the paper's Adam)")
    if args.recipe and args.model != "bert":
        raise ValueError(f"recipe=lamb applies to model=bert; the {args.model} recipe has its own optimizer")
    if args.per_device < 0:
        raise ValueError(f"per_device={args.per_device}: expected rows per device > 0 (0: no accumulation)")


def update(c, settings: dict):
    """``c`` updated from nested ``settings`` (a section's dict updates that section; a new section is added)."""
    for key, value in settings.items():
        if isinstance(value, dict) and key in c:
            update(c[key], value)
        else:
            c[key] = ml_collections.ConfigDict(value) if isinstance(value, dict) else value


def lamb(c, args):
    """``c`` set to the LAMB recipe (You et al., 2019, §4: BERT-large in 8,599 steps), phase
    ``args.phase`` of `LAMB_PHASES`, with NVIDIA's published settings for it (docs/lamb.md; the reasons:
    docs/records.md, "The LAMB recipe's settings and its phase 2"). ``runlocal``: the tiny model,
    batch 128 as 4 micro-batches of 32, 40 steps."""
    p = LAMB_PHASES[args.phase]
    c.batch_size, c.num_train_steps = p["batch"], p["steps"]
    # Rows per device in a micro-batch: the paper's per-core rows (no accumulation on its v3 pod); a
    # smaller slice accumulates batch_size / (per_device_batch x batch shards) micro-batches.
    c.per_device_batch = args.per_device or p["per_device"]
    # Phase 2 starts fresh moments at step 0 on phase 1's parameters: its warmup rebuilds them at length 512.
    c.init_mode = "params" if args.phase == 2 else "state"
    # NVIDIA's FusedLAMB settings; decay_power 0.5 is their PolyWarmUpScheduler(degree=0.5).
    c.optimizer.update(optimizer="lamb", learning_rate=p["lr"], weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6,
                       clip_norm=1.0, bias_correction=True, schedule="bert", decay_power=0.5)
    if args.runlocal:
        c.batch_size, c.num_train_steps = 128, 40
        c.per_device_batch = args.per_device or 32
    # Warmup and decay follow num_train_steps (--config.num_train_steps=N keeps the phase's shape).
    steps = c.get_ref("num_train_steps")
    c.optimizer.num_train_steps = steps
    c.optimizer.warmup_steps = (steps * p["warmup"] + 0.5).to_int()

r"""BERT pre-training (Devlin et al., 2019: MLM + NSP) and its family's recipes (docs/family.md).

Named arguments: model (bert | roberta | albert | electra | modernbert: the recipe, `RECIPES`), size
(bert, roberta: tiny | mini | small | medium | base | large; albert: base … xxlarge; electra: small |
base | large; modernbert: base | large), masking (static | dynamic), objective (nsp | sop | none), phase
(bert: 1: length 128 to step 900k, 2: length 512 to 1M on phase 1's state; modernbert: 1: length
1,024, RoPE 10k, 2: the context extension to 8,192 on phase 1's state, the global layers' RoPE at
160k), runlocal (the tiny model on the gensim Wikipedia excerpt, a few CPU minutes; electra: on a
ModernBERT runlocal workdir's encoder),
scratch (electra's runlocal in one stage, from scratch), synthetic (random batches), recipe (lamb: You
et al. 2019, `lamb`), per_device (rows per device in a micro-batch; the step accumulates the rest).

    python train.py --config configs/pretrain.py:runlocal --workdir /tmp/bert_tiny
    python train.py --config configs/pretrain.py:model=modernbert,runlocal --workdir /tmp/modernbert_tiny
    python train.py --config configs/pretrain.py:model=electra,runlocal --workdir /tmp/electra_tiny \
        --config.init_checkpoint=/tmp/modernbert_tiny

The paper's two phases on a host or a pod slice: docs/pretraining.md; the LAMB recipe: docs/lamb.md.
"""

import ml_collections
from ml_collections import config_dict

from bert_jax.config_args import parse_arg
from bert_jax.model.config import SIZES
from bert_jax.training.distributed import default_config as distributed_config
from bert_jax.training.sharding import DEFAULT_RULES

PAPER_STEPS = 1_000_000
PHASE1_STEPS = 900_000  # 90% of the steps at length 128, where attention is cheap; the rest at 512
MODELS = ("bert", "roberta", "albert", "electra", "modernbert")
FAMILY_SIZE_NAMES = {"albert": ("base", "large", "xlarge", "xxlarge"), "electra": ("small", "base", "large"),
                     "modernbert": ("base", "large")}
DEFAULT_SIZE = {"albert": "base", "electra": "small"}  # the others: base
DEFAULT_OBJECTIVE = {"roberta": "none", "albert": "sop", "electra": "rtd", "modernbert": "none"}  # bert: nsp
PHASED = ("bert", "modernbert")  # the recipes with a phase 2 (phase=2)

# The family's recipes (docs/family.md): what each sets on top of BERT's config, as data. "all": every
# size; a size's name: that size on top; "runlocal": the CPU variant on top of BERT's runlocal (batch 32,
# 600 steps, 10% warmup at "lr"); "runlocal_scratch": the same with the scratch argument.
RECIPES = {
    # Bias correction: without it the first steps at this short warmup are several times lr and the
    # tiny model collapses (docs/records.md, "Why runlocal collapsed").
    "bert": {"runlocal": dict(lr=1e-3, optimizer=dict(bias_correction=True))},
    # RoBERTa (Liu et al., 2019, Table 9): dynamic masking, no NSP, FULL-SENTENCES at length 512, batch
    # 8k, 500k steps, Adam b2 0.98; Hugging Face's layout (positions after the padding id, one token
    # type, LayerNorm eps 1e-5), so that exports load as RobertaModel.
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
    # ALBERT (Lan et al., 2020, §4.1): factorised embeddings E = 128 and one shared block (the size
    # table), sentence order, n-grams of n <= 3 masked, LAMB lr 0.00176, batch 4096, 125k steps at
    # length 512, 3,125 warmup steps (the released code), no dropout (the v2 release).
    "albert": {
        "all": dict(
            model=dict(hidden_dropout_prob=0.0, attention_dropout_prob=0.0),
            data=dict(max_seq_length=512, max_predictions_per_seq=20, short_seq_prob=0.1, ngram_mask=3),
            batch_size=4096, num_train_steps=125_000,
            optimizer=dict(optimizer="lamb", learning_rate=0.00176, warmup_steps=3_125, num_train_steps=125_000,
                           b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, bias_correction=True, schedule="linear")),
        # Adam at 2e-3: LAMB at batch 32 stays at the unigram baseline and Adam at 1e-3 learns too slowly
        # for the 600 steps (docs/records.md, "The runlocal recipes").
        "runlocal": dict(lr=2e-3, model=dict(size="tiny", embedding_size=64, share_layers=True, hidden_act="gelu_new"),
                         data=dict(max_seq_length=128, max_predictions_per_seq=20), optimizer=dict(optimizer="adamw")),
    },
    # ELECTRA (Clark et al., 2020, Table 6): replaced-token detection, a generator 1/4 of the
    # discriminator (1/3 for base), loss MLM + 50 BCE, 15% masked (25% for large), 10k warmup. rtd_prior
    # 0: the output bias starts at 0, as the paper's code (docs/records.md, "The discriminator's output bias").
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
        # Joint ELECTRA training warm-started from a masked LM: the discriminator's encoder starts from
        # ModernBERT's runlocal workdir (init_checkpoint, init_mode "encoder"), generator and heads fresh,
        # both then trained together (not the paper's §3.2 two-stage training, which trains the generator
        # alone first and freezes it); from scratch it learns no context in a CPU budget (docs/records.md,
        # "The runlocal recipes"). So that encoder, AdamW as measured, lr 1e-3, the generator's own tables.
        "runlocal": dict(lr=1e-3, model=dict(size="modernbert-tiny", embedding_size=None, use_pooler=False,
                                             rope_theta=10_000.0),  # as the ModernBERT runlocal it starts from
                         electra=dict(tie_embeddings=False), init_mode="encoder",
                         data=dict(max_seq_length=128, max_predictions_per_seq=38, masked_lm_prob=0.3),
                         optimizer=dict(optimizer="adamw", bias_correction=True, b2=0.98, eps=1e-6,
                                        weight_decay=1e-5, schedule="wsd", decay_steps=150)),
        # scratch: one stage on BERT's tiny encoder, lr 2e-4 with bias correction, 300 steps of which 30
        # warm up (1e-3 collapses the discriminator: docs/records.md, "ELECTRA at small scale"). A smoke
        # run of the pipeline and the step that learns no context; the demo's ELECTRA builds on it.
        "runlocal_scratch": dict(lr=2e-4, model=dict(size="tiny", embedding_size=64, use_pooler=False),
                                 data=dict(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15),
                                 num_train_steps=300,
                                 optimizer=dict(bias_correction=True, num_train_steps=300, warmup_steps=30)),
    },
    # ModernBERT (Warner et al., 2024, §2.2, and its reference code): 30% masking, no NSP, documents
    # packed whole into rows without attention between them (DOC-SENTENCES examples, pack_examples),
    # StableAdamW (per-tensor update clipping, no global clip; weight decay 1e-5 per step at the peak,
    # fully decoupled), b2 0.98, eps 1e-6, warmup-stable-decay; RoPE at 10k on every layer until the
    # context extension (phase 2 sets the global layers' 160k). `modernbert` below applies the phases.
    "modernbert": {
        "all": dict(model=dict(max_position_embeddings=8192, hidden_dropout_prob=0.0, attention_dropout_prob=0.0,
                               rope_theta=10_000.0),
                    data=dict(masked_lm_prob=0.3, masking="dynamic", packing="doc", pack_examples=8,
                              short_seq_prob=0.0),
                    optimizer=dict(optimizer="stableadamw", bias_correction=True, b1=0.9, b2=0.98, eps=1e-6,
                                   weight_decay=1e-5, clip_norm=0.0, schedule="wsd")),
        # 1e-3, its last 150 steps decaying: the tiny model at length 128, 38 predictions (30%).
        "runlocal": dict(lr=1e-3, model=dict(size="modernbert-tiny"),
                         data=dict(max_seq_length=128, max_predictions_per_seq=38),
                         optimizer=dict(decay_steps=150)),
    },
}
# ModernBERT's token counts at 4,608 rows of 1,024 tokens a step (4.7M tokens; the paper's batch-size
# warmup from 768 rows over the first 50B tokens is not done here: docs/family.md). Phase 1: the
# warmup (3B tokens base, 2B large), then 1.7T tokens at length 1,024 at the peak rate, no decay
# (large: 5e-4 for 900B, then 5e-5 for 800B: the paper's roll-back). Phase 2, the context extension,
# continues phase 1's state (its optimizer moments and step): the global layers' RoPE base to 160k,
# 576 rows of 8,192 tokens (the same tokens a step), 250B tokens at the phase's rate, then 50B of
# 1 - sqrt decay: steps are counted on from phase 1's 360k.
MODERNBERT_PHASES = {
    1: dict(length=1024, predictions=308, batch=4608, steps=360_000, decay=0, pack=8, rope=10_000.0),
    2: dict(length=8192, predictions=2458, batch=576, steps=360_000 + 53_000 + 10_600, decay=10_600, pack=32,
            rope=160_000.0),
}
# Per size: warmup steps, phase 1's rate (and its late rate from a step), phase 2's rate and weight decay.
MODERNBERT_SIZES = {
    "base": dict(warmup=640, lr=(8e-4, 3e-4), late=(0.0, 0), weight_decay=(1e-5, 1e-5)),
    "large": dict(warmup=424, lr=(5e-4, 5e-5), late=(5e-5, 190_700), weight_decay=(1e-5, 1e-6)),
}


# The LAMB recipe (You et al., 2019, §4: BERT-large in 8,599 steps) with NVIDIA's published settings
# (DeepLearningExamples, PyTorch BERT). warmup: a fraction of the phase's steps; per_device: the paper's
# rows per TPU v3 core (batch / 2,048 cores: no accumulation on its v3-1024 pod).
LAMB_PHASES = {
    1: dict(batch=65_536, steps=7_038, lr=6e-3, warmup=0.2843, per_device=32),
    2: dict(batch=32_768, steps=1_563, lr=4e-3, warmup=0.128, per_device=16),
}
# NVIDIA's FusedLAMB; decay_power 0.5 is their PolyWarmUpScheduler(degree=0.5).
LAMB_OPTIMIZER = dict(optimizer="lamb", weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0,
                      bias_correction=True, schedule="bert", decay_power=0.5)


def get_config(arg=None):
    args = parse_arg(arg, model="bert", size="", masking="", objective="", phase=1, runlocal=False,
                     scratch=False, synthetic=False, recipe="", per_device=0)
    check(args)
    if args.runlocal and args.model in FAMILY_SIZE_NAMES:  # the recipe's runlocal names the tiny model
        args.size = ""
    args.size = args.size or DEFAULT_SIZE.get(args.model, "base")
    long = args.phase == 2  # the paper's last 10% of the steps, at length 512

    config = ml_collections.ConfigDict()
    config.seed = 0
    # Dropout keys (the seed folded with the step): threefry2x32 draws the same masks on any mesh; rbg
    # (XLA's RngBitGenerator) is faster on TPU, its masks may differ between mesh shapes.
    config.rng_impl = "threefry2x32"
    config.prefetch_batches = 2  # batches placed on the devices ahead, in a background thread
    # M > 0: projections and feed-forward on the real tokens only, rounded up to M per shard (the same
    # numbers as padded; pays where there is padding). One process only.
    config.unpad_multiple = 0
    config.objective = args.objective or DEFAULT_OBJECTIVE.get(args.model, "nsp")
    config.multihost = False  # several processes (a pod slice): jax.distributed with config.distributed
    config.distributed = distributed_config()

    config.model = ml_collections.ConfigDict()
    config.model.size = f"{args.model}-{args.size}" if args.model in FAMILY_SIZE_NAMES else args.size
    config.model.vocab_size = 30522  # set from data.vocab unless the data is synthetic
    config.model.max_position_embeddings = 512
    config.model.dtype = "auto"  # float32 on CPU, bfloat16 on GPU and TPU; parameters stay float32
    config.model.scan_layers = "auto"  # a scan over stacked blocks on TPU (compile time), unrolled on CPU/GPU (speed)
    config.model.remat_policy = "none"
    config.model.attention_impl = "auto"
    config.model.dropout_impl = "auto"
    config.model.hidden_dropout_prob = 0.1
    config.model.attention_dropout_prob = 0.1
    # The family's switches: None keeps the size's value (bert_jax/model/config.py, docs/family.md).
    config.model.embedding_size = config_dict.placeholder(int)
    config.model.share_layers = config_dict.placeholder(bool)
    config.model.position_offset = config_dict.placeholder(int)
    config.model.type_vocab_size = config_dict.placeholder(int)
    config.model.layer_norm_eps = config_dict.placeholder(float)
    config.model.hidden_act = config_dict.placeholder(str)
    config.model.use_pooler = config_dict.placeholder(bool)

    config.data = ml_collections.ConfigDict()
    config.data.kind = "synthetic" if args.synthetic else "pretraining"
    # static: masked once, in the shards (the paper); dynamic: a new mask every epoch (RoBERTa).
    config.data.masking = args.masking or ("static" if args.model == "bert" else "dynamic")
    config.data.input = ""  # set on the command line, as eval_input and vocab (gs:// works)
    config.data.eval_input = ""
    config.data.vocab = ""
    config.data.eval_fraction = 0.0  # > 0 with text input: this fraction of the documents held out
    config.data.format = "bert"
    config.data.max_seq_length = 512 if long else 128
    config.data.max_predictions_per_seq = 80 if long else 20
    config.data.masked_lm_prob = 0.15
    config.data.whole_word_mask = False
    # Some examples shorter than max_seq_length, as fine-tuning inputs are (create_pretraining_data's flag).
    config.data.short_seq_prob = 0.1
    config.data.packing = "full"
    config.data.ngram_mask = 0  # N > 0: spans of n <= N whole words masked, p(n) ~ 1/n (ALBERT: 3)
    config.data.pack_examples = 0  # K > 0: up to K examples a row, attention within each (batch_size counts rows)
    config.data.shuffle_buffer = 10_000
    config.data.seed = 0

    config.batch_size = 256  # global, across all devices and hosts
    # Rows per batch shard in one micro-batch: the step accumulates batch_size / (N x shards) of them,
    # each loss over the whole batch's counts, so one recipe runs on any slice. 0: the whole batch at
    # once; "auto": 8 on a CPU, 0 on GPU/TPU (docs/records.md, "CPU defaults: ..."). A number or "auto".
    config.per_device_batch = config_dict.FieldReference(args.per_device or "auto", field_type=object)
    config.num_train_steps = PAPER_STEPS if long else PHASE1_STEPS
    config.init_checkpoint = ""  # phase 2: phase 1's workdir
    # What init_checkpoint carries over: "state" (phase 2 continues phase 1's schedule) or "params" (a
    # fresh optimizer at step 0).
    config.init_mode = "state"

    # The paper's Adam as in Google's released code (no bias correction), lr 1e-4, 10k warmup steps,
    # linear decay to 0 at step 1M over both phases; weight decay not on LayerNorm or biases.
    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.optimizer = "adamw_bert"  # adamw_bert | adamw | lamb (bert_jax/training/optim.py)
    config.optimizer.learning_rate = 1e-4
    config.optimizer.warmup_steps = 10_000
    config.optimizer.num_train_steps = PAPER_STEPS
    config.optimizer.weight_decay = 0.01
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.clip_norm = 1.0  # global norm; 0 or None: off
    config.optimizer.bias_correction = False
    config.optimizer.schedule = "bert"  # bert: decay from step 0 (Google's); linear: from the end of warmup
    config.optimizer.decay_power = 1.0  # 1: linear decay
    config.optimizer.decay_steps = 0  # schedule "wsd" only: the last N steps decay (1 - sqrt)
    config.optimizer.late_rate = 0.0  # schedule "wsd" only: > 0, the stable rate from late_from_step on
    config.optimizer.late_from_step = 0
    config.optimizer.generator_lr_scale = 1.0  # ELECTRA: the generator's rate over the discriminator's

    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); e.g. (-1, 8, 1): FSDP on a pod slice
    config.sharding_rules = DEFAULT_RULES  # logical axis -> mesh axes (bert_jax/training/sharding.py)
    config.log_every = 100
    config.eval_every = 10_000
    config.eval_steps = 50
    config.checkpoint_every = 5_000
    config.keep_checkpoints = 3
    config.restore = "latest"  # or "previous" (when the newest will not restore) or a step (docs/robustness.md)

    recipe = RECIPES.get(args.model, {})
    update(config, recipe.get("all", {}))
    update(config, recipe.get(args.size, {}))
    if args.runlocal:  # the gensim Wikipedia excerpt and MiniLM's vocabulary, a few CPU minutes
        config.model.size = "tiny"
        config.data.update(input="pkg:wikipedia", vocab="pkg:minilm/vocab.txt", eval_fraction=0.05,
                           masking="dynamic", shuffle_buffer=2_000)
        config.log_every, config.eval_every, config.eval_steps, config.checkpoint_every = 20, 100, 5, 100
        local = dict(recipe["runlocal_scratch" if args.scratch else "runlocal"])
        config.batch_size, config.num_train_steps = 32, 600
        config.optimizer.update(learning_rate=local.pop("lr"), num_train_steps=600, warmup_steps=60)
        update(config, local)
    if args.model == "modernbert" and not args.runlocal:
        modernbert(config, args)
    if args.recipe == "lamb":
        lamb(config, args)
    if args.synthetic:
        config.data.pack_examples = 0  # synthetic batches come padded (the benchmark packs them: --packing K)
    if args.synthetic and args.runlocal:
        config.model.vocab_size = 1000
    return config


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
        raise ValueError(f"phase={args.phase}: expected 1 or 2")
    if args.model not in PHASED and args.phase != 1:
        raise ValueError(f"phase applies to model={' or model='.join(PHASED)}; the {args.model} recipe has one phase")
    if args.recipe not in ("", "lamb"):
        raise ValueError(f"recipe={args.recipe!r}: expected lamb (or leave it out for the paper's Adam)")
    if args.recipe and args.model != "bert":
        raise ValueError(f"recipe=lamb applies to model=bert; the {args.model} recipe has its own optimizer")
    if args.scratch and not (args.model == "electra" and args.runlocal):
        raise ValueError("scratch applies to model=electra,runlocal (ELECTRA's one-stage smoke run); the other "
                         "recipes start from scratch already")
    if args.per_device < 0:
        raise ValueError(f"per_device={args.per_device}: expected rows per device > 0 (0: no accumulation)")


def update(config, settings: dict):
    """``config`` updated from nested ``settings`` (a section's dict updates that section; a new section is added)."""
    for key, value in settings.items():
        if isinstance(value, dict) and key in config:
            update(config[key], value)
        else:
            config[key] = ml_collections.ConfigDict(value) if isinstance(value, dict) else value


def modernbert(config, args):
    """Phase ``args.phase`` of ModernBERT's recipe (`MODERNBERT_PHASES`, `MODERNBERT_SIZES`): phase 2
    continues phase 1's state (``init_checkpoint``, init_mode "state": the optimizer's moments and
    step carry over; the schedule runs on from step 360k at phase 2's rate)."""
    phase, size, i = MODERNBERT_PHASES[args.phase], MODERNBERT_SIZES[args.size], args.phase - 1
    config.data.update(max_seq_length=phase["length"], max_predictions_per_seq=phase["predictions"],
                       pack_examples=phase["pack"])
    config.model.rope_theta = phase["rope"]  # the global layers' base; local layers stay at 10k
    config.batch_size, config.num_train_steps = phase["batch"], phase["steps"]
    config.init_mode = "state"
    late_rate, late_from = size["late"] if args.phase == 1 else (0.0, 0)
    config.optimizer.update(learning_rate=size["lr"][i], num_train_steps=phase["steps"], warmup_steps=size["warmup"],
                            decay_steps=phase["decay"], weight_decay=size["weight_decay"][i], late_rate=late_rate,
                            late_from_step=late_from)


def lamb(config, args):
    """Phase ``args.phase`` of the LAMB recipe (`LAMB_PHASES`, `LAMB_OPTIMIZER`; why these settings:
    docs/records.md, "The LAMB recipe's settings and its phase 2"). runlocal: the tiny model, batch 128
    as 4 micro-batches of 32, 40 steps."""
    phase = LAMB_PHASES[args.phase]
    config.batch_size, config.num_train_steps = phase["batch"], phase["steps"]
    config.per_device_batch = args.per_device or phase["per_device"]
    # Phase 2 starts fresh moments at step 0 on phase 1's parameters: its warmup rebuilds them at length 512.
    config.init_mode = "params" if args.phase == 2 else "state"
    config.optimizer.update(learning_rate=phase["lr"], **LAMB_OPTIMIZER)
    if args.runlocal:
        config.batch_size, config.num_train_steps = 128, 40
        config.per_device_batch = args.per_device or 32
    # Warmup and decay follow num_train_steps: --config.num_train_steps=N keeps the phase's shape.
    steps = config.get_ref("num_train_steps")
    config.optimizer.num_train_steps = steps
    config.optimizer.warmup_steps = (steps * phase["warmup"] + 0.5).to_int()

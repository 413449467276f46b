r"""BERT pre-training (Devlin et al., 2019: MLM + NSP) and its family's recipes (docs/family.md).

Arguments: model and size (`SIZE_NAMES`), masking (static | dynamic), objective (nsp | sop | none), phase
(bert: 1 at length 128 to step 900k, 2 at 512 to 1M; modernbert: 1 at 1,024, 2 at 8,192; phase 2 on phase
1's state), runlocal (the tiny model on a Wikipedia excerpt, CPU minutes; electra: on a ModernBERT runlocal
workdir's encoder), scratch (electra's runlocal in one stage), synthetic (random batches), recipe (lamb),
per_device (rows per device in a micro-batch). docs/pretraining.md: the paper's phases; docs/lamb.md.

    python train.py --config configs/pretrain.py:model=modernbert,runlocal --workdir /tmp/modernbert_tiny
    python train.py --config configs/pretrain.py:model=electra,runlocal --workdir /tmp/electra_tiny \
        --config.init_checkpoint=/tmp/modernbert_tiny
"""

import ml_collections
from ml_collections import config_dict

from bert_jax.config_args import parse_arg
from bert_jax.training.distributed import default_config as distributed_config
from bert_jax.training.sharding_rules import DEFAULT_RULES

BERT_SIZES = ("tiny", "mini", "small", "medium", "base", "large")  # bert_jax/model/config.py's SIZES
SIZE_NAMES = {"bert": BERT_SIZES, "roberta": BERT_SIZES, "albert": ("base", "large", "xlarge", "xxlarge"),
              "electra": ("small", "base", "large"), "modernbert": ("base", "large")}
FAMILY = ("albert", "electra", "modernbert")  # their sizes are named "<model>-<size>" (the size table)


def get_config(arg=None):
    args = parse_arg(arg, model="bert", size="", masking="", objective="", phase=1, runlocal=False,
                     scratch=False, synthetic=False, recipe="", per_device=0)
    check(args)
    if not args.size or (args.runlocal and args.model in FAMILY):  # a family's runlocal names its tiny model
        args.size = {"albert": "base", "electra": "small"}.get(args.model, "base")

    config = ml_collections.ConfigDict()
    config.seed = 0
    config.rng_impl = "threefry2x32"  # dropout masks alike on any mesh; rbg is faster on TPU, mesh-dependent
    config.prefetch_batches = 2  # batches placed on the devices ahead, in a background thread
    config.unpad_multiple = 0  # M > 0: projections and feed-forward on real tokens only (one process)
    config.objective = args.objective or {"roberta": "none", "albert": "sop", "electra": "rtd",
                                          "modernbert": "none"}.get(args.model, "nsp")
    config.multihost = False  # several processes (a pod slice): jax.distributed with config.distributed
    config.distributed = distributed_config()

    config.model = m = ml_collections.ConfigDict()
    m.size = f"{args.model}-{args.size}" if args.model in FAMILY else args.size
    m.vocab_size = 30522  # set from data.vocab unless the data is synthetic
    m.max_position_embeddings = 512
    m.dtype = "auto"  # float32 on CPU, bfloat16 on GPU and TPU; parameters stay float32
    m.scan_layers = "auto"  # scanned on TPU (compile time), unrolled on CPU/GPU (speed)
    m.stacked_params = "auto"  # unrolled over the stacked parameters on GPUs (fewer arrays and kernels)
    m.remat_policy, m.attention_impl, m.dropout_impl = "none", "auto", "auto"
    m.norm_impl = "auto"  # XLA; "fused": the GPU's residual-dropout-LayerNorm kernel
    m.recompute_activation = "auto"  # GELU recomputed in the backward: on CPU and GPU, not TPU (less traffic)
    m.gelu_impl = "auto"  # GELU through erf on GPUs (a fraction of erfc's arithmetic), erfc elsewhere
    m.hidden_dropout_prob = m.attention_dropout_prob = 0.1
    for name, kind in dict(embedding_size=int, share_layers=bool, position_offset=int, type_vocab_size=int,
                           layer_norm_eps=float, hidden_act=str, use_pooler=bool).items():  # None: the size's value
        m[name] = config_dict.placeholder(kind)

    config.data = d = ml_collections.ConfigDict()
    d.kind = "synthetic" if args.synthetic else "pretraining"
    d.masking = args.masking or ("static" if args.model == "bert" else "dynamic")  # static: masked in the shards
    d.input = d.eval_input = d.vocab = ""  # set on the command line (gs:// works)
    d.eval_fraction = 0.0  # > 0 with text input: this fraction of the documents held out
    d.max_seq_length, d.max_predictions_per_seq = (512, 80) if args.phase == 2 else (128, 20)
    d.masked_lm_prob, d.whole_word_mask = 0.15, False
    d.format, d.packing, d.short_seq_prob = "bert", "full", 0.1  # some examples short, as fine-tuning's are
    d.ngram_mask = 0  # N > 0: spans of n <= N whole words masked, p(n) ~ 1/n (ALBERT: 3)
    d.pack_examples = 0  # K > 0: up to K examples a row, attention within each (batch_size counts rows)
    d.shuffle_buffer, d.seed = 10_000, 0

    config.batch_size = 256  # global, across all devices and hosts
    # Rows per batch shard in a micro-batch (0: the whole batch; "auto": 8 on a CPU, 0 on GPU/TPU).
    config.per_device_batch = config_dict.FieldReference(args.per_device or "auto", field_type=object)
    config.num_train_steps = 1_000_000 if args.phase == 2 else 900_000  # 90% at length 128, the rest at 512
    config.init_checkpoint, config.init_mode = "", "state"  # phase 2: phase 1's workdir, its schedule continued

    # Google's released Adam (no bias correction), 10k warmup, linear decay to 0 at 1M over both phases.
    config.optimizer = o = ml_collections.ConfigDict()
    o.optimizer = "adamw_bert"  # adamw_bert | adamw | lamb | stableadamw (bert_jax/training/optim.py)
    o.learning_rate, o.warmup_steps, o.num_train_steps = 1e-4, 10_000, 1_000_000
    o.weight_decay = 0.01  # not on LayerNorm or biases
    o.b1, o.b2, o.eps = 0.9, 0.999, 1e-6
    o.clip_norm, o.bias_correction = 1.0, False  # global-norm clip (0 or None: off); Adam uncorrected
    o.schedule = "bert"  # bert: decay from step 0 (Google's); linear: from the end of warmup
    o.decay_power, o.decay_steps = 1.0, 0  # 1: linear decay; schedule "wsd": the last N steps decay (1 - sqrt)
    o.late_rate, o.late_from_step = 0.0, 0  # schedule "wsd": > 0, the stable rate from that step on
    o.generator_lr_scale = 1.0  # ELECTRA: the generator's rate over the discriminator's

    config.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); e.g. (-1, 8, 1): FSDP on a pod slice
    config.sharding_rules = DEFAULT_RULES  # logical axis -> mesh axes (bert_jax/training/sharding_rules.py)
    config.global_norm = "auto"  # the clip's norm: per_leaf | grouped (fewer kernels; whole parameters only)
    config.xla_options = ""  # the steps' XLA compiler options, "name=value ..." (bert_jax/training/compiler_options.py)
    config.log_every, config.eval_every, config.eval_steps = 100, 10_000, 50
    config.checkpoint_every, config.keep_checkpoints = 5_000, 3
    config.restore = "latest"  # or "previous" or a step (docs/robustness.md)

    if args.model == "roberta":  # Liu et al., 2019, Table 9; Hugging Face's layout, so exports load
        m.position_offset, m.max_position_embeddings, m.type_vocab_size, m.layer_norm_eps = 2, 514, 1, 1e-5
        d.max_seq_length, d.max_predictions_per_seq, d.packing, d.short_seq_prob = 512, 80, "full", 0.0
        config.batch_size, config.num_train_steps, o.num_train_steps = 8192, 500_000, 500_000
        o.update(optimizer="adamw", bias_correction=True, b2=0.98, schedule="linear")
        o.learning_rate, o.warmup_steps = (4e-4, 30_000) if args.size == "large" else (6e-4, 24_000)
    if args.model == "albert":  # Lan et al., 2020, §4.1: LAMB, length 512, n-grams, no dropout (v2)
        m.hidden_dropout_prob = m.attention_dropout_prob = 0.0
        d.max_seq_length, d.max_predictions_per_seq, d.short_seq_prob, d.ngram_mask = 512, 20, 0.1, 3
        config.batch_size, config.num_train_steps = 4096, 125_000
        o.update(optimizer="lamb", learning_rate=0.00176, warmup_steps=3_125, num_train_steps=125_000,
                 bias_correction=True, schedule="linear")
    if args.model == "electra":  # Clark et al., 2020, Table 6: generator 1/4 (1/3 base), MLM + 50 BCE
        config.electra = dict(generator_fraction=1 / 3 if args.size == "base" else 0.25, rtd_weight=50.0,
                              rtd_prior=0.0, tie_embeddings=True)  # prior 0: the output bias starts at 0
        d.packing, o.warmup_steps, d.masked_lm_prob = "full", 10_000, 0.25 if args.size == "large" else 0.15
        length, predictions, batch, steps, lr = {"small": (128, 19, 128, 1_000_000, 5e-4), "base": (
            512, 77, 256, 766_000, 2e-4), "large": (512, 128, 2048, 400_000, 2e-4)}[args.size]
        d.max_seq_length, d.max_predictions_per_seq, config.batch_size = length, predictions, batch
        config.num_train_steps, o.num_train_steps, o.learning_rate = steps, steps, lr
    if args.model == "modernbert":  # Warner et al., 2024, §2.2: 30% masked, documents packed, no dropout
        m.max_position_embeddings, m.rope_theta = 8192, 10_000.0
        m.hidden_dropout_prob = m.attention_dropout_prob = 0.0
        d.update(masked_lm_prob=0.3, masking="dynamic", packing="doc", pack_examples=8, short_seq_prob=0.0)
        o.update(optimizer="stableadamw", bias_correction=True, b2=0.98, weight_decay=1e-5, clip_norm=0.0,
                 schedule="wsd")  # per-tensor update clipping, decay fully decoupled, warmup-stable-decay
    if args.runlocal:  # the gensim Wikipedia excerpt and MiniLM's vocabulary, a few CPU minutes
        runlocal(config, args)
    elif args.model == "modernbert":
        modernbert_phase(config, args)
    if args.recipe == "lamb":
        lamb(config, args)
    if args.synthetic:  # batches come padded (the benchmark packs them: --packing K); runlocal's vocabulary small
        d.pack_examples, m.vocab_size = 0, 1000 if args.runlocal else m.vocab_size
    return config


def runlocal(c, args):
    """Batch 32, 600 steps (ModernBERT 1,000), 10% warmup; each recipe's rate and size (docs/records.md,
    "The runlocal recipes")."""
    m, d, o = c.model, c.data, c.optimizer
    m.size, c.batch_size, c.num_train_steps = "tiny", 32, 600
    d.update(input="pkg:wikipedia", vocab="pkg:minilm/vocab.txt", eval_fraction=0.05, masking="dynamic",
             shuffle_buffer=2_000)
    c.log_every, c.eval_every, c.eval_steps, c.checkpoint_every = 20, 100, 5, 100
    o.learning_rate, o.num_train_steps, o.warmup_steps = 2e-3 if args.model == "albert" else 1e-3, 600, 60
    if args.model == "bert":  # without bias correction the tiny model collapses ("Why runlocal collapsed")
        o.bias_correction = True
    if args.model in ("roberta", "albert"):
        d.max_seq_length, d.max_predictions_per_seq = 128, 20
    if args.model == "albert":  # Adam at 2e-3: LAMB at batch 32 stays at the unigram baseline
        o.optimizer, m.size, m.embedding_size, m.share_layers, m.hidden_act = "adamw", "tiny", 64, True, "gelu_new"
    if args.model == "electra" and args.scratch:  # one stage, tiny BERT; 1e-3 collapses the discriminator
        o.learning_rate, c.num_train_steps, o.num_train_steps, o.warmup_steps = 2e-4, 300, 300, 30
        m.size, m.embedding_size, m.use_pooler, o.bias_correction = "tiny", 64, False, True
        d.max_seq_length, d.max_predictions_per_seq, d.masked_lm_prob = 128, 20, 0.15
    elif args.model == "electra":  # joint training from ModernBERT's runlocal encoder; lr 1.5e-3 (1e-3: AUC 0.749)
        c.init_mode, c.electra.tie_embeddings, o.learning_rate = "encoder", False, 1.5e-3
        m.size, m.embedding_size, m.use_pooler, m.rope_theta = "modernbert-tiny", None, False, 10_000.0
        d.max_seq_length, d.max_predictions_per_seq, d.masked_lm_prob = 128, 38, 0.3
        o.update(optimizer="adamw", bias_correction=True, b2=0.98, weight_decay=1e-5, schedule="wsd", decay_steps=150)
    if args.model == "modernbert":  # 1e-3, its last 150 steps decaying: length 128, 38 predictions (30%)
        m.size, d.max_seq_length, d.max_predictions_per_seq, o.decay_steps = "modernbert-tiny", 128, 38, 150
        # 1,000 steps: its paper's recipe reaches at 1,000 what AdamW reached at 600 (4.1x the unigram baseline)
        c.num_train_steps, o.num_train_steps, o.warmup_steps = 1000, 1000, 100


def modernbert_phase(c, args):
    """Phase 1: 4,608 x 1,024 tokens a step, no decay; 2: 576 x 8,192 on 1's state, 250B tokens + 50B decaying."""
    large, two, d, o = args.size == "large", args.phase == 2, c.data, c.optimizer
    d.max_seq_length, d.max_predictions_per_seq, d.pack_examples = (8192, 2458, 32) if two else (1024, 308, 8)
    c.model.rope_theta = 160_000.0 if two else 10_000.0  # the global layers' base; local layers stay at 10k
    c.batch_size, c.num_train_steps = (576, 360_000 + 53_000 + 10_600) if two else (4608, 360_000)
    o.learning_rate = [[8e-4, 3e-4], [5e-4, 5e-5]][large][two]
    o.num_train_steps, o.warmup_steps, o.decay_steps = c.num_train_steps, 424 if large else 640, 10_600 * two
    o.weight_decay = 1e-6 if large and two else 1e-5
    o.late_rate, o.late_from_step = (5e-5, 190_700) if large and not two else (0.0, 0)


def lamb(c, args):
    """You et al., 2019, §4, NVIDIA's settings (docs/records.md); per_device: the paper's rows per TPU v3 core."""
    two = args.phase == 2
    c.batch_size, c.num_train_steps = (32_768, 1_563) if two else (65_536, 7_038)
    c.per_device_batch, c.init_mode = args.per_device or (16 if two else 32), "params" if two else "state"
    # Phase 2 (init_mode "params"): fresh moments at step 0 on phase 1's weights, rewarmed at length 512.
    c.optimizer.update(learning_rate=4e-3 if two else 6e-3, optimizer="lamb", weight_decay=0.01, b1=0.9, b2=0.999,
                       eps=1e-6, clip_norm=1.0, bias_correction=True, schedule="bert",
                       decay_power=0.5)  # NVIDIA's PolyWarmUpScheduler(degree=0.5)
    if args.runlocal:  # the tiny model, batch 128 as 4 micro-batches of 32, 40 steps
        c.batch_size, c.num_train_steps, c.per_device_batch = 128, 40, args.per_device or 32
    steps = c.get_ref("num_train_steps")  # --config.num_train_steps=N keeps the phase's shape
    c.optimizer.num_train_steps, c.optimizer.warmup_steps = steps, (steps * (0.128 if two else 0.2843) + 0.5).to_int()


def check(a):
    """One line for the first argument out of range."""
    sizes = SIZE_NAMES.get(a.model, ())
    for wrong, message in (
            (a.model not in SIZE_NAMES, f"model={a.model!r}: expected one of {tuple(SIZE_NAMES)}"),
            (a.size and a.size not in sizes and not (a.runlocal and a.size == "tiny"),
             f"size={a.size!r} for model={a.model}: expected one of {sizes}"),
            (a.runlocal and a.size not in ("", "tiny"),  # never trained silently in place of the size asked for
             f"size={a.size} with runlocal: runlocal trains the tiny model; leave out size= (or drop runlocal)"),
            (a.phase not in (1, 2) or (a.model not in ("bert", "modernbert") and a.phase != 1),
             f"phase={a.phase}: expected 1 or 2 with model=bert or modernbert (the {a.model} recipe has one phase)"),
            (a.recipe not in ("", "lamb"), f"recipe={a.recipe!r}: expected lamb (or none: the paper's Adam)"),
            (a.recipe and a.model != "bert", f"recipe=lamb applies to model=bert; {a.model} has its own optimizer"),
            (a.scratch and not (a.model == "electra" and a.runlocal), "scratch applies to model=electra,runlocal"),
            (a.per_device < 0, f"per_device={a.per_device}: expected rows per device > 0 (0: no accumulation)")):
        if wrong:
            raise ValueError(message)

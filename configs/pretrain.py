r"""BERT pre-training (Devlin et al., 2019), MLM + NSP by default, and its family's recipes.

Named arguments: ``model`` (bert | roberta | albert | electra: the recipe, see `RECIPES` and
docs/family.md), ``size`` (bert/roberta: tiny | mini | small | medium | base | large; albert: base |
large | xlarge | xxlarge; electra: small | base | large), ``masking`` (static |
dynamic), ``objective`` (nsp | sop | none), ``phase`` (1: length 128 for 90% of the steps;
2: length 512 for the last 10%, continuing phase 1's state and learning-rate schedule),
``runlocal`` (tiny data, few steps, CPU), ``synthetic`` (random batches: smoke tests, benchmarks),
``recipe`` (lamb: the large-batch LAMB recipe of You et al. 2019 for model=bert, phases 1 and 2, see
`lamb`), ``per_device`` (rows per device and micro-batch; the recipe accumulates the rest).

Local smoke run on the gensim Wikipedia excerpt (CPU, a few minutes):

    python train.py --config configs/pretrain.py:size=tiny,runlocal --workdir /tmp/bert_tiny

The paper on a Cloud TPU (batch 256, 1M steps; data prepared as in docs/data.md, see docs/tpu.md):

    python train.py --config configs/pretrain.py:size=base,phase=1 --workdir gs://BUCKET/bert_base_p1 \
        --config.data.input='gs://BUCKET/data/p1/*.tfrecord' --config.data.vocab=gs://BUCKET/vocab.txt
    python train.py --config configs/pretrain.py:size=base,phase=2 --workdir gs://BUCKET/bert_base_p2 \
        --config.init_checkpoint=gs://BUCKET/bert_base_p1 \
        --config.data.input='gs://BUCKET/data/p2/*.tfrecord' --config.data.vocab=gs://BUCKET/vocab.txt

The family on the same Wikipedia excerpt (CPU, a few minutes each; ``size`` is ignored with runlocal):

    python train.py --config configs/pretrain.py:model=roberta,runlocal --workdir /tmp/roberta_tiny
    python train.py --config configs/pretrain.py:model=albert,runlocal --workdir /tmp/albert_tiny
    python train.py --config configs/pretrain.py:model=electra,size=small,runlocal --workdir /tmp/electra_tiny

BERT-large in 8,599 LAMB steps (batch 64k at length 128, then 32k at 512; the pod commands in docs/tpu.md):

    python train.py --config configs/pretrain.py:size=large,recipe=lamb,phase=1 --workdir gs://BUCKET/lamb_p1 ...
    python train.py --config configs/pretrain.py:size=large,recipe=lamb,phase=2 --workdir gs://BUCKET/lamb_p2 \
        --config.init_checkpoint=gs://BUCKET/lamb_p1 ...
    # a few CPU steps of the same recipe on the tiny model:
    python train.py --config configs/pretrain.py:size=tiny,recipe=lamb,phase=1,runlocal,synthetic \
        --workdir /tmp/lamb_p1 --config.num_train_steps=4
"""

import ml_collections
from ml_collections import config_dict

from bert_jax.config_args import parse_arg
from bert_jax.training.distributed import default_config as distributed_config
from bert_jax.training.sharding import DEFAULT_RULES

PAPER_STEPS = 1_000_000
PHASE1_STEPS = 900_000  # 90% at length 128, then 10% at 512 on the same schedule
MODELS = ("bert", "roberta", "albert", "electra")
# The LAMB recipe (You et al., 2019, §4: BERT-large, 8,599 steps in all) with NVIDIA's published
# settings for it (DeepLearningExamples, PyTorch BERT: phase 1 lr 6e-3 with 28.43% warmup of 7,038
# steps, phase 2 lr 4e-3 with 12.8% of 1,563). per_device: the paper's rows per TPU v3 core (batch /
# 2,048 cores, no accumulation on its v3-1024 pod); other slices accumulate the rest.
LAMB_PHASES = {
    1: dict(batch=65_536, steps=7_038, lr=6e-3, warmup=0.2843, per_device=32),
    2: dict(batch=32_768, steps=1_563, lr=4e-3, warmup=0.128, per_device=16),
}
FAMILY_SIZE_NAMES = {"albert": ("base", "large", "xlarge", "xxlarge"), "electra": ("small", "base", "large")}


def get_config(arg=None):
    args = parse_arg(arg, model="bert", size="", masking="", objective="", phase=1, runlocal=False,
                     synthetic=False, recipe="", per_device=0)
    if args.model not in MODELS:
        raise ValueError(f"model={args.model!r}: expected one of {MODELS}")
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
    args.size = args.size or {"albert": "base", "electra": "small"}.get(args.model, "base")
    args.masking = args.masking or ("static" if args.model == "bert" else "dynamic")
    args.objective = args.objective or {"roberta": "none", "albert": "sop", "electra": "rtd"}.get(args.model, "nsp")
    sizes = FAMILY_SIZE_NAMES.get(args.model)
    if sizes and args.size not in sizes:
        raise ValueError(f"size={args.size!r} for model={args.model}: expected one of {sizes}")
    c = ml_collections.ConfigDict()
    c.seed = 0
    # PRNG of the dropout keys (seed folded with the step). threefry2x32: the same masks on every
    # mesh; rbg: XLA's RngBitGenerator (what TPU codebases use for speed; no measurable difference on
    # the 2-core CPU, docs/benchmarks.md), masks may differ between mesh shapes. Not part of
    # checkpoints: it can change between runs.
    c.rng_impl = "threefry2x32"
    # Host-to-device prefetch: read (and pack) the next batches and place them on the devices in a
    # background thread while the step runs (bert_jax/training/prefetch.py); 0 = in the loop. Same batches,
    # same order, either way.
    c.prefetch_batches = 2
    # Unpadded steps: M > 0 runs the transformer blocks' projections and feed-forward on the real
    # tokens only (attention keeps its [batch, length] form), the token count rounded up to a multiple
    # of M per data-parallel shard; every new count compiles the step once more. Same numbers as
    # padded (up to dropout masks); pays off with padding (docs/benchmarks.md). Single process only.
    c.unpad_multiple = 0
    # Host memory on CPU backends (bert_jax/training/host_memory.py, read by train.py before JAX starts):
    # "reuse" keeps freed buffers mapped, so the step's buffers are not page-faulted in again every
    # step (BERT-base batch 8: 1.1-1.3x faster), but the process holds (and fragments) its peak
    # memory; "auto" reuses only when JAX runs on the CPU; "default" leaves glibc's malloc as it is.
    c.reuse_host_memory = "default"
    # "auto": on a CPU backend train.py re-executes itself once so that glibc maps large buffers in
    # transparent huge pages (~100x fewer page faults measured on a 256 MiB buffer, same memory; BERT-base
    # batch 8: 1.09x faster; bert_jax/training/host_memory.py); "off": as started.
    c.host_huge_pages = "auto"
    c.objective = args.objective
    # True on a pod slice or any job of several processes: jax.distributed.initialize() with
    # c.distributed (empty fields are auto-detected on Cloud TPU; bert_jax/training/distributed.py).
    c.multihost = False
    c.distributed = distributed_config()

    c.family = args.model
    c.model = ml_collections.ConfigDict(dict(
        size=f"{args.model}-{args.size}" if sizes else args.size,
        vocab_size=30522,  # vocab_size comes from data.vocab unless data is synthetic
        max_position_embeddings=512, dtype="auto", scan_layers="auto", remat_policy="none",
        attention_impl="auto", dropout_impl="auto", hidden_dropout_prob=0.1, attention_dropout_prob=0.1,
        # The family's switches (bert_jax/model/config.py; None = the size's value, docs/family.md).
        embedding_size=config_dict.placeholder(int), share_layers=config_dict.placeholder(bool),
        position_offset=config_dict.placeholder(int), type_vocab_size=config_dict.placeholder(int),
        layer_norm_eps=config_dict.placeholder(float), hidden_act=config_dict.placeholder(str),
        use_pooler=config_dict.placeholder(bool)))

    long = args.phase == 2
    c.data = ml_collections.ConfigDict(dict(
        kind="synthetic" if args.synthetic else "pretraining",
        masking=args.masking,  # static: pre-masked TFRecords; dynamic: a new mask every epoch
        input="", eval_input="", vocab="",  # set on the command line (gs:// works)
        eval_fraction=0.0,  # >0 with text input: hold out this fraction of documents for eval
        format="bert", max_seq_length=512 if long else 128, max_predictions_per_seq=80 if long else 20,
        masked_lm_prob=0.15, whole_word_mask=False, short_seq_prob=0.1, packing="full",
        # ALBERT's n-gram masking (dynamic masking and text input): N > 0 masks spans of n <= N whole
        # words, p(n) proportional to 1/n (ALBERT used 3); 0: off (tokens, or whole_word_mask).
        ngram_mask=0,
        # Sequence packing: up to K masked examples per row (attention only within an example,
        # positions restarting, NSP/SOP per example); batch_size then counts rows. 0: one per row,
        # as in the paper. docs/benchmarks.md measures what it saves.
        pack_examples=0,
        shuffle_buffer=10_000, seed=0))

    c.batch_size = 256  # global, across all devices and hosts
    # "N" > 0: rows per batch shard (data x fsdp devices) in one micro-batch; the step then accumulates
    # batch_size / (per_device_batch x shards) micro-batches (bert_jax/training/trainer.py), each
    # dividing its loss by the whole batch's counts (the same gradient as one batch). "0": none
    # (optimizer.accumulation_steps as given). "auto": micro-batches of 8 rows on the CPU, where they
    # measured faster (docs/benchmarks.md), none on GPU/TPU (bert_jax/model/execution.py).
    c.per_device_batch = str(args.per_device) if args.per_device else "auto"
    c.num_train_steps = PAPER_STEPS if long else PHASE1_STEPS
    c.init_checkpoint = ""  # phase 2: phase 1's workdir
    # What init_checkpoint carries over: "state" (parameters, optimizer state and step: the paper's
    # phase 2 continues phase 1's schedule) or "params" (parameters only: a fresh optimizer at step 0).
    c.init_mode = "state"
    # The paper's optimizer: Adam without bias correction as in the released code (see
    # bert_jax/training/optim.py), lr 1e-4, 10k warmup, linear decay to 0 at step 1M over both phases.
    c.optimizer = ml_collections.ConfigDict(dict(
        optimizer="adamw_bert", learning_rate=1e-4, warmup_steps=10_000, num_train_steps=PAPER_STEPS,
        weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0, bias_correction=False,
        schedule="bert", decay_power=1.0, accumulation_steps=1))

    c.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); e.g. (-1, 8, 1) for FSDP on a pod slice
    c.sharding_rules = DEFAULT_RULES  # logical axis -> mesh axes (bert_jax/training/sharding.py)
    c.log_every = 100
    c.eval_every = 10_000
    c.eval_steps = 50
    c.checkpoint_every = 5_000
    c.keep_checkpoints = 3
    # Which checkpoint of the workdir a re-run resumes from: "latest", "previous" (the one before the
    # newest, e.g. when the newest will not restore; newer ones are moved to checkpoints_set_aside/)
    # or a step number. docs/robustness.md.
    c.restore = "latest"

    if args.runlocal:
        c.model.size = "tiny"
        c.data.update(input="pkg:wikipedia", vocab="pkg:minilm/vocab.txt", eval_fraction=0.05,
                      masking="dynamic", shuffle_buffer=2_000)
        c.batch_size = 32
        c.num_train_steps = 300
        c.optimizer.update(learning_rate=1e-3, warmup_steps=30, num_train_steps=300)
        c.log_every, c.eval_every, c.eval_steps, c.checkpoint_every = 20, 100, 5, 100
    if args.model != "bert":
        RECIPES[args.model](c, args)
    if args.recipe == "lamb":
        lamb(c, args)
    if args.synthetic:
        c.data.kind = "synthetic"
        if args.runlocal:
            c.model.vocab_size = 1000
    return c


def lamb(c, args):
    """Large-batch pre-training with LAMB (You et al., 2019, §4 and Table 1: BERT-large on a TPU v3
    pod in 76 minutes, SQuAD 1.1 F1 90.58): phase 1 batch 65,536 at length 128 for 7,038 steps,
    phase 2 batch 32,768 at length 512 for 1,563 steps (`LAMB_PHASES`).

    Settings as NVIDIA's DeepLearningExamples publish and run them (PyTorch BERT:
    ``scripts/run_pretraining.sh`` and ``run_pretraining.py``): FusedLAMB with b1 0.9, b2 0.999,
    eps 1e-6, bias correction, weight decay 0.01 (not on LayerNorm or biases), global-norm clip 1.0;
    lr 6e-3 / 4e-3 warmed up over 28.43% / 12.8% of each phase's steps, then
    ``PolyWarmUpScheduler``'s decay ``(1 - t / N) ** 0.5`` from step 0 (``degree=0.5`` in their
    ``schedulers.py``: `decay_power` 0.5 here; the paper's Adam keeps 1, linear). The trust ratio is
    one per layer and matrix (bert_jax/training/trust_ratio.py).

    Phase 2 is its own run on phase 1's parameters: step 0, its own warmup from 0 and schedule,
    ``init_mode="params"``: the optimizer moments start fresh. NVIDIA's script instead loads phase
    1's optimizer state and resets only its step, lr, warmup and total (so the moments of length
    128 carry over, and bias correction restarts on them). Fresh moments are what the phase-2 warmup
    from 0 is there to rebuild, at length 512 where the gradients differ from phase 1's, and they
    keep phase 2 independent of the optimizer phase 1 ran (a checkpoint of the paper's Adam recipe
    starts phase 2 as well); with bias correction, the first steps are not biased toward 0.

    Gradient accumulation follows from the slice: ``per_device_batch`` rows per device (default
    the paper's per-core rows on its v3 pod: no accumulation there; 16 micro-batches of 32 on a
    v4-128 in phase 1), ``batch_size / (per_device_batch x batch shards)`` micro-batches per step;
    a batch that does not divide is an error naming the numbers. ``runlocal``: the tiny model on
    the Wikipedia excerpt, batch 128 as 4 micro-batches of 32 on one CPU, 40 steps."""
    p = LAMB_PHASES[args.phase]
    c.batch_size, c.num_train_steps = p["batch"], p["steps"]
    c.per_device_batch = str(args.per_device or p["per_device"])
    c.init_mode = "params" if args.phase == 2 else "state"
    c.optimizer.update(optimizer="lamb", learning_rate=p["lr"], weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6,
                       clip_norm=1.0, bias_correction=True, schedule="bert", decay_power=0.5)
    if args.runlocal:
        c.batch_size, c.num_train_steps = 128, 40
        c.per_device_batch = str(args.per_device or 32)
    # Warmup and decay follow num_train_steps (--config.num_train_steps=N keeps the phase's shape).
    steps = c.get_ref("num_train_steps")
    c.optimizer.num_train_steps = steps
    c.optimizer.warmup_steps = (steps * p["warmup"] + 0.5).to_int()


def roberta(c, args):
    """RoBERTa (Liu et al., 2019, Table 9): dynamic masking, no NSP, FULL-SENTENCES at length 512,
    batch 8k, 500k steps, Adam (bias-corrected) b2 0.98 eps 1e-6; lr 6e-4 / warmup 24k for base,
    4e-4 / 30k for large. Hugging Face's layout: positions after the padding id, one token type,
    LayerNorm eps 1e-5 (so exports load as RobertaModel)."""
    c.model.update(position_offset=2, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)
    lr, warmup = (4e-4, 30_000) if args.size == "large" else (6e-4, 24_000)
    c.data.update(max_seq_length=512, max_predictions_per_seq=80, packing="full", short_seq_prob=0.0)
    c.batch_size, c.num_train_steps = 8192, 500_000
    c.optimizer.update(optimizer="adamw", bias_correction=True, learning_rate=lr, warmup_steps=warmup,
                       num_train_steps=500_000, b2=0.98, eps=1e-6, schedule="linear")
    if args.runlocal:
        c.data.update(max_seq_length=128, max_predictions_per_seq=20)
        _runlocal(c, lr=1e-3)


def albert(c, args):
    """ALBERT (Lan et al., 2020, §4.1): factorised embeddings E = 128, one shared block, sentence-order
    prediction, n-gram masking (n ≤ 3), LAMB with lr 0.00176, batch 4096, 125k steps at length 512
    (10% shorter), 3,125 warmup steps (as the released code), no dropout (as the v2 release)."""
    c.model.update(hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
    c.data.update(max_seq_length=512, max_predictions_per_seq=20, short_seq_prob=0.1)
    if "ngram_mask" in c.data:
        c.data.ngram_mask = 3
    c.batch_size, c.num_train_steps = 4096, 125_000
    c.optimizer.update(optimizer="lamb", learning_rate=0.00176, warmup_steps=3_125, num_train_steps=125_000,
                       b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, bias_correction=True, schedule="linear")
    if args.runlocal:
        c.model.update(size="tiny", embedding_size=64, share_layers=True, hidden_act="gelu_new")
        c.data.update(max_seq_length=128, max_predictions_per_seq=20)
        _runlocal(c, lr=2e-3)


def electra(c, args):
    """ELECTRA (Clark et al., 2020, Table 6): replaced-token detection, generator 1/4 of the
    discriminator (1/3 for base), loss MLM + 50 · BCE, dynamic masking of 15% (25% for large),
    Adam lr 5e-4 (small) / 2e-4, batch 128 / 256 / 2048, 1M / 766k / 400k steps, 10k warmup,
    length 128 for small, 512 otherwise.

    ``runlocal``: the tiny discriminator (E = 64) for 300 steps at lr 2e-4 with Adam bias correction
    and 30 warmup steps, not the family's runlocal lr 1e-3 without it: that collapses (every token
    the same last-layer vector within 25 steps, held-out AUC 0.50): without bias correction Adam's
    first updates are (1 - 0.9^t) / sqrt(1 - 0.999^t) times a corrected one's (5.6x at step 30, the
    end of the warmup), so lr 1e-3 steps like ~5e-3 there. Chosen on held-out AUC (0.87 at step 300)
    among 10 settings (docs/choices.md, "ELECTRA at small scale")."""
    size = args.size
    c.electra = ml_collections.ConfigDict(dict(generator_fraction=1 / 3 if size == "base" else 0.25,
                                               rtd_weight=50.0))
    steps = {"small": 1_000_000, "base": 766_000, "large": 400_000}[size]
    length = 128 if size == "small" else 512
    c.data.update(max_seq_length=length, max_predictions_per_seq=round(length * (0.25 if size == "large" else 0.15)),
                  masked_lm_prob=0.25 if size == "large" else 0.15, packing="full")
    c.batch_size, c.num_train_steps = {"small": 128, "base": 256, "large": 2048}[size], steps
    c.optimizer.update(learning_rate=5e-4 if size == "small" else 2e-4, warmup_steps=10_000, num_train_steps=steps)
    if args.runlocal:
        c.model.update(size="tiny", embedding_size=64, use_pooler=False)
        c.data.update(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15)
        _runlocal(c, lr=2e-4)
        c.optimizer.bias_correction = True  # lr 1e-3 / no bias correction collapses (docstring)


def _runlocal(c, *, lr: float):
    """The family's CPU variant: the runlocal schedule with the recipe's own optimizer."""
    c.batch_size, c.num_train_steps = 32, 300
    c.optimizer.update(learning_rate=lr, warmup_steps=30, num_train_steps=300)


RECIPES = {"roberta": roberta, "albert": albert, "electra": electra}

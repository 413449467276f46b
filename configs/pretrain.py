r"""BERT pre-training (Devlin et al., 2019), MLM + NSP by default.

Named arguments: ``size`` (tiny | mini | small | medium | base | large), ``masking`` (static |
dynamic), ``objective`` (nsp | sop | none), ``phase`` (1: length 128 for 90% of the steps;
2: length 512 for the last 10%, continuing phase 1's state and learning-rate schedule),
``runlocal`` (tiny data, few steps, CPU), ``synthetic`` (random batches: smoke tests, benchmarks).

Local smoke run on the gensim Wikipedia excerpt (CPU, a few minutes):

    python train.py --config configs/pretrain.py:size=tiny,runlocal --workdir /tmp/bert_tiny

The paper on a Cloud TPU (batch 256, 1M steps; data prepared as in docs/data.md, see docs/tpu.md):

    python train.py --config configs/pretrain.py:size=base,phase=1 --workdir gs://BUCKET/bert_base_p1 \
        --config.data.input='gs://BUCKET/data/p1/*.tfrecord' --config.data.vocab=gs://BUCKET/vocab.txt
    python train.py --config configs/pretrain.py:size=base,phase=2 --workdir gs://BUCKET/bert_base_p2 \
        --config.init_checkpoint=gs://BUCKET/bert_base_p1 \
        --config.data.input='gs://BUCKET/data/p2/*.tfrecord' --config.data.vocab=gs://BUCKET/vocab.txt
"""

import ml_collections

from bert_jax.config_args import parse_arg
from bert_jax.training.distributed import default_config as distributed_config
from bert_jax.training.sharding import DEFAULT_RULES

PAPER_STEPS = 1_000_000
PHASE1_STEPS = 900_000  # 90% at length 128, then 10% at 512 on the same schedule


def get_config(arg=None):
    args = parse_arg(arg, size="base", masking="static", objective="nsp", phase=1, runlocal=False,
                     synthetic=False)
    if args.phase not in (1, 2):
        raise ValueError(f"phase={args.phase}: expected 1 (length 128) or 2 (length 512)")
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
    c.objective = args.objective
    # True on a pod slice or any job of several processes: jax.distributed.initialize() with
    # c.distributed (empty fields are auto-detected on Cloud TPU; bert_jax/training/distributed.py).
    c.multihost = False
    c.distributed = distributed_config()

    c.model = ml_collections.ConfigDict(dict(
        size=args.size, vocab_size=30522,  # vocab_size comes from data.vocab unless data is synthetic
        max_position_embeddings=512, dtype="float32", scan_layers=True, remat_policy="none",
        attention_impl="auto", hidden_dropout_prob=0.1, attention_dropout_prob=0.1))

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
    c.num_train_steps = PAPER_STEPS if long else PHASE1_STEPS
    c.init_checkpoint = ""  # phase 2: phase 1's workdir (state, optimizer and step carry over)
    # The paper's optimizer: Adam without bias correction as in the released code (see
    # bert_jax/training/optim.py), lr 1e-4, 10k warmup, linear decay to 0 at step 1M over both phases.
    c.optimizer = ml_collections.ConfigDict(dict(
        optimizer="adamw_bert", learning_rate=1e-4, warmup_steps=10_000, num_train_steps=PAPER_STEPS,
        weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0, bias_correction=False,
        schedule="bert", accumulation_steps=1))

    c.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); e.g. (-1, 8, 1) for FSDP on a pod slice
    c.sharding_rules = DEFAULT_RULES  # logical axis -> mesh axes (bert_jax/training/sharding.py)
    c.log_every = 100
    c.eval_every = 10_000
    c.eval_steps = 50
    c.checkpoint_every = 5_000
    c.keep_checkpoints = 3

    if args.runlocal:
        c.model.size = "tiny"
        c.data.update(input="pkg:wikipedia", vocab="pkg:minilm/vocab.txt", eval_fraction=0.05,
                      masking="dynamic", shuffle_buffer=2_000)
        c.batch_size = 32
        c.num_train_steps = 300
        c.optimizer.update(learning_rate=1e-3, warmup_steps=30, num_train_steps=300)
        c.log_every, c.eval_every, c.eval_steps, c.checkpoint_every = 20, 100, 5, 100
    if args.synthetic:
        c.data.kind = "synthetic"
        if args.runlocal:
            c.model.vocab_size = 1000
    return c

r"""What every fine-tuning config shares: configs/glue.py, squad.py, ner.py and sentiment.py load this
and add their ``task`` section. The paper's recipe (Devlin et al., 2019, §4 and A.3; Google's
run_classifier.py and run_squad.py): Adam with weight decay 0.01 and no bias correction, a warmup over
the first 10% of the steps then a linear decay to 0, global-norm clip 1.0, dropout 0.1.

Named arguments: size (from scratch only: the shapes otherwise come from init_checkpoint), lr, batch,
epochs, length (max_seq_length), runlocal (the tiny model, batch 8, 20 steps: smoke runs and tests).

    python train.py --config configs/glue.py:task=mrpc --workdir /tmp/mrpc --config.task.source=/data/glue
"""

import ml_collections

from bert_jax.config_args import parse_arg
from bert_jax.training.distributed import default_config as distributed_config
from bert_jax.training.sharding_rules import DEFAULT_RULES


def get_config(arg=None):
    args = parse_arg(arg, size="base", lr=5e-5, batch=32, epochs=3.0, length=128, runlocal=False)
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.rng_impl = "threefry2x32"  # dropout keys: threefry2x32 | rbg | unsafe_rbg (configs/pretrain.py)
    config.seeds = 1  # N > 1: restarts with seeds seed ... seed+N-1, summarised in results.json
    config.multihost = False  # several processes: as configs/pretrain.py
    config.distributed = distributed_config()
    # "": from scratch; a pre-training workdir, orbax:DIR, hf:DIR or tf:PREFIX (the encoder).
    config.init_checkpoint = ""
    config.vocab = ""  # "": the init_checkpoint's vocabulary

    # The shapes come from init_checkpoint (size only matters from scratch); the rest are execution
    # settings applied on top of the checkpoint's config.
    config.model = ml_collections.ConfigDict()
    config.model.size = args.size
    config.model.dtype = "auto"
    config.model.scan_layers = "auto"
    config.model.stacked_params = "auto"
    config.model.remat_policy = "none"
    config.model.attention_impl = "auto"
    config.model.dropout_impl = "auto"
    config.model.norm_impl = "auto"
    config.model.recompute_activation = "auto"
    config.model.gelu_impl = "auto"
    config.model.hidden_dropout_prob = 0.1
    config.model.attention_dropout_prob = 0.1
    # Sequence classifiers read the pooled [CLS] ("cls", the paper) or the mean of the last layer over
    # the real tokens ("mean").
    config.model.classifier_pooling = "cls"

    config.max_seq_length = args.length
    config.length_multiple = 32  # each batch cut to its longest row, rounded up to this
    # M > 0: the blocks run on the real tokens only, counts rounded up to M per data shard (the same
    # outputs, each new count compiles once; docs/records.md, "Fine-tuning on real lengths"). 0: padded.
    config.unpad_multiple = 64
    config.eval_by_length = False  # True: evaluation batches of rows longest first (the same predictions)
    config.length_groups = 0  # G > 0: training batches from groups of G batches sorted by length
    config.batch_size = args.batch
    # Rows per batch shard in one micro-batch, as in pre-training (the step accumulates batch_size /
    # (N x shards) of them; needs unpad_multiple=0). 0: the whole batch at once.
    config.per_device_batch = 0
    config.eval_batch_size = 64
    config.num_train_epochs = args.epochs
    config.num_train_steps = 0  # > 0 replaces num_train_epochs
    config.max_train_examples = 0  # > 0: only the first N training examples (learning curves, smoke runs)
    config.max_eval_examples = 0

    # Google's AdamWeightDecayOptimizer (bias_correction=True: textbook AdamW), as in pre-training.
    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.optimizer = "adamw_bert"
    config.optimizer.learning_rate = args.lr
    config.optimizer.warmup_fraction = 0.1  # of the run's steps (the trainer sets warmup_steps from it)
    config.optimizer.weight_decay = 0.01
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.clip_norm = 1.0
    config.optimizer.bias_correction = False
    config.optimizer.schedule = "bert"
    config.optimizer.decay_power = 1.0  # 1: linear decay
    config.optimizer.decay_steps = 0  # schedule "wsd" only: the last N steps decay (1 - sqrt)
    config.optimizer.late_rate = 0.0  # schedule "wsd" only: a later stable rate (pre-training's)
    config.optimizer.late_from_step = 0
    config.optimizer.generator_lr_scale = 1.0  # ELECTRA pre-training's; no generator here

    config.predict_splits = ()  # also write predictions for these (("test",): GLUE submission files)
    config.eval_every = 0  # steps; 0: evaluate once, at the end
    config.log_every = 50
    config.checkpoint_every = 1000
    config.keep_checkpoints = 1
    config.restore = "latest"  # or "previous" or a step: the checkpoint a re-run resumes from (docs/robustness.md)
    config.progress = True
    config.mesh_shape = (-1, 1, 1)
    config.sharding_rules = DEFAULT_RULES
    config.global_norm = "auto"  # the clip's norm: per_leaf | grouped (fewer kernels; whole parameters only)
    config.xla_options = ""  # the steps' XLA compiler options, "name=value ..." (bert_jax/training/compiler_options.py)
    if args.runlocal:  # the tiny model for a few steps on a CPU (smoke runs and tests)
        config.model.size = "tiny"
        config.batch_size, config.eval_batch_size = 8, 16
        config.num_train_steps = 20
        config.log_every = 5
    return config

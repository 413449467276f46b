"""The fields every fine-tuning config shares (configs/glue.py, squad.py, ner.py build on this).

Defaults follow the paper's fine-tuning recipe (Devlin et al., 2019, §4 and A.3) and Google's
run_classifier.py / run_squad.py: Adam with weight decay 0.01 and no bias correction (Google's
``AdamWeightDecayOptimizer``; bias_correction=True gives textbook AdamW), warmup over the first
10% of the steps then linear decay to 0, global-norm clip 1.0, dropout 0.1.
"""

from __future__ import annotations

import ml_collections

from bert_jax.training.distributed import default_config as distributed_config
from bert_jax.training.sharding import DEFAULT_RULES


def base_config(task: dict, *, size: str, max_seq_length: int, batch_size: int, epochs: float,
                learning_rate: float, runlocal: bool) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.task = ml_collections.ConfigDict(task)
    c.seed = 0
    c.rng_impl = "threefry2x32"  # dropout PRNG: threefry2x32 | rbg | unsafe_rbg; see configs/pretrain.py
    c.seeds = 1  # fine-tuning restarts (seeds seed, seed+1, ...): results.json gets median/mean/min/max
    c.multihost = False  # several processes: see configs/pretrain.py
    c.distributed = distributed_config()
    # "" = from scratch; a pre-training workdir, orbax:DIR, hf:DIR or tf:PREFIX (encoder only).
    c.init_checkpoint = ""
    c.vocab = ""  # default: the init_checkpoint's vocabulary
    # Shapes come from the init_checkpoint; `size` only matters from scratch. The rest are
    # execution settings applied on top of the checkpoint's config.
    c.model = ml_collections.ConfigDict(dict(
        size=size, dtype="auto", scan_layers="auto", remat_policy="none", attention_impl="auto", dropout_impl="auto",
        hidden_dropout_prob=0.1, attention_dropout_prob=0.1,
        # Sequence classifiers read the pooled [CLS] ("cls", the paper) or the mean of the last layer
        # over real tokens ("mean"); bert_jax/model/config.py.
        classifier_pooling="cls"))
    c.max_seq_length = max_seq_length
    c.length_multiple = 32  # batches are cut to their longest row, rounded up to this
    # Real lengths (bert_jax/finetuning/lengths.py, docs/records.md "Fine-tuning on real lengths").
    # M > 0: the encoder's blocks on the real tokens only, in training and evaluation, counts rounded
    # up to M per data shard (same outputs; each new count compiles once); measured 1.67x training
    # and 2.5x evaluation examples/s on the demo's review sentences (BERT-base, CPU); 0 = padded.
    c.unpad_multiple = 64
    c.eval_by_length = False  # True: eval batches of rows longest first (same predictions)
    c.length_groups = 0  # G > 0: training batches from groups of G batches sorted by length (other batches)
    c.batch_size = batch_size
    c.eval_batch_size = 64
    c.num_train_epochs = epochs
    c.num_train_steps = 0  # > 0 overrides num_train_epochs
    c.max_train_examples = 0  # > 0: only the first N training examples (learning curves, smoke runs)
    c.max_eval_examples = 0
    c.optimizer = ml_collections.ConfigDict(dict(
        optimizer="adamw_bert", learning_rate=learning_rate, warmup_fraction=0.1, weight_decay=0.01,
        b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0, bias_correction=False, schedule="bert"))
    c.predict_splits = ()  # also write prediction files for these (e.g. ("test",) for GLUE submissions)
    c.eval_every = 0  # steps; 0 = evaluate once, at the end
    c.log_every = 50
    c.checkpoint_every = 1000
    c.keep_checkpoints = 1
    c.restore = "latest"  # or "previous" or a step number: the checkpoint a re-run resumes from (docs/robustness.md)
    c.progress = True
    c.mesh_shape = (-1, 1, 1)
    c.sharding_rules = DEFAULT_RULES
    if runlocal:  # the tiny model for a few steps on CPU (smoke runs and tests)
        c.model.size = "tiny"
        c.batch_size, c.eval_batch_size = 8, 16
        c.num_train_steps = 20
        c.log_every = 5
    return c

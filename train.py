r"""Pre-training and fine-tuning entry point: parses flags and calls ``bert_jax.launch.run``.

    python train.py --config configs/pretrain.py:size=tiny,runlocal --workdir /tmp/w \
        [--config.num_train_steps=2000 ...]
"""

import logging as pylogging

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "configs/<job>.py:<args>", lock_config=True)
flags.DEFINE_string("workdir", None, "checkpoints, config.json, metrics and TensorBoard events", required=True)
flags.mark_flags_as_required(["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from bert_jax import launch
    from bert_jax.training import host_memory

    # Before JAX starts its backend: config.reuse_host_memory (bert_jax/training/host_memory.py).
    host_memory.reuse_freed_memory(FLAGS.config.get("reuse_host_memory", "default"))
    logging.set_verbosity(logging.INFO)
    # Orbax logs ~50 INFO lines per checkpoint save; keep its warnings, drop the chatter.
    logging.get_absl_handler().addFilter(
        lambda r: r.levelno >= pylogging.WARNING or "orbax" not in r.pathname)
    launch.run(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)

r"""Pre-training and fine-tuning entry point: parses flags and calls ``bert_jax.launch.run``.

    python train.py --config configs/pretrain.py:size=tiny,runlocal --workdir /tmp/w \
        [--config.num_train_steps=2000 ...]

A bad flag, config file, config argument or ``--config.<key>`` prints one ``error:`` line and exits
with status 2 (input_pipeline/cli.py; ``BERT_JAX_DEBUG=1`` shows the traceback).
"""

import gc
import logging as pylogging
import os
import re

from absl import flags, logging
from ml_collections import config_flags

from input_pipeline import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "configs/<job>.py:<args>", lock_config=True)
flags.DEFINE_string("workdir", None, "checkpoints, config.json, metrics and TensorBoard events", required=True)
flags.mark_flags_as_required(["config"])


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with ml_collections' config errors (tracebacks today) as one line."""
    cli.exit_if_help(argv)
    try:
        rest = FLAGS(argv)
    except flags.Error as e:
        cli.fail(_config_file_error(e) or e, e)
    except (KeyError, AttributeError) as e:  # what ml_collections raises for an unknown --config.<key>
        unknown = _unknown_override(e, argv)
        if unknown is None:
            raise
        cli.fail(unknown, e)
    try:
        FLAGS.config.keys()  # ml_collections defers a config file's load error to the first use
    except OSError as e:
        path = config_flags.get_config_filename(FLAGS["config"])
        if not os.path.isfile(path):
            cli.fail(f"--config {path}: no such config file (expected configs/<job>.py[:<args>])", e)
        cli.fail(f"--config {path}: {cli.message(e.__cause__ or e)}", e)
    return rest


def _config_file_error(e: flags.Error) -> str | None:
    """``--config=SPEC: <the error get_config raised>`` (ml_collections buries it in a traceback)."""
    spec = re.match(r"flag --config=(.*?): Error whilst parsing config file", str(e))
    inner = e
    while inner.__context__ is not None:
        inner = inner.__context__
    if spec is None or not cli.is_user_error(inner):
        return None
    return f"--config={spec.group(1)}: {cli.message(inner)}"


def _unknown_override(e: LookupError | AttributeError, argv: list[str]) -> str | None:
    """The ``--config.a.b`` that names no key of the config, if ``e`` is about one of them."""
    text = e
    while isinstance(text, BaseException):  # AttributeError(KeyError("'key'\nDid you mean ...?"))
        text = text.args[0] if text.args else ""
    text = str(text)
    key = re.match(r"""^\W*([\w-]+)""", text)
    if key is None:
        return None
    for arg in argv[1:]:
        path = re.match(r"^--?(?:no)?config\.([\w.-]+)", arg)
        if path and key.group(1) in path.group(1).split("."):
            hint = " ".join(text.splitlines()[1:]).strip()
            return (f"--config.{path.group(1)}: the config has no key {key.group(1)!r}"
                    + (f" ({hint})" if hint else ""))
    return None


def main(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {argv[1:]} (flags are --name=value)")
    from bert_jax import launch
    from bert_jax.training import host_memory

    # Before JAX starts its backend: config.reuse_host_memory (bert_jax/training/host_memory.py).
    host_memory.reuse_freed_memory(FLAGS.config.get("reuse_host_memory", "default"))
    logging.set_verbosity(logging.INFO)
    # Orbax logs ~50 INFO lines per checkpoint save; keep its warnings, drop the chatter.
    logging.get_absl_handler().addFilter(
        lambda r: r.levelno >= pylogging.WARNING or "orbax" not in r.pathname)
    launch.run(FLAGS.config, FLAGS.workdir)
    # Everything is saved and closed. Python's last garbage collection at exit walks the job's
    # objects (the in-memory corpus, TensorFlow's): 40 s on the tiny runlocal job, a preemption's
    # grace period. Frozen objects are left to the OS (docs/robustness.md).
    gc.freeze()


if __name__ == "__main__":
    cli.run_absl(main, flags_parser=parse_flags)

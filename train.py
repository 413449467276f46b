r"""Pre-training and fine-tuning entry point: parses flags and calls ``bert_jax.launch.run``.

    python train.py --config configs/pretrain.py:size=tiny,runlocal --workdir /tmp/w \
        [--config.num_train_steps=2000 ...]

A bad flag, config file, config argument or ``--config.<key>``, and bad input found later (a missing
or malformed data file, a checkpoint that does not fit), print one ``error:`` line and exit with
status 2 (input_pipeline/cli.py; ``BERT_JAX_DEBUG=1`` shows the traceback); such a job leaves its
workdir as it was (bert_jax/launch.py). A run whose loss becomes NaN/Inf prints one ``error:`` line
naming the step and the last good checkpoint and exits with status 1.
"""

import functools
import gc
import logging as pylogging
import os
import re
from typing import NoReturn

from absl import flags, logging
from ml_collections import config_flags

from input_pipeline import cli

FLAGS = flags.FLAGS


def define_flags(fv: flags.FlagValues = FLAGS, argv: list[str] | None = None) -> None:
    """Defines --config and --workdir on `fv` (only when run as a program: no import-time flags).
    ml_collections finds the ``--config.<key>`` overrides in ``argv`` (default: sys.argv)."""
    config_flags.DEFINE_config_file("config", None, "configs/<job>.py:<args>", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    flags.DEFINE_string("workdir", None, "checkpoints, config.json, metrics and TensorBoard events",
                        required=True, flag_values=fv)
    flags.mark_flags_as_required(["config"], flag_values=fv)


def parse_flags(argv: list[str], fv: flags.FlagValues = FLAGS) -> list[str]:
    """absl's parsing, with ml_collections' config errors (tracebacks otherwise) as one line."""
    cli.exit_if_help(argv)
    try:
        rest = fv(argv)
    except flags.Error as e:
        cli.fail(_config_file_error(e) or e, e)
    except (KeyError, AttributeError) as e:  # what ml_collections raises for an unknown --config.<key>
        unknown = _unknown_override(e, argv)
        if unknown is None:
            raise
        cli.fail(unknown, e)
    except OSError as e:  # a --config.<key> override met a config file that failed to load
        _config_load_error(e, argv)
    try:
        fv.config.keys()  # ml_collections defers a config file's load error to the first use
    except OSError as e:
        _config_load_error(e, argv)
    return rest


def _config_load_error(e: OSError, argv: list[str]) -> NoReturn:
    given = [b if a == "--config" else a.partition("=")[2] for a, b in zip(argv, [*argv[1:], ""], strict=True)
             if a == "--config" or a.startswith("--config=")]
    path = given[-1].partition(":")[0] if given else "?"
    if not os.path.isfile(path):
        cli.fail(f"--config {path}: no such config file (expected configs/<job>.py[:<args>])", e)
    cli.fail(f"--config {path}: {cli.message(e.__cause__ or e)}", e)


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


def main(argv, fv: flags.FlagValues = FLAGS, *, command: bool = False):
    """``command``: run as ``python train.py`` (not called in-process, e.g. by a test)."""
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {argv[1:]} (flags are --name=value)")
    from bert_jax.training import host_memory

    pages = fv.config.get("host_huge_pages", "auto")
    if pages not in host_memory.HUGE_PAGE_MODES:
        raise ValueError(f"--config.host_huge_pages={pages!r}: expected one of {host_memory.HUGE_PAGE_MODES}")
    if command:  # first: on a CPU backend the command re-executes itself once with glibc's huge pages
        host_memory.use_huge_pages(pages)  # (bert_jax/training/host_memory.py)
    from bert_jax import launch

    # Before JAX starts its backend: config.reuse_host_memory (bert_jax/training/host_memory.py).
    host_memory.reuse_freed_memory(fv.config.get("reuse_host_memory", "default"))
    from bert_jax.training.job import Preemption

    # From here to the end SIGTERM/SIGINT stop the job after a committed checkpoint (docs/robustness.md).
    preemption = Preemption(sigterm=not fv.config.get("multihost", False))
    logging.set_verbosity(logging.INFO)
    # Orbax logs ~50 INFO lines per checkpoint save; keep its warnings, drop the chatter.
    logging.get_absl_handler().addFilter(
        lambda r: r.levelno >= pylogging.WARNING or "orbax" not in r.pathname)
    from bert_jax.training.loop import TrainingDivergedError

    try:
        launch.run(fv.config, fv.workdir, preemption)
    except TrainingDivergedError as e:
        cli.fail(e, status=1)
    finally:
        preemption.close()
    # Everything is saved and closed. Python's last garbage collection at exit walks the job's
    # objects (the in-memory corpus, TensorFlow's): 40 s on the tiny runlocal job, a preemption's
    # grace period. Frozen objects are left to the OS (docs/robustness.md).
    gc.freeze()


if __name__ == "__main__":
    define_flags()
    cli.run_absl(functools.update_wrapper(functools.partial(main, command=True), main), flags_parser=parse_flags)

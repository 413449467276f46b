"""How every command-line tool of the project fails on a user error: one line, exit status 2.

A user error (`USER_ERRORS`: a missing or unreadable file, bad UTF-8, a bad flag or config value,
malformed task data, a checkpoint that does not fit the model, a missing optional package) prints
``error: <message>`` on stderr, the message naming the file, line, flag or key and what was
expected, and exits with status 2 without a traceback. Any other exception is a bug and keeps its
traceback. ``BERT_JAX_DEBUG=1`` in the environment prints the traceback of user errors too.

argparse tools build their parser with `ArgumentParser` and run ``cli.run(main)``; absl tools run
``cli.run_absl(main)``. This module sits below both packages (bert_jax imports input_pipeline,
never the reverse), so every entry point shares it.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from input_pipeline.accelerators import quiet_cpu_start
from input_pipeline.package_data import PackageDataError

DEBUG_ENV = "BERT_JAX_DEBUG"
USER_ERROR_STATUS = 2
HELP_FLAGS = ("-h", "--help", "-?", "--helpshort", "--helpfull")


class UserError(Exception):
    """A user's mistake that no built-in exception type fits (e.g. a missing optional package)."""


# ValueError covers UnicodeDecodeError, json.JSONDecodeError and the project's input errors
# (SourceError, VocabError, TaskDataError, WikiFormatError, CheckpointMismatchError, the config
# argument errors of bert_jax.config_args). TensorFlow's NotFoundError and PermissionDeniedError
# (tf.io.gfile, tf.data on a missing or unreadable file) count too: see `is_user_error`.
USER_ERRORS = (ValueError, UnicodeDecodeError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
               PermissionError, FileExistsError, PackageDataError, UserError)


def require_extra(extra: str, *modules: str, purpose: str) -> None:
    """Raises `UserError` naming ``pip install 'bert-jax[extra]'`` when one of ``modules`` (packages of
    an optional extra, e.g. the server's) is not installed; the core install leaves them out."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"{purpose} needs {', '.join(missing)}, which the core install leaves out: "
                        f"pip install 'bert-jax[{extra}]' (or pip install -e '.[{extra}]' in a checkout)")


def is_user_error(e: BaseException) -> bool:
    """Whether ``e`` is reported as one line (`USER_ERRORS`, TF's file errors) or keeps its traceback."""
    if isinstance(e, USER_ERRORS):
        return True
    tf = sys.modules.get("tensorflow")  # only when the tool has loaded it: the import costs seconds
    errors = getattr(tf, "errors", None)
    return errors is not None and isinstance(e, (errors.NotFoundError, errors.PermissionDeniedError))


def debug() -> bool:
    """Whether ``BERT_JAX_DEBUG`` asks for the tracebacks of user errors."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def message(e: BaseException) -> str:
    """``e`` as one line: ``FILE: reason`` for OS errors that carry a file name."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.filename}: {e.strerror}" + (f" ({e.filename2})" if e.filename2 is not None else "")
    else:
        text = getattr(e, "message", None) if type(e).__module__.startswith("tensorflow") else None
        text = text or str(e) or type(e).__name__
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def fail(e: BaseException | str, cause: BaseException | None = None, status: int = USER_ERROR_STATUS) -> NoReturn:
    """Reports a user error (an exception, or a message about ``cause``) as ``error: ...`` and exits
    with ``status`` (2; 1 for a job that failed on good input, e.g. a diverged training run)."""
    sys.stdout.flush()
    cause = e if isinstance(e, BaseException) else cause
    if debug() and cause is not None:
        traceback.print_exception(cause)
    print(f"error: {message(e) if isinstance(e, BaseException) else e}", file=sys.stderr, flush=True)
    sys.exit(status)


def catching(main: Callable) -> Callable:
    """``main`` with its user errors reported by `fail`; other exceptions pass through."""

    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as e:
            if not is_user_error(e):
                raise
            fail(e)

    wrapped.__doc__, wrapped.__name__ = main.__doc__, main.__name__
    return wrapped


def run(main: Callable[[], object]) -> NoReturn:
    """Runs ``main()`` (which reads ``sys.argv`` itself) with the convention and exits: with the
    status ``main`` returns if that is an int, else 0. On a machine without a GPU or TPU, JAX and
    TensorFlow start on the CPU without probing for them (`accelerators.quiet_cpu_start`)."""
    quiet_cpu_start()
    status = catching(main)()
    sys.exit(status if isinstance(status, int) else 0)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: argument --steps: invalid int value: 'x'``, status 2
    (argparse's own prints the usage first)."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see {self.prog} --help)")


def exit_if_help(argv: list[str]) -> None:
    """absl prints its usage for ``--help`` and exits with status 1; here it exits with 0."""
    from absl import app

    given = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    if any(a in HELP_FLAGS for a in given):
        app.usage(shorthelp="--helpfull" not in given, writeto_stdout=True)
        sys.exit(0)


def parse_absl_flags(argv: list[str], fv=None) -> list[str]:
    """absl's flag parsing (``app.run``'s ``flags_parser``; on `fv`, default absl's global set) with
    the convention for bad flags."""
    from absl import flags

    exit_if_help(argv)
    try:
        return (flags.FLAGS if fv is None else fv)(argv)
    except flags.Error as e:
        fail(e)


def run_absl(main: Callable[[list[str]], int | None], flags_parser=parse_absl_flags) -> NoReturn:
    """``absl.app.run(main)`` (which exits) with the convention, for flag errors too; on a machine
    without a GPU or TPU, JAX and TensorFlow start on the CPU without probing for them
    (`accelerators.quiet_cpu_start`)."""
    from absl import app

    quiet_cpu_start()

    app.run(catching(main), flags_parser=flags_parser)

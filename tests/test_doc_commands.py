"""Every shell command in README.md and docs/**/*.md, checked (fast) or run at tiny scale (slow).

Conventions for the markdown:

* A shell block is fenced as ```sh (no ```bash, ```console or ```shell: `test_shell_fences_are_sh`).
* An HTML comment on the line right before the fence sets the block's mode:
  ``<!-- doc-test: slow -->``: the slow test also runs the block for real, at tiny scale (below);
  ``<!-- doc-test: skip REASON -->``: only ``bash -n`` (for a block nothing here can check).
* A page's blocks run in order in one bash session, as a reader pastes them: a variable set in one
  block (``BUCKET=gs://my-bucket``) holds in the next. Put placeholders in shell variables at the top
  of a block; ``gs://my-bucket`` is the bucket placeholder.

How a block runs (fast part, `test_doc_commands`, in ``make test``). Each block must pass ``bash -n``.
Then bash runs the page with every command replaced by a stub that asks this process what to do
(over a local socket, so the commands are handled in order and later commands see what earlier
ones "made"). Bash itself still expands variables, loops, quotes, heredocs and ``$(...)``. Each
command is:

* ``python train.py ARGS``: parsed exactly as train.py parses (a fresh absl FlagValues, its
  define_flags and parse_flags), then ``bert_jax.launch.dry_run(config, workdir, hosts)``: the config
  resolves, and its data, vocabulary, workdir and checkpoint exist and fit.
* ``python -m input_pipeline.build_vocab``: its flags parse, ``--input`` names existing files;
  MiniLM's vocab.txt is written to ``--output_dir``.
* ``python -m input_pipeline.create_pretraining_data``: its flags parse and their values check,
  ``--input`` names existing files, ``--vocab`` exists; tiny real shards of the asked length, P,
  masking and compression are written to ``--output`` (and, with ``--heldout_every``, to the
  held-out directory).
* ``python -m X ARGS``, any other tool: module X exists, and runs as ``__main__`` until it has
  parsed its arguments (argparse's ``parse_args``/``parse_known_args``, absl's ``app.run``), then
  stops; a ``--config`` and its ``--config.<key>`` overrides are checked against the config's keys.
* ``python -c CODE``, ``python - <<EOF``: run for real, in this process (they look something up or
  write small files). ``python SCRIPT.py``: the script exists and compiles.
* ``python3 -m venv``, ``pip install ...``: the extras named in ``.[a,b]`` exist in pyproject.toml;
  nothing is installed.
* ``gcloud ... ssh --command=CMD``: CMD is checked as a block, from a worker's home directory
  holding ``bert-jax/`` (the checkout); other gcloud commands are accepted.
* ``gsutil [-m] cp [-r] SRC... DST``, ``gsutil mb``: done locally (buckets are local directories).
* ``wget URL``: a fake download. Wikipedia's dump index → the gensim excerpt as two dump parts
  (``-P DIR``, checked against ``-A``); a GLUE zip → a zip of the tests' toy TSVs; a SQuAD file →
  the tests' toy SQuAD JSON; anything else → nothing. ``unzip ZIP [-d DIR]``: extracted.
* ``hf download REPO FILES --local-dir DIR``: the files copied from the all-MiniLM-L6-v2
  checkpoint (a real Hugging Face BERT directory).
* ``make TARGET``: the target exists in the Makefile.
* `EXTERNAL` (``git``, ``tar``, ``tfds``, ``tensorboard``, ``curl``, ``sleep``, ``sudo``,
  ``apt-get``, ...): accepted, nothing run (``git archive -o F`` touches F).
* `REAL` (``mkdir``, ``cp``, ``mv``, ``ln``, ``cat``, ``ls``, ...) and bash's builtins (``cd``,
  ``echo``, ``printf``, ``export``, ...): run for real, inside the temporary directory.
* Anything else is an error: add it to one of these or do not use it.

`SUBSTITUTIONS` (text, both parts): the bucket placeholder ``gs://my-bucket`` (any other ``gs://NAME``
too) and ``/tmp/`` become directories under pytest's temporary directory; ``HOME`` is one too; a
``gs://`` path that still reaches a command is an error (never the network). Fast part only:

* `PREPARED`: every page starts in a directory holding what the README's journey 1 makes (MiniLM's
  vocabulary as ``vocab/vocab.txt``, tiny shards in 8 files as ``data/p1``, ``data/p1-heldout``, ``data/p2``,
  ``data/p2-heldout``), also under the bucket placeholder: a page may build on them, as a reader
  who followed the README does. `PREPARED_HOME`: the demo's vocabulary in ``~/.cache/bert_jax``.
* `DRY_RUN_DEVICES`: dry runs plan for one device (a reader's CPU or GPU), not for the 8 fake CPU
  devices of the test process (tests/conftest.py).
* `DRY_RUN_SUBSTITUTIONS`: an ``init_checkpoint`` naming a workdir that only a dry run "produced" is
  replaced: for pre-training by a directory holding ``checkpoints/<its final step>/`` (what the dry
  run checks), for fine-tuning by ``hf:<the MiniLM checkpoint>``.
* Model sizes (``size=base``, ``size=large``) stay: a dry run allocates nothing. (Speed only: the
  parameter count of a model is computed once per session, `_memoized_parameter_count`.)

Slow part (`test_doc_blocks_run`, ``-m slow``): the ``slow`` blocks of each page run for real, in
order, in one temporary directory, with `SLOW_SUBSTITUTIONS`; the downloads are faked as above,
and commands inside ``gcloud ... --command`` are dry-run only.

Also fast: `test_a_broken_command_fails_the_check` (a wrong ``--config.`` key, flag or module, an
unknown command, a glob matching nothing and a syntax error each fail the checker),
`test_shell_fences_are_sh`, and `test_links_between_pages_resolve` (relative links and their
anchors).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import runpy
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_LANGS = ("sh", "bash", "console", "shell", "zsh")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(\w+)\s*(.*?)\s*-->\s*$")

# Text substitutions (regex, replacement) applied to every block before bash reads it, in one pass
# ({root}: the test's temporary directory).
SUBSTITUTIONS = [
    (r"gs://my-bucket\b", "{root}/bucket"),  # the bucket placeholder: a local directory
    (r"gs://([\w.-]+)", r"{root}/gs/\1"),  # any other bucket name: a local directory too
    (r"(?<![\w/.])/tmp/", "{root}/tmp/"),  # scratch paths of the docs stay under pytest's temporary directory
]
# What every page starts with, in its working directory and under the bucket placeholder: the outputs
# of the README's journey 1 (the fast part's fakes: MiniLM's vocabulary, tiny shards), as a reader who
# followed it has them. Pages build on them (docs/pretraining.md trains from data/p1).
PREPARED = {"vocab/vocab.txt": "vocabulary", "data/p1": (128, 20), "data/p1-heldout": (128, 20),
            "data/p2": (512, 80), "data/p2-heldout": (512, 80)}
# ... and in HOME: the demo's workdir after `make demo` (records.md's commands use its vocabulary).
PREPARED_HOME = {".cache/bert_jax/demo/run/vocab/vocab.txt": "vocabulary"}
# Dry runs plan for one device (a reader's CPU or GPU), not the test process's 8 fake CPU devices.
DRY_RUN_DEVICES = 1
# Fast part: what a dry run's workdir stands for when a later command restores it (see the docstring).
DRY_RUN_SUBSTITUTIONS = {
    "pre-training init_checkpoint=<a dry-run workdir>": "<a directory holding checkpoints/<final step>/>",
    "fine-tuning init_checkpoint=<a dry-run workdir>": "hf:<the all-MiniLM-L6-v2 checkpoint>",
}
# Slow part: each real run at tiny scale (config-argument and flag rewrites).
SLOW_SUBSTITUTIONS = {
    "train.py --config configs/pretrain.py:...size=base|large...": "size=tiny",
    "train.py, pre-training": "--config.num_train_steps=4 (phase=2: 8, after phase 1's 4) --config.batch_size=8 "
                              "--config.eval_steps=2 --config.eval_every=4 (unless the command sets eval_every) "
                              "--config.checkpoint_every=4 --config.log_every=1",
    "train.py, fine-tuning": "--config.num_train_steps=4 --config.batch_size=8 --config.eval_batch_size=8 "
                             "--config.max_train_examples=64 --config.max_eval_examples=16 --config.log_every=1",
    "build_vocab --vocab_size N": "min(N, 4000)",
    "create_pretraining_data --dupe_factor N / --num_shards N / --num_workers N": "1 / min(N, 2) / 1",
}

EXTERNAL = ("git", "tar", "tfds", "tensorboard", "curl", "sleep", "sudo", "apt-get", "zip", "perl", "pytest",
            "chromium", "nvidia-smi")
HANDLED = ("python", "python3", "python3.11", "python3.12", ".venv/bin/python", "pip", "pip3", ".venv/bin/pip",
           "gcloud", "gsutil", "wget", "unzip", "hf", "make")
REAL = ("mkdir", "cp", "mv", "ln", "touch", "cat", "ls", "head", "tail", "wc", "sort", "tr", "grep", "basename",
        "dirname", "seq", "mktemp", "true", "false", "env")

FAKE_TEXT = """The lighthouse keeper woke before dawn. He climbed the spiral stairs and trimmed the wick.
Outside, the sea was grey and still. A fishing boat passed the harbour wall.

The baker had already lit her ovens. Children ran down to the harbour to watch the boats come in.
The market opened at eight. Apples, bread and fish were sold until noon.

In the afternoon the wind rose. The keeper wrote in his log that a storm was coming from the west.
By evening the waves broke over the pier, and the lamp turned all night.
"""


# --------------------------------------------------------------------------- markdown


@dataclasses.dataclass
class Block:
    page: Path
    line: int  # the fence's line, 1-based
    lang: str
    text: str
    mode: str  # "check", "slow" or "skip"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` (any language) with its doc-test marker."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        mode = "check"
        marker = MARKER.match(lines[start - 1].strip()) if start > 0 else None
        if marker:
            mode = marker.group(1)
            assert mode in ("slow", "skip"), f"{page}:{start}: unknown doc-test mode {mode!r}"
            assert mode != "skip" or marker.group(2), f"{page}:{start}: doc-test: skip needs a reason"
        blocks.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n", mode))
        i = j + 1
    return blocks


def shell_blocks(page: Path) -> list[Block]:
    return [b for b in fenced_blocks(page) if b.lang in SHELL_LANGS]


# --------------------------------------------------------------------------- the bash side

PRELUDE = r"""
__doctest_call() {
  local fd st stdin="" wants="${__doctest_stdin:-0}"
  local __doctest_stdin=0
  if [ "$wants" = 1 ]; then stdin=$(mktemp); cat > "$stdin"; fi
  exec {fd}<>/dev/tcp/127.0.0.1/$DOCTEST_PORT || { echo "doc-test: no server" >&2; return 97; }
  printf '%s\0' "$DOCTEST_BLOCK" "$PWD" "$stdin" "$@" >&$fd
  printf '\001\0' >&$fd
  IFS= read -r st <&$fd
  cat <&$fd
  exec {fd}>&-
  if [ -n "$stdin" ]; then __doctest_rm -f "$stdin"; fi
  return "${st:-98}"
}
__doctest_python() {
  local a wants=0
  for a in "$@"; do [ "$a" = - ] && wants=1; done
  __doctest_stdin=$wants __doctest_call "$@"
}
command_not_found_handle() { __doctest_stdin=0 __doctest_call __unknown__ "$@"; return 127; }
"""


def prelude() -> str:
    out = [PRELUDE]
    for name in HANDLED + EXTERNAL:
        target = "__doctest_python" if "python" in name else "__doctest_call"
        out.append(f"function {name} {{ {target} {shlex.quote(name)} \"$@\"; }}")
    return "\n".join(out) + "\n"


def shim_path(root: Path) -> Path:
    """A PATH holding only the real commands a block may run (`REAL`)."""
    shim = root / ".bin"
    shim.mkdir(exist_ok=True)
    for name in REAL:
        found = shutil.which(name)
        if found and not (shim / name).exists():
            (shim / name).symlink_to(found)
    if not (shim / "__doctest_rm").exists():  # the stubs' own clean-up; `rm` is not a doc command
        (shim / "__doctest_rm").symlink_to(shutil.which("rm"))
    return shim


def checkout_view(where: Path) -> Path:
    """A directory that looks like the checkout from the outside (configs/, train.py, ...)."""
    where.mkdir(parents=True, exist_ok=True)
    for name in ("configs", "train.py", "tests", "Makefile", "pyproject.toml", "input_pipeline", "bert_jax"):
        if not (where / name).exists():
            (where / name).symlink_to(ROOT / name)
    return where


def substitute(text: str, root: Path) -> str:
    """`SUBSTITUTIONS` in one pass (a replacement is never substituted again)."""
    combined = "|".join(f"(?:{old})" for old, _ in SUBSTITUTIONS)

    def one(m: re.Match) -> str:
        for old, new in SUBSTITUTIONS:  # the first that matches this text (context was checked above)
            found = re.fullmatch(old, m.group(0))
            if found:
                return found.expand(new.replace("{root}", str(root)))
        return m.group(0)

    return re.sub(combined, one, text)


# --------------------------------------------------------------------------- the python side


@dataclasses.dataclass
class Failure:
    where: str
    command: str
    message: str

    def __str__(self):
        return f"{self.where}: {self.command}\n    -> {self.message}"


class Reject(Exception):
    """A doc command that does not check: the message says why."""


class _Parsed(Exception):
    """Raised by the patched argument parsers once a tool has parsed its arguments."""


class Runner:
    """Runs pages of blocks through bash with stubs and answers each stub (see the module docstring)."""

    def __init__(self, root: Path, slow: bool = False):
        self.root = root
        self.slow = slow
        self.failures: list[Failure] = []
        self.commands: list[str] = []
        self.produced: dict[str, tuple[int, bool]] = {}  # dry-run workdir -> (final step, pre-training)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(exist_ok=True)
        (root / "bucket").mkdir(exist_ok=True)
        self.work = checkout_view(root / "work")
        self.shim = shim_path(root)
        self._nested = 0
        if not slow:
            self.prepare(self.work)
            self.prepare(root / "bucket")
            self.prepare(self.home, PREPARED_HOME)

    def prepare(self, where: Path, table: dict = PREPARED) -> None:
        """`PREPARED` (or ``table``) in ``where``."""
        for name, what in table.items():
            if what == "vocabulary":
                (where / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(Path(_minilm()) / "vocab.txt", where / name)
            else:
                from input_pipeline.pretraining.shards import Settings

                settings = Settings(max_seq_length=what[0], max_predictions_per_seq=what[1], num_shards=8)
                shutil.copytree(self.fake_shards(settings), where / name, dirs_exist_ok=True)

    def close(self):
        self.sock.close()

    # ---- bash
    def run_blocks(self, blocks: list[Block], cwd: Path | None = None, timeout: float = 600,
                   substituted: bool = False) -> str:
        for b in blocks:
            r = subprocess.run(["bash", "-n"], input=b.text, capture_output=True, text=True)
            if r.returncode:
                self.failures.append(Failure(b.where, "bash -n", r.stderr.strip()))
        if any(f.command == "bash -n" for f in self.failures):
            return ""
        script = prelude() + "".join(
            f"DOCTEST_BLOCK={shlex.quote(b.where)}\n{b.text if substituted else substitute(b.text, self.root)}\n"
            for b in blocks if b.mode != "skip")
        return self.run_bash(script, cwd or self.work, timeout)

    def run_bash(self, script: str, cwd: Path, timeout: float) -> str:
        env = {"PATH": str(self.shim), "HOME": str(self.home), "DOCTEST_PORT": str(self.sock.getsockname()[1]),
               "LANG": "C.UTF-8", "TMPDIR": str(self.root / "tmp")}
        with tempfile.TemporaryFile(mode="w+") as log:
            proc = subprocess.Popen(["/bin/bash", "-c", script], cwd=cwd, env=env, stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL)
            end = time.monotonic() + timeout
            while proc.poll() is None:
                if time.monotonic() > end:
                    proc.kill()
                    self.failures.append(Failure("bash", "(the page)", f"timed out after {timeout} s"))
                    break
                try:
                    conn, _ = self.sock.accept()
                except TimeoutError:
                    continue
                with conn:
                    self._serve(conn)
            proc.wait()
            log.seek(0)
            return log.read()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        data = b""
        while not data.endswith(b"\x01\x00"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        fields = [f.decode() for f in data[:-2].split(b"\x00")][:-1] if data.endswith(b"\x01\x00") else []
        if len(fields) < 4:
            conn.sendall(b"99\n")
            return
        where, pwd, stdin, *argv = fields
        stdin_text = Path(stdin).read_text() if stdin else None
        command = shlex.join(argv)
        status, out, start = 0, "", time.monotonic()
        try:
            if any("gs://" in a for a in argv):  # never the network: every bucket is substituted
                raise Reject("a gs:// path reached the command (use a bucket name the substitutions map)")
            out = self.handle(argv, Path(pwd), stdin_text, where) or ""
        except Reject as e:
            status = 1
            self.failures.append(Failure(where, command, str(e)))
        except Exception as e:  # noqa: BLE001  (a bug here, reported as the command's failure)
            status = 1
            self.failures.append(Failure(where, command, "".join(traceback.format_exception(e))[-3000:]))
        self.commands.append(f"{time.monotonic() - start:6.2f} s  {where}: {command}")
        conn.sendall(f"{status}\n{out}".encode())

    # ---- dispatch
    def handle(self, argv: list[str], pwd: Path, stdin: str | None, where: str) -> str | None:
        name = argv[0]
        if name == "__unknown__":
            raise Reject(f"{argv[1]!r} is not a command this test knows (tests/test_doc_commands.py: EXTERNAL, "
                         "HANDLED, REAL)")
        base = name.rsplit("/", 1)[-1]
        if base.startswith("python"):
            return self.python(argv[1:], pwd, stdin, where)
        if base.startswith("pip"):
            return self.pip(argv[1:])
        return getattr(self, "cmd_" + base.replace("-", "_"), lambda args, pwd, where: None)(argv[1:], pwd, where)

    # ---- python
    def python(self, args: list[str], pwd: Path, stdin: str | None, where: str) -> str | None:
        if not args:
            raise Reject("python without arguments")
        if args[0] == "-m":
            module, rest = args[1], args[2:]
            if module == "venv":
                return None
            if module == "pip":
                return self.pip(rest)
            return self.tool(module, rest, pwd, where)
        if args[0] in ("-c", "-"):
            return self.python_code(args, pwd, stdin)
        script = args[0]
        if Path(script).name == "train.py":
            return self.train(args[1:], pwd, where)
        path = pwd / script
        if not path.is_file():
            raise Reject(f"{script}: no such script (from {pwd})")
        compile(path.read_text(), str(path), "exec")
        return None

    def python_code(self, args: list[str], pwd: Path, stdin: str | None) -> str:
        if self.slow and not self._nested:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(self.home)}
            r = subprocess.run([sys.executable, *args], input=stdin, cwd=pwd, env=env, capture_output=True,
                               text=True, timeout=600)
            if r.returncode:
                raise Reject(f"exit status {r.returncode}: {r.stderr.strip()[-2000:]}")
            return r.stdout
        # Fast: in this process, where its imports (TensorFlow, for one) are already loaded.
        code = args[1] if args[0] == "-c" else stdin or ""
        out, err = io.StringIO(), io.StringIO()
        saved_argv = sys.argv
        sys.argv = ["-c" if args[0] == "-c" else "-", *args[2 if args[0] == "-c" else 1:]]
        try:
            with _chdir(pwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(compile(code, "<doc block>", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            if e.code not in (0, None):
                raise Reject(f"exit status {e.code}: {err.getvalue()[-1500:]}") from None
        except Exception as e:  # noqa: BLE001  (the block's own error)
            raise Reject("".join(traceback.format_exception_only(e)).strip()) from None
        finally:
            sys.argv = saved_argv
        return out.getvalue()

    def pip(self, args: list[str]) -> None:
        import tomllib

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        for a in args:
            m = re.fullmatch(r"\.?\[([\w,-]+)\]", a.lstrip("."))
            if a.startswith(".") and m:
                unknown = [e for e in m.group(1).split(",") if e not in extras]
                if unknown:
                    raise Reject(f"no extra {unknown} in pyproject.toml (it has {sorted(extras)})")

    # ---- train.py
    def train(self, args: list[str], pwd: Path, where: str) -> str:
        if self.slow and not self._nested:
            return self.run_real(["train.py", *slow_train_args(args, self)], pwd)
        return self.dry_run(args, pwd)

    def dry_run(self, args: list[str], pwd: Path) -> str:
        from absl import flags

        from bert_jax import launch
        from input_pipeline import command_line as cli

        argv = ["train.py", *args] + ([] if "--dry_run" in args else ["--dry_run"])
        train = _train_module()
        fv = flags.FlagValues()
        with _chdir(pwd), _captured() as err, _devices(DRY_RUN_DEVICES), _memoized_parameter_count():
            try:
                train.define_flags(fv, argv)
                rest = train.parse_flags(argv, fv)
                if len(rest) > 1:
                    raise ValueError(f"unexpected arguments: {rest[1:]}")
                config, workdir = fv.config, fv.workdir
                self._substitute_init(config, pwd)
                text = launch.dry_run(config, workdir, hosts=fv.hosts)
            except SystemExit as e:
                raise Reject(f"exit status {e.code}: {err.getvalue().strip()[-1500:]}") from None
            except Exception as e:  # noqa: BLE001
                if cli.is_user_error(e):
                    raise Reject(f"error: {cli.message(e)}") from None
                raise
        if "task" not in config:
            self.produced[_norm(pwd, workdir)] = (int(config.num_train_steps), True)
        else:
            self.produced[_norm(pwd, workdir)] = (0, False)
        return text + "\n"

    def _substitute_init(self, config, pwd: Path) -> None:
        spec = config.get("init_checkpoint", "")
        if not spec or ":" in spec.split("/")[0]:
            return
        key = _norm(pwd, spec)
        if key not in self.produced or Path(key, "checkpoints").is_dir():
            return
        step, _ = self.produced[key]
        if "task" in config:
            config.init_checkpoint = f"hf:{_minilm()}"
        else:
            stub = self.root / ".stubs" / str(abs(hash(key)))
            (stub / "checkpoints" / str(step)).mkdir(parents=True, exist_ok=True)
            config.init_checkpoint = str(stub)

    # ---- python -m TOOL
    def tool(self, module: str, args: list[str], pwd: Path, where: str) -> str | None:
        if self.slow and not self._nested:
            return self.run_real(["-m", module, *slow_tool_args(module, args)], pwd)
        special = {"input_pipeline.build_vocab": self.build_vocab,
                   "input_pipeline.create_pretraining_data": self.create_pretraining_data}
        with _chdir(pwd):
            if module in special:
                return special[module](args, pwd)
            return check_tool_arguments(module, args)

    def build_vocab(self, args: list[str], pwd: Path) -> None:
        from absl import flags

        from input_pipeline import build_vocab as bv
        from input_pipeline import command_line as cli

        fv = flags.FlagValues()
        bv.define_flags(fv)
        rest = _parse_absl(lambda a: cli.parse_absl_flags(a, fv), ["build_vocab", *args])
        if len(rest) > 1:
            raise Reject(f"unexpected arguments: {rest[1:]}")
        _check_input(fv.input)
        out = Path(fv.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(_minilm()) / "vocab.txt", out / "vocab.txt")

    def create_pretraining_data(self, args: list[str], pwd: Path) -> None:
        from absl import flags

        from input_pipeline import create_pretraining_data as cpd
        from input_pipeline.package_data import locate
        from input_pipeline.pretraining.shards import Settings

        fv = flags.FlagValues()
        cpd.define_flags(fv)
        _parse_absl(lambda a: cpd.parse_flags(a, fv), ["create_pretraining_data", *args])
        names = [f.name for f in dataclasses.fields(Settings)]
        settings = Settings(**{n: getattr(fv, n) for n in names})
        try:
            settings.check()
        except ValueError as e:
            raise Reject(f"error: {e}") from None
        _check_input(fv.input)
        if not Path(locate(fv.vocab)).is_file():
            raise Reject(f"--vocab {fv.vocab}: no such file")
        shards = self.fake_shards(settings)
        out = Path(fv.output)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(shards, out)
        if settings.heldout_every:  # the held-out shards' directory too
            held = Path(cpd.heldout_directory(fv.output, fv.heldout_output))
            shutil.rmtree(held, ignore_errors=True)
            shutil.copytree(shards, held)

    def fake_shards(self, s) -> Path:
        return fake_shards(s)

    # ---- slow: real runs
    def run_real(self, args: list[str], pwd: Path) -> str:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(self.home), "TMPDIR": str(self.root / "tmp")}
        env.pop("XLA_FLAGS", None)  # the tests' 8 fake devices: a real run uses the machine's own
        r = subprocess.run([sys.executable, *args], cwd=pwd, env=env, capture_output=True, text=True, timeout=1800)
        if r.returncode:
            raise Reject(f"exit status {r.returncode}: {(r.stdout + r.stderr).strip()[-3000:]}")
        return r.stdout[-2000:]

    # ---- other commands
    def cmd_make(self, args, pwd, where):
        targets = re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M)
        for a in args:
            if "=" not in a and not a.startswith("-") and a not in targets:
                raise Reject(f"make {a}: no such target in the Makefile")

    def cmd_gcloud(self, args, pwd, where):
        command = None
        for i, a in enumerate(args):
            if a.startswith("--command="):
                command = a.split("=", 1)[1]
            elif a == "--command" and i + 1 < len(args):
                command = args[i + 1]
        if command is None:
            return None
        worker = self.root / "worker"
        checkout_view(worker / "bert-jax")
        block = Block(Path(where.split(":")[0]), int(where.rsplit(":", 1)[1]), "sh", command + "\n", "check")
        self._nested += 1
        try:
            return self.run_blocks([block], cwd=worker, substituted=True)  # bash expanded it already
        finally:
            self._nested -= 1

    def cmd_gsutil(self, args, pwd, where):
        args = [a for a in args if a != "-m"]
        if args[:1] == ["mb"]:
            for a in args[1:]:
                Path(pwd, a).mkdir(parents=True, exist_ok=True)
        if args[:1] == ["cp"]:
            paths = [a for a in args[1:] if not a.startswith("-")]
            *sources, dest = paths
            for src in sources:
                s, d = Path(pwd, src), Path(pwd, dest)
                if not s.exists():
                    raise Reject(f"gsutil cp: {src}: no such file or directory")
                if s.is_dir():
                    shutil.copytree(s, d / s.name, dirs_exist_ok=True)
                else:
                    d.mkdir(parents=True, exist_ok=True) if dest.endswith("/") else None
                    shutil.copy(s, d)

    def cmd_wget(self, args, pwd, where):
        out_dir, out_file, urls, accept, i = pwd, None, [], None, 0
        while i < len(args):
            a = args[i]
            if a in ("-P", "-O", "-A") and i + 1 < len(args):
                value = args[i + 1]
                i += 1
                if a == "-P":
                    out_dir = Path(pwd, value)
                elif a == "-O":
                    out_file = Path(pwd, value)
                else:
                    accept = value
            elif a.startswith("http"):
                urls.append(a)
            i += 1
        for url in urls:
            fake_download(url, out_dir, out_file, accept)

    def cmd_unzip(self, args, pwd, where):
        files = [a for a in args if not a.startswith("-")]
        dest = pwd
        if "-d" in args:
            dest = Path(pwd, args[args.index("-d") + 1])
            files = [f for f in files if f != args[args.index("-d") + 1]]
        with zipfile.ZipFile(Path(pwd, files[0])) as z:
            z.extractall(dest)

    def cmd_hf(self, args, pwd, where):
        if args[:1] != ["download"]:
            return None
        local = args[args.index("--local-dir") + 1] if "--local-dir" in args else None
        if local is None:
            raise Reject("hf download without --local-dir: the files land in the Hugging Face cache")
        files = [a for a in args[2:] if not a.startswith("-") and a != local] or ["config.json", "vocab.txt",
                                                                                   "model.safetensors"]
        target = Path(pwd, local)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy(Path(_minilm()) / f, target / f)

    def cmd_git(self, args, pwd, where):
        if args[:1] == ["archive"] and "-o" in args:
            Path(pwd, args[args.index("-o") + 1]).touch()


# --------------------------------------------------------------------------- helpers

_SHARDS: dict[str, Path] = {}  # tiny shards by (length, P, masking, compression), built once per session


def fake_shards(s) -> Path:
    """Tiny real shards with the asked length, predictions, masking and compression, in as many files
    as asked up to 8 (enough for a plan of a few hosts; cached)."""
    from input_pipeline import create_pretraining_data as cpd

    files = min(s.num_shards, 8)
    key = f"L{s.max_seq_length}-P{s.max_predictions_per_seq}-{s.masking}-{s.compression}-{files}"
    if key not in _SHARDS:
        root = Path(tempfile.mkdtemp(prefix="doc-test-shards-"))
        (root / "text.txt").write_text(FAKE_TEXT * 3)
        with _captured():
            cpd.create_pretraining_data(str(root / "text.txt"), str(root / key), str(Path(_minilm()) / "vocab.txt"),
                                        progress=False, max_seq_length=s.max_seq_length,
                                        max_predictions_per_seq=s.max_predictions_per_seq, masking=s.masking,
                                        compression=s.compression, dupe_factor=1, num_shards=files)
        _SHARDS[key] = root / key
    return _SHARDS[key]


@contextlib.contextmanager
def _memoized_parameter_count():
    """Speed only: a dry run counts the model's parameters by tracing its construction (about 2 s
    for BERT-large); the same model, objective and ELECTRA settings are counted once per session."""
    from bert_jax import plan

    real = getattr(plan, "_parameter_count", None)
    if real is None:
        yield
        return

    def counted(model, c):
        key = (repr(model), c.get("objective"), repr(c.get("electra")))
        if key not in _COUNTS:
            _COUNTS[key] = real(model, c)
        return _COUNTS[key]

    plan._parameter_count = counted
    try:
        yield
    finally:
        plan._parameter_count = real


_COUNTS: dict = {}


def fake_download(url: str, out_dir: Path, out_file: Path | None, accept: str | None) -> None:
    """What `Runner.cmd_wget` fakes (see the module docstring)."""
    import fnmatch

    from input_pipeline.package_data import wikipedia_excerpt

    if url.startswith("https://dumps.wikimedia.org/enwiki/"):
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in ("enwiki-latest-pages-articles1.xml-p1p41242.bz2",
                     "enwiki-latest-pages-articles2.xml-p41243p151573.bz2"):
            if accept and not fnmatch.fnmatch(name, accept):
                raise Reject(f"wget -A {accept!r} matches none of the dump's parts, e.g. {name}")
            shutil.copy(wikipedia_excerpt(), out_dir / name)
        return
    name = url.rsplit("/", 1)[-1]
    target = out_file or out_dir / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if url.startswith("https://dl.fbaipublicfiles.com/glue/data/"):
        from tests.fixtures.task_files import GlueFiles

        with tempfile.TemporaryDirectory() as tmp:
            GlueFiles.write(Path(tmp), train_rows=64)  # a batch of 32 twice over: a dry run counts the steps
            if name.endswith(".zip"):
                stem = name[:-4]
                folder = {"QQP-clean": "QQP", "QNLIv2": "QNLI"}.get(stem, stem)
                with zipfile.ZipFile(target, "w") as z:
                    for f in sorted((Path(tmp) / folder).glob("*.tsv")):
                        z.write(f, f"{folder}/{f.name}")
            else:  # AX.tsv
                shutil.copy(next((Path(tmp) / "diagnostic").glob("*.tsv")), target)
        return
    if url.startswith("https://rajpurkar.github.io/SQuAD-explorer/dataset/"):
        from tests.fixtures.task_files import squad_dataset

        version = "2.0" if "v2.0" in name else "1.1"
        data = squad_dataset(version, malformed=False)
        if name.startswith("train"):  # enough questions for a batch of 48, SQuAD 2.0's (ids kept unique)
            for k in range(15):
                for article in squad_dataset(version, malformed=False)["data"]:
                    for qa in article["paragraphs"][0]["qas"]:
                        qa["id"] += f"_{k}"
                    data["data"].append(article)
        target.write_text(json.dumps(data))
        return


def check_tool_arguments(module: str, args: list[str]) -> None:
    """``python -m module args`` up to its argument parsing (see the module docstring)."""
    from absl import app, flags

    from bert_jax.config_args import check_command_line

    # Every public way into argparse, the outermost call stopped once parsed (pytest on Python >= 3.12.8
    # parses with the intermixed ones, which do not go through parse_args or parse_known_args).
    state = {"inner": 0}
    names = [n for n in ("parse_args", "parse_known_args", "parse_intermixed_args", "parse_known_intermixed_args")
             if hasattr(argparse.ArgumentParser, n)]
    originals = {n: getattr(argparse.ArgumentParser, n) for n in names}

    def intercepted(name):
        def method(self, a=None, namespace=None):
            state["inner"] += 1
            try:
                result = originals[name](self, a, namespace)
            finally:
                state["inner"] -= 1
            if state["inner"] == 0:
                extra = [x for x in result[1] if not x.startswith("--config.")] if "known" in name else []
                if extra:
                    raise Reject(f"unrecognized arguments: {' '.join(extra)}")
                raise _Parsed(result)
            return result
        return method

    def run(main, argv=None, flags_parser=None):
        (flags_parser or (lambda a: flags.FLAGS(a)))(list(sys.argv) if argv is None else argv)
        raise _Parsed(None)

    argv = [module, *args]
    if any(a == "--config" or a.startswith("--config=") for a in args):
        try:
            check_command_line(argv)
        except ValueError as e:
            raise Reject(f"error: {e}") from None
    saved = sys.argv, flags.FLAGS, app.run
    sys.argv = argv
    flags.FLAGS = flags.FlagValues()
    app.run = run
    for name in names:
        setattr(argparse.ArgumentParser, name, intercepted(name))
    try:
        with _captured() as err:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules ... prior to execution"
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
            except _Parsed:
                return None
            except ImportError as e:
                raise Reject(f"no module {module}: {e}") from None
            except SystemExit as e:
                if e.code in (0, None):
                    return None
                raise Reject(f"exit status {e.code}: {err.getvalue().strip()[-1500:]}") from None
        raise Reject(f"{module} ran to its end without parsing arguments (nothing to check)")
    finally:
        sys.argv, flags.FLAGS, app.run = saved
        for name, method in originals.items():
            setattr(argparse.ArgumentParser, name, method)


def _parse_absl(parse, argv: list[str]) -> list[str]:
    with _captured() as err:
        try:
            return parse(argv)
        except SystemExit as e:
            raise Reject(f"exit status {e.code}: {err.getvalue().strip()[-1500:]}") from None


def _check_input(spec: str) -> None:
    from input_pipeline.corpora import sources
    from input_pipeline.package_data import locate

    if spec.strip().startswith("tfds:"):
        return
    try:
        sources.list_files(locate(spec))
    except ValueError as e:
        raise Reject(f"error: --input {spec}: {e}") from None


def slow_train_args(args: list[str], runner: Runner) -> list[str]:
    out = []
    config = ""
    for a in args:
        if a.startswith("configs/") and ("size=base" in a or "size=large" in a):
            a = re.sub(r"size=(base|large)", "size=tiny", a)
        out.append(a)
        config = a if a.startswith("configs/") else config
    pretraining = "pretrain.py" in config
    steps = 8 if "phase=2" in config else 4
    if pretraining:
        evaluation = [] if any(a.startswith("--config.eval_every=") for a in args) else \
            ["--config.eval_steps=2", "--config.eval_every=4"]  # a doc's own eval_every (0: off) stays
        return [*out, f"--config.num_train_steps={steps}", "--config.batch_size=8", *evaluation,
                "--config.checkpoint_every=4", "--config.log_every=1"]
    return [*out, "--config.num_train_steps=4", "--config.batch_size=8", "--config.eval_batch_size=8",
            "--config.max_train_examples=64", "--config.max_eval_examples=16", "--config.log_every=1"]


def slow_tool_args(module: str, args: list[str]) -> list[str]:
    rules = {"input_pipeline.build_vocab": {"--vocab_size": lambda n: min(n, 4000)},
             "input_pipeline.create_pretraining_data": {"--dupe_factor": lambda n: 1,
                                                        "--num_shards": lambda n: min(n, 2),
                                                        "--num_workers": lambda n: 1}}.get(module, {})
    out, i = [], 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name in rules:
            if not eq and i + 1 < len(args):
                value = args[i + 1]
                i += 1
            a = f"{name}={rules[name](int(value))}"
        out.append(a)
        i += 1
    return out


_TRAIN = None


def _train_module():
    global _TRAIN
    if _TRAIN is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("doc_test_train", ROOT / "train.py")
        _TRAIN = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_TRAIN)
    return _TRAIN


def _minilm() -> str:
    from input_pipeline.package_data import minilm_model_dir

    return str(minilm_model_dir())


def _norm(pwd: Path, path: str) -> str:
    return os.path.normpath(os.path.join(pwd, path))


@contextlib.contextmanager
def _chdir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _devices(n: int):
    """JAX shows ``n`` devices (the first of the process's) while a dry run plans."""
    import jax

    real = jax.devices
    saved = jax.devices, jax.device_count, jax.local_devices, jax.local_device_count
    jax.devices = lambda *a, **k: real(*a, **k)[:n]
    jax.local_devices = lambda *a, **k: real(*a, **k)[:n]
    jax.device_count = jax.local_device_count = lambda *a, **k: n
    try:
        yield
    finally:
        jax.devices, jax.device_count, jax.local_devices, jax.local_device_count = saved


@contextlib.contextmanager
def _captured():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        yield err


def check_page(blocks: list[Block], root: Path, slow: bool = False) -> Runner:
    runner = Runner(root, slow=slow)
    try:
        runner.output = runner.run_blocks(blocks)
    finally:
        runner.close()
    return runner


def _report(runner: Runner) -> str:
    lines = [str(f) for f in runner.failures]
    return "\n".join(lines) + "\n\nbash's output:\n" + getattr(runner, "output", "")[-3000:]


# --------------------------------------------------------------------------- tests


def _pages_with_shell_blocks():
    return [p for p in PAGES if shell_blocks(p)]


@pytest.mark.parametrize("page", _pages_with_shell_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_commands(page, tmp_path, minilm_dir, wikipedia_dump):  # real data: the conftest policy
    """Every command of every shell block of the page checks (fast: dry runs, parsing, fakes)."""
    runner = check_page(shell_blocks(page), tmp_path)
    print("\n".join(runner.commands))
    assert runner.commands, f"{page}: no command was checked"
    assert not runner.failures, _report(runner)


def test_shell_fences_are_sh():
    """Shell blocks are fenced ```sh, so that they are found (and look alike)."""
    bad = [b.where + f" (```{b.lang})" for p in PAGES for b in shell_blocks(p) if b.lang != "sh"]
    assert not bad, "fence these as ```sh:\n" + "\n".join(bad)


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_between_pages_resolve():
    """Relative links in README.md and docs/ name files that exist, and anchors that are headings there."""
    anchors, bad = {}, []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target, anchor in re.findall(r"\]\((?!https?:|mailto:)([^)#\s]*)(?:#([^)\s]*))?\)", text):
            dest = (page.parent / target).resolve() if target else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} does not exist")
                continue
            if anchor and dest.suffix == ".md":
                if dest not in anchors:
                    body = re.sub(r"```.*?```", "", dest.read_text(encoding="utf-8"), flags=re.S)
                    anchors[dest] = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", body, re.M)}
                if anchor not in anchors[dest]:
                    bad.append(f"{page.relative_to(ROOT)}: {target}#{anchor}: no such heading")
    assert not bad, "\n".join(bad)


SELF_TEST = """\
# doc

```sh
python train.py --config configs/pretrain.py:runlocal --workdir /tmp/ok
```

```sh
python train.py --config configs/pretrain.py:runlocal --workdir /tmp/x --config.data.inptu=x
python -m input_pipeline.no_such_tool --flag
python -m input_pipeline.build_vocab --input pkg:wikipedia --output_dir /tmp/v --vocab_sizee 3
python -m bert_jax.serve --init hf:pkg:minilm --prot 8125
frobnicate --all
python -m input_pipeline.create_pretraining_data --input 'wiki/*.xml.bz2' --output /tmp/p1 --vocab pkg:minilm/vocab.txt
```

```sh
for i in 1 2; do echo $i
```
"""


def test_a_broken_command_fails_the_check(tmp_path, minilm_dir, wikipedia_dump):
    """The checker itself: each broken command of `SELF_TEST` is a failure naming it; the good one passes."""
    page = tmp_path / "page.md"
    page.write_text(SELF_TEST)
    blocks = shell_blocks(page)
    runner = check_page(blocks[:1], tmp_path / "good")
    assert not runner.failures, _report(runner)
    runner = check_page(blocks[1:2], tmp_path / "bad")
    messages = "\n".join(map(str, runner.failures))
    assert len(runner.failures) == 6, messages
    for expected in ("has no key 'inptu'", "no module input_pipeline.no_such_tool", "vocab_sizee", "--prot",
                     "'frobnicate' is not a command", "wiki/*.xml.bz2"):
        assert expected in messages, (expected, messages)
    runner = check_page(blocks[2:], tmp_path / "syntax")
    assert [f.command for f in runner.failures] == ["bash -n"], _report(runner)


def _pages_with_slow_blocks():
    return [p for p in PAGES if any(b.mode == "slow" for b in shell_blocks(p))]


# minutes: real data preparation, pre-training and fine-tuning runs (test_doc_commands checks them fast)
@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_slow_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_blocks_run(page, tmp_path, minilm_dir, wikipedia_dump):
    """The page's ``slow`` blocks run for real at tiny scale (`SLOW_SUBSTITUTIONS`), in order."""
    runner = check_page([b for b in shell_blocks(page) if b.mode == "slow"], tmp_path, slow=True)
    assert runner.commands
    assert not runner.failures, _report(runner)

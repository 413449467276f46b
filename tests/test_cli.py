"""Command-line tools: importable together with no flags defined at import time; each prints its
usage for --help (status 0) and reports a user error as one ``error:`` line with status 2
(input_pipeline/command_line.py)."""

import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags

import bert_jax
import input_pipeline
from bert_jax.interop import extract_features
from input_pipeline import command_line as cli
from input_pipeline import create_pretraining_data

ROOT = Path(__file__).resolve().parent.parent

# Every entry point: how it is started, flags its --help must name, and a realistic mistake
# ({tmp} = a fresh directory; nothing in it exists) with what its one error line must name.
CLIS = {
    "train.py": (["train.py"], ["--config", "--workdir"],
                 ["--config", "configs/pretrain.py:size=tiny", "--workdir", "{tmp}/w", "--config.data.inptu=x"],
                 "--config.data.inptu"),
    "bert_jax.benchmark": (["-m", "bert_jax.benchmark"], ["--model", "--size", "--batch_size", "--output"],
                           ["--model", "albert", "--size", "tiny"], "--size tiny for --model albert"),
    "bert_jax.benchmark.aot": (["-m", "bert_jax.benchmark.aot"], ["compile", "estimate",
                                                                  "--config", "--topology", "--find_max_batch"],
                               ["compile", "--config", "configs/pretrain.py:size=tiny", "--topology", "v2-8"],
                               "--topology 'v2-8'"),
    "bert_jax.benchmark.pipeline": (["-m", "bert_jax.benchmark.pipeline"], ["--source", "--shards", "--masking"],
                                    ["--source", "{tmp}/corpus.txt"], "{tmp}/corpus.txt"),
    "bert_jax.benchmark.profile": (["-m", "bert_jax.benchmark.profile"], ["directory", "--top", "--json"],
                                   ["{tmp}/prof"], "{tmp}/prof/profile.json"),
    "bert_jax.interop.extract_features": (["-m", "bert_jax.interop.extract_features"],
                                          ["--init", "--input", "--output"],
                                          ["--init", "hf:{tmp}/ckpt", "--input", "{tmp}/in.txt", "--output",
                                           "{tmp}/out.npz"], "{tmp}/in.txt"),
    "bert_jax.finetuning.probe": (["-m", "bert_jax.finetuning.probe"], ["--init_checkpoint", "--random_init"],
                                  ["--init_checkpoint", "{tmp}/nope"], "{tmp}/nope"),
    "bert_jax.visualize": (["-m", "bert_jax.visualize"], ["--init", "--text", "--output", "--png", "--layer"],
                           ["--init", "hf:{tmp}/ckpt", "--text", "a cat", "--output", "{tmp}/a.html"], "{tmp}/ckpt"),
    "bert_jax.serve": (["-m", "bert_jax.serve"], ["--init", "--port", "--max_batch", "--max_wait_ms"],
                       ["--init", "{tmp}/workdir"], "{tmp}/workdir"),
    "bert_jax.demo": (["-m", "bert_jax.demo"], ["--workdir", "--corpus"], ["--corpus", "{tmp}/corpus.txt"],
                      "--corpus {tmp}/corpus.txt"),
    "input_pipeline.build_vocab": (["-m", "input_pipeline.build_vocab"], ["--input", "--output_dir", "--vocab_size"],
                                   ["--input", "{tmp}/corpus.txt", "--output_dir", "{tmp}/vocab"], "{tmp}/corpus.txt"),
    "input_pipeline.create_pretraining_data": (["-m", "input_pipeline.create_pretraining_data"],
                                               ["--input", "--output", "--vocab"],
                                               ["--input", "README.md", "--output", "{tmp}/out", "--vocab",
                                                "{tmp}/vocab.txt"], "{tmp}/vocab.txt"),
    "input_pipeline.tasks.squad_metrics": (["-m", "input_pipeline.tasks.squad_metrics"], ["data_file", "pred_file"],
                                           ["{tmp}/dev.json", "{tmp}/pred.json"], "{tmp}/dev.json"),
}
# Log lines of TF's and XLA's native code and of absl logging ("I1125 06:45:18.2 123 file.cc:52] ..."),
# printed at start-up whatever the tool does.
LIBRARY_LOG = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
                         r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] )")


def _run(name, argv, **env):
    command = [sys.executable, *CLIS[name][0], *argv]
    environ = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
    environ.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu", **env)
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300)


def _our_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not LIBRARY_LOG.match(line)]


def test_the_table_has_every_entry_point():
    found = {"train.py"}
    for pkg in ("bert_jax", "input_pipeline"):
        for path in (ROOT / pkg).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if path.name == "__main__.py":
                found.add(module.removesuffix(".__main__"))
            elif re.search(r"^if __name__ == .__main__.:", path.read_text(), re.M):
                found.add(module)
    assert found == set(CLIS)


# The entry points whose ``main`` takes its argv (argparse; serve's reads sys.argv): the fast suite
# runs them in this process (~1 s each instead of ~10 s for a new Python importing TensorFlow and
# JAX); absl's tools, and one argparse tool, start their own process there, every tool in the slow suite.
IN_PROCESS = {
    "bert_jax.benchmark": "bert_jax.benchmark.step", "bert_jax.benchmark.aot": "bert_jax.benchmark.aot",
    "bert_jax.benchmark.pipeline": "bert_jax.benchmark.pipeline",
    "bert_jax.benchmark.profile": "bert_jax.benchmark.profile",
    "bert_jax.finetuning.probe": "bert_jax.finetuning.probe",
    "bert_jax.visualize": "bert_jax.visualize.command", "bert_jax.serve": "bert_jax.serve.__main__",
    "bert_jax.demo": "bert_jax.demo.pipeline",
}
SUBPROCESS_FAST = {"train.py", "input_pipeline.tasks.squad_metrics"}  # absl's convention, argparse's


def _per_process(names):
    return [name if name in SUBPROCESS_FAST else pytest.param(name, marks=pytest.mark.slow) for name in names]


@pytest.mark.parametrize("name", _per_process(sorted(CLIS)))
def test_help(name):
    result = _run(name, ["--help"])
    assert result.returncode == 0, result.stderr[-2000:]
    for flag in CLIS[name][1]:
        assert flag in result.stdout, (flag, result.stdout)


@pytest.mark.parametrize("name", _per_process(sorted(CLIS)))
def test_user_error_is_one_line_with_status_2(name, tmp_path):
    _, _, argv, names = CLIS[name]
    result = _run(name, [a.format(tmp=tmp_path) for a in argv])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = _our_lines(result.stderr)
    assert line.startswith("error: ") and names.format(tmp=tmp_path) in line, line


def _in_process(name, argv, monkeypatch) -> int:
    """Runs entry point ``name`` with ``argv`` here, as its ``python -m`` would (`cli.run`); its status."""
    module = importlib.import_module(IN_PROCESS[name])
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", [name, *argv])
    main = module.main if name == "bert_jax.serve" else lambda: module.main(argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.run(main)
    return exit_info.value.code


def test_every_argparse_entry_point_runs_in_process():
    absl_tools = {"train.py", "bert_jax.interop.extract_features", "input_pipeline.build_vocab",
                  "input_pipeline.create_pretraining_data"}  # flags on absl's global set: a process each
    assert set(IN_PROCESS) | absl_tools | SUBPROCESS_FAST == set(CLIS)


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_help_in_process(name, capsys, monkeypatch):
    assert _in_process(name, ["--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    for flag in CLIS[name][1]:
        assert flag in out, (flag, out)


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_user_error_in_process(name, tmp_path, capsys, monkeypatch):
    _, _, argv, names = CLIS[name]
    assert _in_process(name, [a.format(tmp=tmp_path) for a in argv], monkeypatch) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = _our_lines(err)
    assert line.startswith("error: ") and names.format(tmp=tmp_path) in line, line


@pytest.mark.parametrize("name,argv,names", [
    ("train.py", ["--config", "configs/nope.py", "--workdir", "w"], "--config configs/nope.py: no such config file"),
    ("train.py", ["--config", "configs/pretrain.py:siz=tiny", "--workdir", "w"], "unknown config argument 'siz'"),
    ("train.py", ["--config", "configs/pretrain.py"], "--workdir"),
])
def test_train_config_errors(name, argv, names):
    result = _run(name, argv)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = _our_lines(result.stderr)
    assert line.startswith("error: ") and names in line, line


def test_debug_switch_shows_the_traceback(tmp_path):
    result = _run("input_pipeline.tasks.squad_metrics", [str(tmp_path / "dev.json"), "p.json"],
                  **{cli.DEBUG_ENV: "1"})
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "FileNotFoundError" in result.stderr
    assert result.stderr.splitlines()[-1] == f"error: {tmp_path / 'dev.json'}: No such file or directory"


def test_run_reports_user_errors_and_lets_bugs_through(capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)

    def user_error():
        raise cli.UserError("--thing 3: expected 1 or 2\n(see --help)")

    with pytest.raises(SystemExit) as exit_info:
        cli.run(user_error)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: --thing 3: expected 1 or 2 (see --help)\n"

    def bug():
        raise KeyError("model")

    with pytest.raises(KeyError):  # not a user error: Python prints its traceback
        cli.run(bug)
    with pytest.raises(SystemExit) as exit_info:
        cli.run(lambda: [1, 2])  # a result, not a status
    assert exit_info.value.code == 0


def test_messages_name_the_file():
    assert cli.message(FileNotFoundError(2, "No such file or directory", "a/b.txt")) == \
        "a/b.txt: No such file or directory"
    assert cli.is_user_error(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"))
    assert not cli.is_user_error(KeyError("x")) and not cli.is_user_error(RuntimeError("x"))


def _all_modules():
    for pkg in (bert_jax, input_pipeline):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if not info.name.endswith(".__main__"):  # `python -m` entry points run when imported
                yield info.name


def test_importing_every_module_defines_no_global_flags():
    for name in _all_modules():
        importlib.import_module(name)
    ours = {f for f in flags.FLAGS
            if flags.FLAGS.find_module_defining_flag(f, "").startswith(("bert_jax", "input_pipeline"))}
    assert not ours, f"flags defined at import time (they clash between CLIs in one process): {sorted(ours)}"


@pytest.mark.parametrize("module,argv,required", [
    (create_pretraining_data, ["--input=a.txt", "--output=o", "--vocab=v.txt"], "--output"),
    (extract_features, ["--init=hf:d", "--input=a.txt", "--output=o.npz"], "--init"),
])
def test_define_flags_on_a_fresh_set(module, argv, required):
    fv = flags.FlagValues()
    module.define_flags(fv)
    fv(["prog", *argv])
    assert fv["input"].value == "a.txt"
    missing = flags.FlagValues()
    module.define_flags(missing)
    with pytest.raises(flags.IllegalFlagValueError, match=required.lstrip("-")):
        missing(["prog", *[a for a in argv if not a.startswith(required)]])

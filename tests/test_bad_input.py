"""Bad input, everywhere (issue 19): every command-line tool, on the bad inputs of
tests/fixtures/bad_inputs.py, exits with status 2 after one ``error:`` line (the last on stderr)
naming the file, line, flag or key and what was expected, prints no traceback and writes nothing.

Most cases call the tool's ``main`` in this process, as its ``__main__`` does (a fresh absl flag set
each time; a process per case would cost 5-10 s of imports); `test_command_line` runs a few as
real processes. docs/robustness.md has the table.

    python -m pytest tests/test_bad_input.py -p no:xdist            # the fast cases
    python -m pytest tests/test_bad_input.py -p no:xdist -m slow    # the rest
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from absl import flags

from input_pipeline import command_line as cli
from tests.fixtures.bad_inputs import CASES, CPD, PT, _with, write_files

ROOT = Path(__file__).resolve().parent.parent
MODULES = {"create_pretraining_data": "input_pipeline.create_pretraining_data",
           "build_vocab": "input_pipeline.build_vocab", "extract_features": "bert_jax.interop.extract_features",
           "benchmark": "bert_jax.benchmark.step", "visualize": "bert_jax.visualize.command",
           "serve": "bert_jax.serve.__main__", "squad_metrics": "input_pipeline.tasks.squad_metrics",
           "benchmark.pipeline": "bert_jax.benchmark.pipeline", "benchmark.aot": "bert_jax.benchmark.aot",
           "benchmark.profile": "bert_jax.benchmark.profile",
           "demo": "bert_jax.demo.pipeline", "probe": "bert_jax.finetuning.probe"}
# Cases that build a model or read text through tf.data before they fail (1-15 s each here).
SLOW = {"pretraining data: empty input", "pretraining data: binary input",
        "pretraining data on Beam: invalid UTF-8 (--on_error=raise)",
        "pretraining data: invalid UTF-8 (--on_error=raise)", "features: checkpoint of another size",
        "features: layer out of range", "visualize: length over 512", "pre-training: binary input"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("bad_input"))


def _train_script():
    spec = importlib.util.spec_from_file_location("bert_jax_train_script", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines no flags: define_flags does, on the set it is given
    return module


def run_main(tool: str, argv: list[str], monkeypatch) -> int:
    """Runs ``tool`` as its ``__main__`` would, in this process; returns its exit status."""
    monkeypatch.chdir(ROOT)  # configs/... are relative to the checkout
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    try:
        if tool in ("train.py", "create_pretraining_data", "build_vocab", "extract_features"):  # absl tools
            module = _train_script() if tool == "train.py" else importlib.import_module(MODULES[tool])
            fv = flags.FlagValues()
            if tool == "train.py":
                module.define_flags(fv, [tool, *argv])
                rest = module.parse_flags([tool, *argv], fv)
            else:
                module.define_flags(fv)
                parse = getattr(module, "parse_flags", cli.parse_absl_flags)  # create_pretraining_data's own
                rest = parse([tool, *argv], fv)
            cli.catching(module.main)(rest, fv)
        elif tool == "serve":  # reads sys.argv
            monkeypatch.setattr(sys, "argv", [tool, *argv])
            cli.catching(importlib.import_module(MODULES[tool]).main)()
        else:
            cli.catching(importlib.import_module(MODULES[tool]).main)(argv)
    except SystemExit as e:
        return e.code
    return 0


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    assert "Traceback" not in stderr, stderr[-3000:]
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], stderr[-3000:]
    return lines[-1]


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW else [])
                                  for c in CASES])
def test_bad_input(case, files, tmp_path, capsys, monkeypatch):
    _, tool, argv, expected = case
    out = tmp_path / "out"
    fill = lambda s: s.format(d=files, o=out)  # noqa: E731
    before = tree(files)
    status = run_main(tool, [fill(a) for a in argv], monkeypatch)
    err = capsys.readouterr().err
    assert status == 2, err[-3000:]
    line = error_line(err)
    for text in expected:
        assert fill(text) in line, line
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))
    assert tree(files) == before


def test_the_table():
    """Every entry point (tests/test_cli.py finds them all) has cases; ids are unique; ~30+ cases as
    issue 19 asks."""
    from tests.test_cli import CLIS

    assert {c[1] for c in CASES} == {"train.py", *MODULES}
    run_as = {"benchmark": "bert_jax.benchmark", "visualize": "bert_jax.visualize", "serve": "bert_jax.serve",
              "demo": "bert_jax.demo"}  # python -m <package> runs these tools' main
    assert {"train.py", *(run_as.get(t, m) for t, m in MODULES.items())} == set(CLIS)
    assert len({c[0] for c in CASES}) == len(CASES) >= 30
    assert SLOW <= {c[0] for c in CASES}


def test_the_robustness_page_shows_every_case_and_counts_them():
    """docs/robustness.md's table has one row a case, in the table's order, and its counts are the table's."""
    page = (ROOT / "docs" / "robustness.md").read_text()
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \| `error: ", page, re.M)
    assert [f"{category}: {example}" for category, example in rows] == [c[0] for c in CASES]
    assert f"the {len(CASES)} bad inputs" in page
    assert f"{len(CASES) - len(SLOW)} of the cases run in the fast suite; {len(SLOW)} " in page


def test_divergence_is_one_line_with_status_1(files, tmp_path, capsys, monkeypatch):
    """A NaN loss (bert_jax/training/trainer.py's TrainingDivergedError) ends train.py with one line."""
    from bert_jax import launch
    from bert_jax.training.trainer import TrainingDivergedError

    def diverge(config, workdir, preemption=None):
        raise TrainingDivergedError("loss is nan at step 6; stopping. The last good checkpoint is step 3 in w")

    monkeypatch.setattr(launch, "run", diverge)
    status = run_main("train.py", [a.format(d=files, o=tmp_path) for a in PT], monkeypatch)
    line = error_line(capsys.readouterr().err)
    assert status == 1 and line == "error: loss is nan at step 6; stopping. The last good checkpoint is step 3 in w"


@pytest.mark.slow
@pytest.mark.parametrize("tool,argv,expected", [
    ("train.py", PT + ["--config.num_train_stpes=5"], "--config.num_train_stpes"),
    ("input_pipeline.create_pretraining_data", _with(CPD, "--vocab={d}/nomask.txt"), "no [MASK] token"),
    ("bert_jax.interop.extract_features",
     ["--init=hf:{d}/tiny_hf", "--input={d}/bad_utf8.txt", "--output={o}/f.npz"], "{d}/bad_utf8.txt:2"),
])
def test_command_line(tool, argv, expected, files, tmp_path):
    """The same convention through ``python train.py`` / ``python -m``: status 2, one line, no traceback."""
    fill = lambda s: s.format(d=files, o=tmp_path / "out")  # noqa: E731
    command = [sys.executable, tool] if tool.endswith(".py") else [sys.executable, "-m", tool]
    env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV} | {"TF_CPP_MIN_LOG_LEVEL": "3",
                                                                         "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([*command, *map(fill, argv)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert fill(expected) in error_line(result.stderr)
    assert not (tmp_path / "out").exists()


def quiet(stderr: str) -> str:
    """The one ``error:`` line of ``stderr``, after checking that every other line is a log record
    (absl's, TensorFlow's C++ logging): no traceback, no asyncio "Event loop is closed" noise."""
    line = error_line(stderr)
    lines = [x for x in stderr.splitlines() if x.strip()][:-1]
    noise = [x for x in lines if not re.match(r"([IWEF]\d{4} |WARNING: All log messages before absl)", x)]
    assert not noise and "Event loop is closed" not in stderr, stderr[-3000:]
    return line


def _process_env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
    return env | {"TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"} | changes


@pytest.mark.slow
def test_checkpoint_of_another_size(tmp_path, capsys, monkeypatch):
    """A tiny run's checkpoint as the init_checkpoint of a mini run: status 2, one line naming the
    checkpoint and the first array that does not fit (found from the checkpoint's metadata, before
    any array is read). A mini run resumed in the tiny run's workdir (``python train.py``): one line
    naming the changed model fields, old → new, from the checkpoint's record of its model, and no
    asyncio/Orbax noise. No workdir made or changed."""
    tiny = ["--config=configs/pretrain.py:size=tiny,runlocal,synthetic", "--config.model.vocab_size=101",
            "--config.model.max_position_embeddings=32", "--config.data.max_seq_length=16",
            "--config.data.max_predictions_per_seq=4", "--config.batch_size=8", "--config.num_train_steps=1",
            "--config.eval_every=0", "--config.checkpoint_every=1"]
    mini = [*tiny, "--config.model.size=mini"]
    assert run_main("train.py", [*tiny, f"--workdir={tmp_path / 'tiny'}"], monkeypatch) == 0
    capsys.readouterr()
    before = tree(tmp_path)
    status = run_main("train.py", [*mini, f"--workdir={tmp_path / 'mini'}",
                                   f"--config.init_checkpoint={tmp_path / 'tiny'}"], monkeypatch)
    line = error_line(capsys.readouterr().err)
    assert status == 2 and line.startswith(f"error: {tmp_path / 'tiny' / 'checkpoints' / '1'}: cannot restore"), line
    assert "does not fit this model/optimizer: params/" in line and "is [128] in the checkpoint, [256] here" in line
    result = subprocess.run([sys.executable, "train.py", *mini, f"--workdir={tmp_path / 'tiny'}"], cwd=ROOT,
                            env=_process_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert quiet(result.stderr) == (
        f"error: {tmp_path / 'tiny'} holds a checkpoint of another model: model.hidden_size 128 → 256, "
        "model.num_layers 2 → 4, model.num_heads 2 → 4, model.intermediate_size 512 → 1024; use another "
        "--workdir to start fresh (or restore the old values)")
    assert tree(tmp_path) == before


@pytest.mark.slow
def test_bucket_workdir_without_network_or_credentials(tmp_path):
    """A gs:// workdir that cannot be reached, with no credentials: one line naming the workdir and
    both reasons, status 2, no traceback. Hermetic and quick: the storage clients' proxy and the
    metadata server are names that never resolve (.invalid), so nothing is sent anywhere."""
    proxy = "http://proxy.invalid:3128"
    env = {k: v for k, v in _process_env().items()
           if k not in ("GOOGLE_AUTH_TOKEN_FOR_TESTING", "STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
                        "CURL_CA_BUNDLE", "NO_PROXY", "no_proxy")}
    env |= {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json"), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
            "https_proxy": proxy, "http_proxy": proxy, "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy,
            "GCE_METADATA_HOST": "metadata.invalid", "GCE_METADATA_IP": "metadata.invalid"}
    result = subprocess.run([sys.executable, "train.py", "--config=configs/pretrain.py:size=tiny,runlocal,synthetic",
                             "--config.num_train_steps=2", "--workdir=gs://some-bucket/w"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 2, result.stderr[-3000:]
    line = quiet(result.stderr)
    assert line.startswith("error: --workdir gs://some-bucket/w: cannot reach the storage (Could not resolve "
                           "proxy"), line
    assert f"no Google credentials either: GOOGLE_APPLICATION_CREDENTIALS names {tmp_path / 'key.json'}, which " \
           "does not exist" in line, line


@pytest.mark.slow
def test_pkg_names_wherever_a_path_is_accepted(minilm_dir, files, tmp_path, capsys, monkeypatch):
    """``hf:pkg:minilm`` as README and docs/finetuning.md advertise it, here as extract_features'
    checkpoint (and ``pkg:minilm/vocab.txt`` as its vocabulary): the checkpoint reader every tool
    shares resolves the name (bert_jax.interop.pretrained.read_checkpoint), as the tokenizer's loader
    does for vocabularies."""
    out = tmp_path / "f.npz"
    status = run_main("extract_features", ["--init=hf:pkg:minilm", f"--input={files}/in.txt", f"--output={out}",
                                           "--layers=-1", "--vocab=pkg:minilm/vocab.txt"], monkeypatch)
    assert status == 0, capsys.readouterr().err[-3000:]
    with np.load(out) as features:
        assert features["layer_-1"].shape[::2] == (2, 384)  # two input lines, MiniLM's hidden size

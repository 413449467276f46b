"""Where TensorFlow is absent (a bare GPU machine: JAX, Flax, Optax, Orbax, PyTorch, transformers), the
synthetic-data trainer still runs, evaluates, checkpoints and writes its metrics (tests/fixtures/no_tensorflow),
with XLA options from its config."""

import json
import subprocess
import sys

from bert_jax.training.metric_writer import read_metrics
from tests.fixtures.no_tensorflow import ROOT, environment


def without_tensorflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=environment(), capture_output=True, text=True,
                          timeout=600)


def test_the_fixture_hides_tensorflow():
    r = without_tensorflow("-c", "import importlib.util, sys; assert importlib.util.find_spec('tensorflow') is None; "
                           "import tensorflow")
    assert r.returncode == 1 and "ModuleNotFoundError: No module named 'tensorflow'" in r.stderr, r.stderr


def test_the_synthetic_trainer_runs_without_tensorflow(tmp_path):
    r = without_tensorflow("train.py", "--config", "configs/pretrain.py:size=tiny,synthetic", "--workdir",
                           str(tmp_path), "--config.num_train_steps=4", "--config.batch_size=4",
                           "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
                           "--config.eval_every=2", "--config.eval_steps=1", "--config.checkpoint_every=2",
                           "--config.xla_options=--xla_gpu_dot_merger_threshold_mb=0")  # a GPU's option: none on a CPU
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path / "config.json").read_text())["xla_options"] == "--xla_gpu_dot_merger_threshold_mb=0"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
    assert [r["step"] for r in read_metrics(tmp_path, "eval")] == [0, 2, 4]
    assert [r["step"] for r in read_metrics(tmp_path, "train")] == [2, 4]
    assert list((tmp_path / "tensorboard" / "train").glob("events.out.tfevents.*"))

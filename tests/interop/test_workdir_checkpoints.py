"""A train.py workdir as a checkpoint: `pretrained.read_checkpoint`, `extract_features --init WORKDIR`
and fine-tuning's ``init_checkpoint`` read pre-training and fine-tuning workdirs, their latest step or
one step, the vocabulary from config.json."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from bert_jax import launch
from bert_jax.interop import extract_features as ef
from bert_jax.interop import pretrained
from bert_jax.model.encoder import BertEncoder
from bert_jax.model.weights import load_params
from bert_jax.training.checkpoints import read_params

ROOT = Path(__file__).parents[2]
WORDS = "the a film movie story was good bad great awful and it plot acting".split()


def write_vocab(path: Path, size: int) -> Path:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    path.write_text("\n".join(tokens + [f"w{i}" for i in range(size - len(tokens))]) + "\n")
    return path


@pytest.fixture(scope="module")
def pretraining_workdir(tmp_path_factory, tiny_config):
    """Tiny pre-training on synthetic batches (vocabulary 101, written as data.vocab), checkpoints at
    steps 3 and 6."""
    d = tmp_path_factory.mktemp("pt_workdir")
    config = tiny_config(eval_every=0)
    config.data.vocab = str(write_vocab(d / "vocab.txt", 101))
    launch.run(config, d / "workdir")
    return d / "workdir"


def encoder_of(step_dir: Path, cfg) -> BertEncoder:
    """The encoder of a checkpoint loaded by hand: read_params, then the strict loader."""
    model = nnx.eval_shape(lambda: BertEncoder(cfg, rngs=nnx.Rngs(0)))
    stored, _ = read_params(step_dir)
    model = nnx.merge(*nnx.split(model))
    load_params(model, stored, where=str(step_dir), only="bert")
    return model


def test_read_checkpoint_takes_a_workdir_and_one_step(pretraining_workdir):
    w = pretraining_workdir
    latest = pretrained.read_checkpoint(str(w))
    assert latest.source == "workdir" and latest.path == w / "checkpoints" / "6"
    assert latest.heads == {"pooler": True, "mlm": True, "nsp": True, "rtd": False}
    assert (latest.config.num_layers, latest.config.hidden_size, latest.config.vocab_size) == (2, 128, 101)
    assert Path(latest.vocab_file) == w.parent / "vocab.txt"
    assert pretrained.read_checkpoint(f"orbax:{w}").path == latest.path
    assert pretrained.read_checkpoint(str(w / "checkpoints")).path == latest.path
    assert pretrained.read_checkpoint(str(w / "checkpoints" / "3")).path == w / "checkpoints" / "3"
    model = pretrained.build_model(latest, config=latest.config.deterministic())  # with its MLM and NSP heads
    assert type(model).__name__ == "BertForPreTraining"


def test_extract_features_from_a_workdir_and_a_step(pretraining_workdir, tmp_path):
    w = pretraining_workdir
    (tmp_path / "in.txt").write_text("the film was good\nthe plot was awful ||| it was bad\n")
    ef.run(str(w), tmp_path / "in.txt", tmp_path / "latest.npz", layers=[-1], progress=False)
    ef.run(str(w / "checkpoints" / "3"), tmp_path / "in.txt", tmp_path / "step3.npz", layers=[-1], progress=False)
    latest, step3 = np.load(tmp_path / "latest.npz"), np.load(tmp_path / "step3.npz")
    assert latest["layer_-1"].shape == (2, latest["input_ids"].shape[1], 128)
    assert list(latest["input_ids"][0, :6]) == [2, 5, 7, 10, 11, 3]  # [CLS] the film was good [SEP]
    cfg = pretrained.read_checkpoint(str(w)).config.deterministic()
    for out, step in ((latest, 6), (step3, 3)):
        model = encoder_of(w / "checkpoints" / str(step), cfg)
        expected = model(out["input_ids"], out["input_mask"], out["segment_ids"], deterministic=True)
        np.testing.assert_allclose(out["layer_-1"], np.asarray(expected.sequence_output), atol=1e-5)
    assert not np.allclose(latest["layer_-1"], step3["layer_-1"])  # two steps, two sets of weights


@pytest.mark.slow  # ~15 s: a fine-tuning run
def test_a_finetuning_workdir_and_fine_tuning_from_a_workdir(pretraining_workdir, tmp_path, load_config):
    """Fine-tuning starts from the pre-training workdir (its vocabulary found through config.json);
    the fine-tuning workdir then feeds the reader (its encoder) and the feature tool."""
    lines = [f"{i % 2}\tthe film was {'good great' if i % 2 else 'bad awful'} and the plot" for i in range(24)]
    (tmp_path / "reviews.tsv").write_text("\n".join(lines) + "\n")
    c = load_config("sentiment", "runlocal")
    c.task.source, c.init_checkpoint = str(tmp_path / "reviews.tsv"), str(pretraining_workdir)
    c.num_train_steps, c.log_every, c.progress, c.max_seq_length, c.batch_size = 2, 1, False, 16, 8
    launch.run(c, tmp_path / "ft")
    config = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert config["vocab"] == "" and config["init_checkpoint"] == str(pretraining_workdir)
    ckpt = pretrained.read_checkpoint(str(tmp_path / "ft"))
    assert ckpt.heads == {"pooler": True, "mlm": False, "nsp": False, "rtd": False}
    assert Path(ckpt.vocab_file) == pretraining_workdir.parent / "vocab.txt"  # through its init_checkpoint
    (tmp_path / "in.txt").write_text("the film was good\n")
    ef.run(str(tmp_path / "ft"), tmp_path / "in.txt", tmp_path / "ft.npz", layers=[-1], progress=False)
    out = np.load(tmp_path / "ft.npz")
    model = encoder_of(tmp_path / "ft" / "checkpoints" / "2", ckpt.config.deterministic())
    expected = model(out["input_ids"], out["input_mask"], out["segment_ids"], deterministic=True)
    np.testing.assert_allclose(out["layer_-1"], np.asarray(expected.sequence_output), atol=1e-5)


def test_several_seeds_name_their_runs(tmp_path):
    for seed in (0, 1):
        (tmp_path / f"seed_{seed}" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"a fine-tuning workdir of 2 seeds.*name one, e.g. .*seed_0"):
        pretrained.read_checkpoint(str(tmp_path))
    (tmp_path / "seed_0" / "checkpoints" / "4" / "state").mkdir(parents=True)
    assert pretrained.workdir_step(tmp_path / "seed_0") == tmp_path / "seed_0" / "checkpoints" / "4"


def test_a_workdir_without_a_checkpoint_says_so(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="a workdir without a checkpoint yet"):
        pretrained.read_checkpoint(str(tmp_path))


@pytest.mark.slow  # ~2 min: the README's first run (shortened to 20 steps), then the tool as a process
def test_the_first_runs_workdir_feeds_extract_features(tmp_path, minilm_dir):
    env = {**os.environ, "XLA_FLAGS": ""}
    w = tmp_path / "w"
    subprocess.run([sys.executable, "train.py", "--config", "configs/pretrain.py:runlocal", "--workdir", str(w),
                    "--config.num_train_steps=20", "--config.checkpoint_every=20", "--config.eval_every=20"],
                   cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=900)
    (tmp_path / "in.txt").write_text("The cat sat on the mat.\nA feline rested. ||| It was asleep.\n")
    done = subprocess.run([sys.executable, "-m", "bert_jax.interop.extract_features", "--init", str(w),
                           "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.jsonl"),
                           "--layers=-1,-2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["linex_index"] for r in rows] == [0, 1]
    first = rows[0]["features"]
    assert [t["token"] for t in first] == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert [layer["index"] for layer in first[0]["layers"]] == [-1, -2]
    assert len(first[0]["layers"][0]["values"]) == 128  # the tiny model's width

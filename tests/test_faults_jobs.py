"""Fault injection beyond pre-training: ``create_pretraining_data`` killed mid-write and re-run,
fine-tuning killed (SIGTERM, SIGKILL) and resumed, compared with uninterrupted runs
(docs/robustness.md)."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from tests.fixtures.fault_runs import PRETRAIN, TIMEOUT, Run, losses, train


@pytest.fixture(scope="module")
def env(fault_env):
    """The subprocesses' environment (tests/fixtures/fault_runs.py)."""
    return fault_env


@pytest.mark.slow
def test_create_pretraining_data_killed_mid_write(tmp_path, env):
    """Killed while writing shards: no summary.json, the directory is refused as training input
    with one line, a glob never matches a shard being written; the re-run writes what an
    uninterrupted run writes."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "input_pipeline.create_pretraining_data", "--input", "pkg:wikipedia",
           "--vocab", "pkg:minilm/vocab.txt", "--output", str(out), "--max_seq_length", "64",
           "--max_predictions_per_seq", "10", "--dupe_factor", "3", "--num_shards", "4", "--num_workers", "1",
           "--noprogress"]
    run = Run(cmd, env)
    deadline = time.time() + TIMEOUT
    while not list(out.glob("pretrain-*")) and time.time() < deadline and run.proc.poll() is None:
        time.sleep(0.05)
    run.proc.kill()
    run.finish()
    written = sorted(p.name for p in out.glob("pretrain-*"))
    assert written and not (out / "summary.json").exists(), written
    data_args = [*PRETRAIN, "--config.data.kind=pretraining", "--config.data.vocab=pkg:minilm/vocab.txt",
                 "--config.num_train_steps=2"]
    refused = train(tmp_path / "w", env, f"--config.data.input={out}", args=data_args)
    assert refused.finish() == 2 and "did not finish" in refused.lines[-1], refused.log[-2000:]
    again = Run(cmd, env)
    assert again.finish() == 0, again.log[-3000:]
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    straight_out = tmp_path / "straight"
    ref = Run([*cmd[:cmd.index("--output") + 1], str(straight_out), *cmd[cmd.index("--output") + 2:]], env)
    assert ref.finish() == 0
    for shard in sorted(straight_out.glob("pretrain-*")):
        assert (out / shard.name).read_bytes() == shard.read_bytes(), shard.name
    print("create_pretraining_data killed with", written, "on disk")


@pytest.mark.slow
def test_finetuning_killed_and_resumed(tmp_path, env, conll_text, minilm_dir):
    """NER fine-tuning: SIGTERM mid-run then SIGKILL mid-run, each resumed: the same losses and the
    same results.json as an uninterrupted run."""
    data = tmp_path / "conll"
    data.mkdir()
    (data / "train.txt").write_text("\n\n".join([conll_text] * 12))
    (data / "valid.txt").write_text(conll_text)
    (data / "test.txt").write_text(conll_text)
    args = ["--config", "configs/ner.py:runlocal", f"--config.task.source={data}",
            f"--config.vocab={minilm_dir / 'vocab.txt'}", "--config.num_train_steps=30", "--config.checkpoint_every=10",
            "--config.log_every=1", "--config.progress=False", "--config.batch_size=4"]
    ref = train(tmp_path / "straight", env, args=args)
    assert ref.finish() == 0, ref.log[-3000:]
    workdir = tmp_path / "resumed"
    for sig, at in ((signal.SIGTERM, 7), (signal.SIGKILL, 23)):
        run = train(workdir, env, args=args)
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and max(losses(workdir) if (workdir / "metrics.jsonl").exists() else {},
                                             default=0) < at:
            time.sleep(0.05)
        run.proc.send_signal(sig)
        rc = run.finish()
        assert rc == (0 if sig == signal.SIGTERM else -signal.SIGKILL), run.log[-3000:]
        assert not (workdir / "results.json").exists()
    run = train(workdir, env, args=args)
    assert run.finish() == 0, run.log[-3000:]
    expected, got = losses(tmp_path / "straight"), losses(workdir)
    assert got == expected
    a = json.loads((tmp_path / "straight" / "results.json").read_text())["per_seed"]
    b = json.loads((workdir / "results.json").read_text())["per_seed"]
    assert a == b

"""Fault injection: the real ``train.py`` and ``create_pretraining_data`` in subprocesses, killed
(SIGKILL, SIGTERM) at random steps and during saves, two trainers on one workdir, corrupted
checkpoint files, a file size limit as a full disk. Every resume is compared bit for bit with an
uninterrupted run (every step's loss in ``metrics.jsonl`` and the final state's fingerprint).

``BERT_JAX_FAULT_SEED`` picks the kill points (default 0); the figures of one run of this suite are
in docs/robustness.md. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
TIMEOUT = 300  # seconds any one process may take
STEPS, EVERY = 80, 10
# Tiny pre-training on synthetic batches, slow enough (~5 steps/s) that a kill lands mid-run.
PRETRAIN = ["--config", "configs/pretrain.py:size=tiny,runlocal,synthetic", f"--config.num_train_steps={STEPS}",
            f"--config.checkpoint_every={EVERY}", "--config.log_every=1", "--config.eval_every=7",
            "--config.eval_steps=2", "--config.batch_size=16", "--config.data.max_seq_length=64",
            "--config.data.max_predictions_per_seq=10", f"--config.optimizer.num_train_steps={STEPS}",
            "--config.optimizer.warmup_steps=4", "--config.prefetch_batches=2"]


class Run:
    """A subprocess whose merged output is read line by line in a thread."""

    def __init__(self, args: list[str], env: dict, preexec_fn=None):
        self.t0 = time.time()
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, preexec_fn=preexec_fn)
        self.lines: list[str] = []
        self._new: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)
        self._new.put(None)

    def wait_for(self, pattern: str, timeout: float = TIMEOUT) -> re.Match | None:
        """The first new line matching ``pattern``; None if the process ends first."""
        deadline = time.time() + timeout
        while True:
            try:
                line = self._new.get(timeout=max(deadline - time.time(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} in {timeout} s:\n" + self.log[-3000:]) from None
            if line is None:
                return None
            m = re.search(pattern, line)
            if m:
                return m

    def finish(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running after {timeout} s:\n" + self.log[-3000:]) from None

    @property
    def log(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The subprocesses' environment: one CPU device, a shared compilation cache (faster starts)."""
    cache = tmp_path_factory.mktemp("jax_cache")
    return {**os.environ, "XLA_FLAGS": "", "JAX_COMPILATION_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": "",
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "PYTHONPATH": str(ROOT)}


def train(workdir, env, *extra, args=PRETRAIN, preexec_fn=None) -> Run:
    return Run([sys.executable, "train.py", "--workdir", str(workdir), *args, *extra], env, preexec_fn)


def losses(workdir) -> dict[int, float]:
    """Each step's logged training loss; a step logged twice (run, killed, resumed) keeps the last."""
    out = {}
    for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut by SIGKILL (the row is written again after the resume)
            continue
        if row["split"] == "train":
            out[row["step"]] = row["loss"]
    return out


def committed(workdir) -> list[int]:
    from bert_jax.training.checkpoints import Checkpointer

    return Checkpointer(workdir, async_save=False).committed_steps()


def final_fingerprint(workdir, step: int) -> dict:
    return json.loads((Path(workdir) / "checkpoints" / str(step) / "meta" / "metadata").read_text())["fingerprint"]


def wait_for_tmp_checkpoint(directory: Path, step: int, timeout: float = 10.0) -> bool:
    """Waits until Orbax's temporary directory of ``step`` appears (the save is writing)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(name.startswith(f"{step}.orbax-checkpoint-tmp") for name in
               (os.listdir(directory) if directory.is_dir() else [])):
            return True
        time.sleep(0.001)
    return False


@pytest.fixture(scope="module")
def straight(tmp_path_factory, env):
    """The uninterrupted run every interrupted one is compared with."""
    workdir = tmp_path_factory.mktemp("straight")
    run = train(workdir, env)
    assert run.finish() == 0, run.log[-3000:]
    return workdir


# --------------------------------------------------------------------------------------- fast


def test_second_trainer_is_refused_while_the_first_holds_the_lock(tmp_path, env):
    """The lock of a live trainer (this process) refuses train.py with one line, exit status 2,
    before anything is written."""
    from bert_jax.training.workdir_lock import WorkdirLock

    with WorkdirLock(tmp_path):
        run = train(tmp_path, env)
        assert run.finish() == 2, run.log[-3000:]
    assert run.lines[-1].startswith(f"error: {tmp_path} is in use by another trainer (pid {os.getpid()} on ")
    assert "Traceback" not in run.log
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no config.json, no checkpoints


# --------------------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_killed_runs_resume_bit_exactly(straight, tmp_path, env):
    """One workdir, killed again and again (SIGKILL and SIGTERM, at random steps and right after a
    checkpoint step, i.e. during its asynchronous save), resumed each time: every step's loss and
    the final state are those of the uninterrupted run."""
    rng = random.Random(int(os.environ.get("BERT_JAX_FAULT_SEED", "0")))
    plan = [("SIGKILL", "random"), ("SIGTERM", "random"), ("SIGKILL", "save"), ("SIGTERM", "save"),
            ("SIGKILL", "random"), ("SIGTERM", "random"), ("SIGKILL", "save"), ("SIGTERM", "save")]
    report = []
    for sig_name, where in plan:
        before = committed(tmp_path)
        start = max(before, default=0)
        if start >= STEPS - 2:
            break
        # a save step: the first after the start; random: 1-12 steps after the start
        at = (start // EVERY + 1) * EVERY if where == "save" else min(start + rng.randint(1, 12), STEPS - 1)
        run = train(tmp_path, env)
        if start:
            assert run.wait_for(r"resumed from .* at step (\d+)").group(1) == str(start)
        assert run.wait_for(rf"^step {at}/") is not None, run.log[-3000:]
        mid_write = where == "save" and wait_for_tmp_checkpoint(tmp_path / "checkpoints", at)
        sent = time.time()
        run.proc.send_signal(getattr(signal, sig_name))
        rc = run.finish()
        grace = time.time() - sent
        after = committed(tmp_path)
        if sig_name == "SIGTERM":
            saved = int(re.search(r"SIGTERM received: saved a checkpoint at step (\d+); exiting", run.log).group(1))
            assert rc == 0 and saved >= at and saved in after, (rc, saved, after, run.log[-3000:])
        else:
            assert rc == -signal.SIGKILL
            saved = max(after, default=0)
        report.append({"signal": sig_name, "where": where, "at_step": at, "mid_write": mid_write,
                       "resumes_from": saved, "exit_s": round(grace, 1)})
    run = train(tmp_path, env)
    assert run.finish() == 0, run.log[-3000:]
    print("fault report:", json.dumps(report))
    assert len(report) >= 4 and any(r["mid_write"] for r in report)
    expected = losses(straight)
    got = losses(tmp_path)
    assert sorted(got) == sorted(expected) and all(got[s] == expected[s] for s in expected), \
        [(s, expected[s], got.get(s)) for s in expected if got.get(s) != expected[s]]
    assert final_fingerprint(tmp_path, STEPS) == final_fingerprint(straight, STEPS)


@pytest.mark.slow
def test_sigterm_during_start_up_and_evaluation(tmp_path, env):
    """SIGTERM before the first step exits 0 saving nothing new; SIGTERM during an evaluation saves
    the step the evaluation belongs to (it is complete)."""
    run = train(tmp_path, env, "--config.eval_steps=400", "--config.eval_every=10")  # long evaluation at 10
    assert run.wait_for(r"^step 10/") is not None
    time.sleep(1.0)  # inside the evaluation
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.log[-3000:]
    assert "SIGTERM received: saved a checkpoint at step 10; exiting" in run.log, run.log[-3000:]
    assert committed(tmp_path) == [10] and "eval at step 10" not in run.log
    run = train(tmp_path, env)
    assert run.wait_for(r"SIGTERM|Unable to initialize backend|resumed from", timeout=TIMEOUT) is not None
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0, run.log[-3000:]
    assert re.search(r"SIGTERM received (before the first step|: saved a checkpoint at step 1\d)", run.log), \
        run.log[-3000:]


@pytest.mark.slow
def test_two_trainers_started_together(tmp_path, env):
    """Two train.py on one workdir, 1 s apart: one runs to the end, the other is refused with one line."""
    first = train(tmp_path, env)
    time.sleep(1.0)
    second = train(tmp_path, env)
    codes = sorted([first.finish(), second.finish()])
    assert codes == [0, 2], (codes, first.log[-2000:], second.log[-2000:])
    refused = first if first.proc.returncode == 2 else second
    assert re.match(r"error: .* is in use by another trainer \(pid \d+ on ", refused.lines[-1]), refused.log[-2000:]
    assert max(committed(tmp_path)) == STEPS and not (tmp_path / "LOCK").exists()


@pytest.mark.slow
def test_corrupted_checkpoint_is_named_and_previous_resumes(straight, tmp_path, env):
    """A flipped byte and a truncated file in the newest checkpoint: one line naming it (exit 2),
    nothing started from scratch; --config.restore=previous resumes from the one before and ends on
    the uninterrupted run's state."""
    import shutil

    shutil.copytree(straight / "checkpoints", tmp_path / "checkpoints", ignore=shutil.ignore_patterns(str(STEPS)))
    shutil.copy(straight / "metrics.jsonl", tmp_path / "metrics.jsonl")
    newest = tmp_path / "checkpoints" / str(STEPS - EVERY)  # keep_checkpoints=3: 60, 70
    data = max((p for p in (newest / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
               key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    for mode in ("flip", "truncate"):
        if mode == "flip":
            raw[len(raw) // 3] ^= 0x55
            data.write_bytes(bytes(raw))
        else:
            data.write_bytes(bytes(raw[: len(raw) // 2]))
        run = train(tmp_path, env)
        assert run.finish() == 2, run.log[-3000:]
        assert re.match(r"error: .*checkpoints/70: cannot restore the checkpoint of step 70: .*"
                        r"--config.restore=previous resumes from step 60", run.lines[-1]), run.lines[-1]
        assert "Traceback" not in run.log and committed(tmp_path) == [60, 70]
    run = train(tmp_path, env, "--config.restore=previous")
    assert run.finish() == 0, run.log[-3000:]
    assert "resumed from" in run.log and "at step 60" in run.log
    assert committed(tmp_path)[-1] == STEPS and final_fingerprint(tmp_path, STEPS) == final_fingerprint(straight, STEPS)
    assert [p.name.split(".")[0] for p in (tmp_path / "checkpoints_set_aside").iterdir()] == ["70"]


@pytest.mark.slow
def test_file_size_limit_fails_cleanly(tmp_path, env):
    """A full disk as RLIMIT_FSIZE (1 MB; SIGXFSZ ignored, so writes fail with EFBIG): one line
    naming the checkpoint directory, no committed checkpoint that does not restore."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    run = train(tmp_path, env, "--config.checkpoint_every=5", preexec_fn=limit)
    rc = run.finish()
    assert rc == 2, run.log[-3000:]
    assert re.match(r"error: .*checkpoints: saving a checkpoint failed \(.*\); the committed checkpoints are intact",
                    run.lines[-1]), run.lines[-1]
    assert committed(tmp_path) == []  # nothing half-written under a step's name
    run = train(tmp_path, env, "--config.num_train_steps=5", "--config.checkpoint_every=5")
    assert run.finish() == 0, run.log[-3000:]  # the leftovers do not stop the next run
    assert committed(tmp_path) == [5]


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

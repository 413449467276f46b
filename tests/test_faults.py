"""Fault injection: the real ``train.py`` in subprocesses, killed (SIGKILL, SIGTERM) at random
steps and during saves, two trainers on one workdir, corrupted checkpoint files, a file size limit
as a full disk. Every resume is compared bit for bit with an uninterrupted run (every step's loss
in ``metrics.jsonl`` and the final state's fingerprint). tests/test_faults_jobs.py does the same for
``create_pretraining_data`` and fine-tuning.

``BERT_JAX_FAULT_SEED`` picks the kill points (default 0); the figures of one run of this suite are
in docs/robustness.md. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import signal
import time

import pytest

from tests.fixtures.fault_runs import (
    EVERY,
    STEPS,
    TIMEOUT,
    committed,
    final_fingerprint,
    losses,
    train,
    wait_for_tmp_checkpoint,
)


@pytest.fixture(scope="module")
def env(fault_env):
    """The subprocesses' environment (tests/fixtures/fault_runs.py)."""
    return fault_env


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
def test_sigint_saves_within_a_step_of_the_signal(tmp_path, env):
    """Ctrl-C with progress logged every 40 steps and no checkpoint or evaluation due, where the host
    could queue steps as far as the next log line (it did before it waited for each step: signalled
    0.3 s after the step-80 line, such a run saved step 117): the checkpoint is within a step of where
    the devices were when the signal came, estimated from the rate the step-80 line reports (twice
    that rate, for a busy machine) and the time since that line."""
    run = train(tmp_path, env, "--config.num_train_steps=200", "--config.optimizer.num_train_steps=200",
                "--config.log_every=40", "--config.checkpoint_every=1000", "--config.eval_every=0")
    line = run.wait_for(r"^step 80/.* ([0-9.]+) steps/s")
    assert line is not None, run.log[-3000:]
    seen = time.time()
    time.sleep(0.3)
    run.proc.send_signal(signal.SIGINT)
    elapsed, rate = time.time() - seen, float(line.group(1))
    assert run.finish() == 0, run.log[-3000:]
    saved = int(re.search(r"SIGINT received: saved a checkpoint at step (\d+); exiting", run.log).group(1))
    assert 80 < saved <= 80 + 2 * rate * elapsed + 2, (saved, rate, elapsed, run.log[-3000:])
    assert committed(tmp_path) == [saved]


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

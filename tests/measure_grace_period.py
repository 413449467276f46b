r"""Measures the grace period a preempted trainer needs: seconds from SIGTERM to the committed
checkpoint's message and to the process's exit (docs/robustness.md has the figures).

    python tests/measure_grace_period.py --size tiny --trials 3
    python tests/measure_grace_period.py --size base --trials 2 --batch 8

Runs ``train.py`` on synthetic batches (length 128), sends SIGTERM after step ``--at`` is logged,
and prints one JSON line per trial and their maximum.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]


def trial(size: str, batch: int, at: int, workdir: str, vocab: int) -> dict:
    cmd = [sys.executable, "train.py", "--config", "configs/pretrain.py:runlocal,synthetic",
           "--workdir", workdir, f"--config.model.size={size}", f"--config.batch_size={batch}",
           f"--config.model.vocab_size={vocab}",
           "--config.log_every=1", "--config.eval_every=0", "--config.checkpoint_every=1000",
           "--config.num_train_steps=1000"]
    env = {**os.environ, "XLA_FLAGS": "", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sent = saved = None
    step_s = []
    last = None
    for line in proc.stdout:
        m = re.match(r"step (\d+)/", line)
        if m and sent is None:
            now = time.time()
            if last is not None:
                step_s.append(now - last)
            last = now
            if int(m.group(1)) >= at:
                proc.send_signal(signal.SIGTERM)
                sent = time.time()
        if sent and "saved a checkpoint at step" in line:
            saved = time.time()
    proc.wait(timeout=600)
    done = time.time()
    return {"size": size, "batch": batch, "vocab": vocab, "step_s": round(min(step_s), 2) if step_s else None,
            "to_committed_s": round(saved - sent, 1) if saved else None, "to_exit_s": round(done - sent, 1),
            "rc": proc.returncode}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="tiny")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--at", type=int, default=3)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--vocab", type=int, default=30522)
    a = p.parse_args()
    rows = []
    for _ in range(a.trials):
        with tempfile.TemporaryDirectory() as workdir:
            rows.append(trial(a.size, a.batch, a.at, workdir, a.vocab))
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"max_to_committed_s": max(r["to_committed_s"] or 0 for r in rows),
                      "max_to_exit_s": max(r["to_exit_s"] for r in rows)}))


if __name__ == "__main__":
    main()

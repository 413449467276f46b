"""One writer per workdir: ``<workdir>/LOCK`` names the trainer that holds it.

The lock is a JSON file (pid, host, the process's start time in clock ticks since boot from
``/proc/<pid>/stat`` so that a reused pid is not taken for the holder, when it started, its command
line). A local lock is created atomically: the JSON goes to a file of its own, which is then
hard-linked to ``LOCK`` (``os.link`` fails if ``LOCK`` exists), so of two trainers started at once
exactly one gets it. The other is refused with `WorkdirBusyError` (one line naming the holder;
``train.py`` exits with status 2). A lock whose holder is gone (same host, that pid not running or
running with another start time) is stale: it is taken over with a warning. A lock from another host
cannot be checked from here: it is refused, and the message says how to remove it.

``gs://`` (any URL) workdirs have no atomic create-if-absent through ``epath``: the lock is written
if absent and read back, which catches a second trainer started later but not two started within
the same second (best effort, docs/robustness.md). Only process 0 of a multi-process job takes it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import sys
from pathlib import Path

from input_pipeline.command_line import UserError

log = logging.getLogger(__name__)

LOCK_NAME = "LOCK"


class WorkdirBusyError(UserError):
    """Another trainer holds the workdir's lock."""


def process_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time, clock ticks after boot); None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])  # fields after "(comm)" start at field 3


def this_holder() -> dict:
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "pid_start": process_start_time(pid),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)}


def describe(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}: "
            f"{holder.get('command', '?')}")


def is_stale(holder: dict) -> bool:
    """Whether a lock written on this host belongs to a process that is gone."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    start = process_start_time(holder["pid"])
    return start is None or (holder.get("pid_start") is not None and start != holder["pid_start"])


def _read(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # half-written by a process killed while writing it: a holder that is gone


class WorkdirLock:
    """``with WorkdirLock(workdir):`` holds ``<workdir>/LOCK`` (the directory is created)."""

    def __init__(self, workdir):
        from bert_jax.training.checkpoints import as_path

        self.workdir = as_path(workdir)
        self.path = self.workdir / LOCK_NAME
        self.remote = "://" in os.fspath(workdir)
        self.holder = this_holder()
        self.held = False

    def acquire(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.holder) + "\n"
        for _ in range(3):
            if self._try_create(text):
                self.held = True
                return
            holder = _read(self.path)
            if holder and not is_stale(holder):
                where = "" if holder.get("host") == socket.gethostname() else (
                    f"; it was taken on another host: if no trainer runs there any more, delete {self.path}")
                raise WorkdirBusyError(f"{self.workdir} is in use by another trainer ({describe(holder)}){where}")
            log.warning("%s: taking over the lock of a trainer that is gone (%s)", self.path,
                        describe(holder) if holder else "unreadable lock file")
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        raise WorkdirBusyError(f"{self.path}: could not take the lock (other trainers keep taking it)")

    def _try_create(self, text: str) -> bool:
        if self.remote:  # no atomic create-if-absent: write if absent, then read back
            if self.path.exists():
                return False
            self.path.write_text(text)
            return _read(self.path) == self.holder
        tmp = Path(f"{self.path}.{os.getpid()}.tmp")
        tmp.write_text(text)
        try:
            os.link(tmp, os.fspath(self.path))
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def release(self) -> None:
        if self.held and _read(self.path) == self.holder:  # never delete a lock someone took over
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self.held = False

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

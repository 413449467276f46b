"""One writer per workdir: the lock is taken atomically, refused while its holder runs, taken over
from a holder that is gone, refused from another host, released on the way out."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax.training.workdir_lock import WorkdirBusyError, WorkdirLock, process_start_time


def test_second_lock_is_refused_and_released_on_exit(tmp_path):
    with WorkdirLock(tmp_path):
        holder = json.loads((tmp_path / "LOCK").read_text())
        assert holder["pid"] == os.getpid() and holder["pid_start"] == process_start_time(os.getpid())
        with pytest.raises(WorkdirBusyError, match=rf"in use by another trainer \(pid {os.getpid()} on "):
            WorkdirLock(tmp_path).acquire()
    assert not (tmp_path / "LOCK").exists()
    with pytest.raises(RuntimeError), WorkdirLock(tmp_path):  # released on exceptions too
        raise RuntimeError
    assert not (tmp_path / "LOCK").exists()


def test_stale_lock_is_taken_over(tmp_path, caplog):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = WorkdirLock(tmp_path)
    stale = {**lock.holder, "pid": int(dead.stdout)}
    (tmp_path / "LOCK").write_text(json.dumps(stale))
    with lock:
        assert json.loads((tmp_path / "LOCK").read_text()) == lock.holder
    assert "taking over the lock of a trainer that is gone" in caplog.text
    # pid reused by another process: same pid, another start time
    (tmp_path / "LOCK").write_text(json.dumps({**lock.holder, "pid_start": lock.holder["pid_start"] - 1}))
    with WorkdirLock(tmp_path):
        pass


def test_other_host_lock_is_refused_with_how_to_remove_it(tmp_path):
    (tmp_path / "LOCK").write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "x", "command": "c"}))
    with pytest.raises(WorkdirBusyError, match=r"pid 1 on elsewhere.*another host.*delete .*LOCK"):
        WorkdirLock(tmp_path).acquire()
    assert json.loads((tmp_path / "LOCK").read_text())["host"] == "elsewhere"


def test_object_store_lock_writes_then_reads_back(tmp_path):
    """gs:// workdirs (no atomic create-if-absent): the same refusal and release through the
    write-then-read-back path, exercised on a local directory."""
    first = WorkdirLock(tmp_path)
    first.remote = True
    with first:
        second = WorkdirLock(tmp_path)
        second.remote = True
        with pytest.raises(WorkdirBusyError, match="in use by another trainer"):
            second.acquire()
    assert not (tmp_path / "LOCK").exists()

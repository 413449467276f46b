"""Runs a function in N JAX processes on this machine, as the processes of one multi-host job.

`run_processes("tests.training.test_multiprocess:job", 2, kwargs)` starts N Python processes
(``python -m tests.multiprocess SPEC``), each with K fake CPU devices and its own environment; in
process i it calls ``job(distributed=..., **kwargs)``, where ``distributed`` is the
``config.distributed`` section that makes ``config.multihost`` join the others (coordinator on
127.0.0.1 at a free port, gloo collectives, short timeouts). The function's JSON-able return value
comes back per process, with its exit status and its log. A global timeout kills every process
still running; every child is killed when the call ends, whatever happens.

The children do not share the tests' persistent compilation cache: JAX's cache keys differ between
processes and only process 0 writes, so process 0 would load while the others compile, and gloo
fails a collective that one process reaches more than 30 s before another.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]


@dataclasses.dataclass
class ProcessResult:
    process_id: int
    returncode: int | None  # None: killed at the timeout
    value: object  # the function's return value (None if it did not return)
    log: str  # stdout and stderr
    seconds: float  # from the start of the first process to the end of this one

    def tail(self, n: int = 3000) -> str:
        return f"--- process {self.process_id} (exit {self.returncode}) ---\n{self.log[-n:]}"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def distributed_section(port: int, num_processes: int, process_id: int, *, heartbeat_timeout: int = 10,
                        initialization_timeout: int = 60, shutdown_timeout: int = 30) -> dict:
    """``config.distributed`` for process ``process_id`` of a job on this machine."""
    return dict(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes, process_id=process_id,
                cpu_collectives="gloo", initialization_timeout=initialization_timeout,
                heartbeat_timeout=heartbeat_timeout, shutdown_timeout=shutdown_timeout)


def run_processes(target: str, num_processes: int, kwargs: dict | None = None, *, log_dir: Path,
                  devices_per_process: int = 2, timeout: float = 180, env: list[dict] | None = None,
                  check: bool = True, distributed: dict | None = None) -> list[ProcessResult]:
    """Runs ``target`` ("module:function") in ``num_processes`` processes; see the module docstring.

    ``env``: extra environment variables per process. ``distributed``: overrides of
    `distributed_section`'s timeouts. ``check``: raise AssertionError (with the logs) unless every
    process exits 0.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("result_*.json"):
        old.unlink()
    port = free_port()
    procs, logs, killed, ended = [], [], set(), {}
    start = time.monotonic()
    try:
        for i in range(num_processes):
            spec = {"target": target, "kwargs": kwargs or {}, "result": str(log_dir / f"result_{i}.json"),
                    "distributed": distributed_section(port, num_processes, i, **(distributed or {}))}
            (log_dir / f"spec_{i}.json").write_text(json.dumps(spec))
            child_env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
                         "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2",
                         "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                         **((env or [{}] * num_processes)[i])}
            for name in ("PYTEST_XDIST_WORKER", "JAX_COMPILATION_CACHE_DIR"):
                child_env.pop(name, None)
            logs.append(open(log_dir / f"log_{i}.txt", "wb"))  # noqa: SIM115 (closed in finally)
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.multiprocess", str(log_dir / f"spec_{i}.json")],
                                          cwd=ROOT, env=child_env, stdout=logs[-1], stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        while len(ended) < len(procs) and time.monotonic() < deadline:
            ended.update({i: time.monotonic() - start for i, p in enumerate(procs) if i not in ended
                          and p.poll() is not None})
            time.sleep(0.2)
    finally:
        for i, p in enumerate(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # its own session: the child and anything it started
                p.wait()
                killed.add(i)
        for f in logs:
            f.close()
    results = []
    for i, p in enumerate(procs):
        path = log_dir / f"result_{i}.json"
        value = json.loads(path.read_text()) if path.exists() else None
        log = (log_dir / f"log_{i}.txt").read_text(errors="replace")
        results.append(ProcessResult(i, None if i in killed else p.returncode, value, log,
                                     ended.get(i, time.monotonic() - start)))
    if check and any(r.returncode != 0 for r in results):
        raise AssertionError(f"{target}: not every process succeeded within {timeout} s\n"
                             + "\n".join(r.tail() for r in results))
    return results


def _main(spec_path: str) -> None:
    """A child: calls the target with its ``distributed`` section, writes the result atomically."""
    import importlib

    spec = json.loads(Path(spec_path).read_text())
    module, _, name = spec["target"].partition(":")
    value = getattr(importlib.import_module(module), name)(distributed=spec["distributed"], **spec["kwargs"])
    tmp = Path(spec["result"] + ".tmp")
    tmp.write_text(json.dumps(value))
    tmp.rename(spec["result"])


if __name__ == "__main__":
    _main(sys.argv[1])

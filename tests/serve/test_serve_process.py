"""The server as a process on loopback: SIGTERM answers the requests in flight before exiting, and a
bounded load test (fixed request count, every wait bounded) of MiniLM encode with N concurrent
clients, beside a plain transformers pipeline server when the golden venv is there (docs/serving.md)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

ROOT = Path(__file__).parents[2]
GOLDEN_PY = Path.home() / ".cache" / "bert_jax" / "golden-venv" / "bin" / "python"
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process(argv: list[str], port: int, log: Path, start_timeout: float = 300):
    """Starts a server process, waits (bounded) until GET /healthz answers, yields (proc, url), and
    stops it (SIGTERM, then SIGKILL after 30 s)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"server not up after {start_timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def serve(init: str, port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "bert_jax.serve", "--init", init, "--port", str(port), *flags]


def test_sigterm_answers_requests_in_flight(tiny_hf_dir, tmp_path):
    """Requests wait in a 3 s batching window; SIGTERM arrives meanwhile: every request is answered
    (200), then the lifespan shuts down (the batcher drained) and the process ends; the port is closed."""
    port = free_port()
    argv = serve(f"hf:{tiny_hf_dir}", port, "--max_seq_length", "32", "--max_batch", "8", "--max_wait_ms", "3000")
    with process(argv, port, tmp_path / "server.log") as (proc, url):
        answers: list[int] = []

        def ask(i):
            r = httpx.post(url + "/v1/encode", json={"texts": [f"the film {i}"]}, timeout=30)
            answers.append(r.status_code)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the requests are in the batcher, waiting for its window to close
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        assert answers == [200] * 4
        # uvicorn re-raises the signal once it has shut down: the process ends "killed by SIGTERM"
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/healthz", timeout=2)
    log = (tmp_path / "server.log").read_text()
    assert "Shutting down" in log and "Application shutdown complete" in log, log[-3000:]


def compiles_of(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text)
    return next(s.value for f in families for s in f.samples if s.name == "bert_serve_compiles")


def load(url: str, texts: list[str], clients: int, per_client: int) -> dict:
    """``clients`` threads each send ``per_client`` one-text encode requests (bounded timeouts)."""
    latencies, errors, vectors = [], [], {}
    lock = threading.Lock()

    def run(c):
        with httpx.Client(base_url=url, timeout=60) as http:
            for k in range(per_client):
                text = texts[(c * per_client + k) % len(texts)]
                start = time.perf_counter()
                try:
                    r = http.post("/v1/encode", json={"texts": [text]})
                    ok = r.status_code == 200
                except httpx.HTTPError as e:
                    ok, r = False, e
                with lock:
                    latencies.append(time.perf_counter() - start)
                    if ok:
                        vectors[text] = r.json()["vectors"][0]
                    else:
                        errors.append(str(r))

    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.perf_counter() - start
    ms = np.asarray(latencies) * 1000
    return {"clients": clients, "requests": len(latencies), "errors": len(errors), "seconds": round(wall, 2),
            "throughput_rps": round(len(latencies) / wall, 1), "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1), "vectors": vectors, "error_samples": errors[:3]}


def test_load_minilm_encode(minilm_dir, movie_review_file, tmp_path):
    """200 requests per setting (1 and 8 concurrent clients, one review sentence each) against our
    server and, when the golden venv exists, a plain transformers pipeline server; 0 errors, every
    request answered, the same vectors. Writes $BERT_JAX_SERVE_LOAD_OUT (JSON) when set."""
    lines = movie_review_file.read_text(encoding="utf-8", errors="replace").splitlines()
    texts = [line.split("\t")[-1] for line in lines[:400] if line.strip()]
    settings = [(1, 100), (8, 25)]
    results = {}
    port = free_port()
    with process(serve(f"hf:{minilm_dir}", port, "--max_batch", "32", "--max_seq_length", "128"),
                 port, tmp_path / "bert_jax.log") as (_, url):
        compiles = compiles_of(url)
        assert compiles == 24  # batch 1, 2, ..., 32 × length 16, 32, 64, 128, at start-up
        load(url, texts, 1, 5)  # warm-up requests, not measured (both servers get them)
        results["bert_jax.serve"] = [load(url, texts, c, n) for c, n in settings]
        assert compiles_of(url) == compiles
    if GOLDEN_PY.exists():
        port = free_port()
        argv = [str(GOLDEN_PY), str(Path(__file__).parent / "hf_baseline_server.py"), str(minilm_dir), str(port)]
        with process(argv, port, tmp_path / "hf.log") as (_, url):
            load(url, texts, 1, 5)
            results["transformers pipeline"] = [load(url, texts, c, n) for c, n in settings]
    for name, rows in results.items():
        for row in rows:
            assert row["errors"] == 0 and row["requests"] == row["clients"] * dict(settings)[row["clients"]], \
                (name, row["error_samples"])
    if "transformers pipeline" in results:
        ours, theirs = results["bert_jax.serve"][-1]["vectors"], results["transformers pipeline"][-1]["vectors"]
        common = sorted(set(ours) & set(theirs))
        np.testing.assert_allclose([ours[t] for t in common], [theirs[t] for t in common], atol=1e-4)
    table = {name: [{k: v for k, v in row.items() if k not in ("vectors", "error_samples")} for row in rows]
             for name, rows in results.items()}
    table["load_average"] = os.getloadavg()
    print(json.dumps(table, indent=1))
    if out := os.environ.get("BERT_JAX_SERVE_LOAD_OUT"):
        Path(out).write_text(json.dumps(table, indent=1) + "\n")

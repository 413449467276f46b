"""The server's Prometheus metrics (prometheus_client, one registry per app): requests and errors
per endpoint, request latency, batch sizes, and the forward pass's compiles and compiled shapes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self, engine, max_batch: int):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("bert_serve_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "code"], registry=r)
        self.errors = Counter("bert_serve_errors", "requests answered with a 4xx or 5xx status", ["endpoint"],
                              registry=r)
        self.latency = Histogram("bert_serve_request_latency_seconds", "request latency", ["endpoint"],
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10), registry=r)
        sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, max_batch})
        self.batch_size = Histogram("bert_serve_batch_size", "rows per forward pass",
                                    buckets=[s for s in sizes if s <= max_batch], registry=r)
        Gauge("bert_serve_compiles", "traces/compilations of the forward pass since start-up",
              registry=r).set_function(lambda: engine.compiles)
        Gauge("bert_serve_compiled_shapes", "distinct (batch, length) programs compiled",
              registry=r).set_function(lambda: len(set(engine.compiled_shapes)))

    def observe(self, endpoint: str, code: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(code)).inc()
        if code >= 400:
            self.errors.labels(endpoint).inc()
        self.latency.labels(endpoint).observe(seconds)

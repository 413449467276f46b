"""``python -m bert_jax.serve --init hf:DIR | tf:PREFIX | orbax:DIR | WORKDIR [--host 127.0.0.1]
[--port 8125] [--max_batch 64] [--max_wait_ms 5] [--max_seq_length 128]``: loads the model, compiles
every batch shape, then serves the API of `bert_jax.serve.app` on uvicorn until SIGINT/SIGTERM
(which stop accepting connections and answer the requests in flight first). docs/serving.md."""

from __future__ import annotations

import logging
import time

from input_pipeline import command_line as cli


def parse_args(argv=None):
    p = cli.ArgumentParser(prog="python -m bert_jax.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--init", required=True,
                   help="hf:DIR, tf:PREFIX, orbax:DIR, a pre-training workdir, or a fine-tuning workdir (/v1/classify)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8125)
    p.add_argument("--max_batch", type=int, default=64, help="rows per forward pass at most")
    p.add_argument("--max_wait_ms", type=float, default=5.0, help="how long a batch waits for more rows")
    p.add_argument("--max_seq_length", type=int, default=128, help="longer texts are truncated (and flagged)")
    p.add_argument("--vocab", default=None, help="vocabulary (default: the checkpoint's)")
    p.add_argument("--max_texts", type=int, default=256, help="texts per request at most")
    p.add_argument("--max_body_bytes", type=int, default=1 << 20, help="request body size limit")
    p.add_argument("--graceful_timeout", type=float, default=30.0,
                   help="seconds a SIGTERM waits for requests in flight")
    return p.parse_args(argv)


APPS_MODULES = ("starlette", "uvicorn", "prometheus_client", "httpx")  # pyproject.toml's `apps` extra


def main() -> None:
    args = parse_args()
    cli.require_extra("apps", *APPS_MODULES, purpose="the server")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from input_pipeline import hide_accelerators_from_tf

    hide_accelerators_from_tf()
    from bert_jax.serve import engine as engine_lib
    from bert_jax.serve.app import create_app

    engine = engine_lib.load(args.init, max_seq_length=args.max_seq_length, max_batch=args.max_batch,
                             vocab=args.vocab)
    start = time.perf_counter()
    n = engine.warm_up()
    logging.info("compiled %d programs (batch %s × length %s) in %.1f s", n, engine.batch_buckets,
                 engine.length_buckets, time.perf_counter() - start)
    app = create_app(engine, max_wait_ms=args.max_wait_ms, max_texts=args.max_texts,
                     max_body_bytes=args.max_body_bytes)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=args.graceful_timeout,
                log_level="info")


if __name__ == "__main__":
    cli.run(main)

"""The HTTP API (Starlette): ``create_app(engine, ...)`` → an ASGI app for uvicorn or a test client.

    POST /v1/encode    {"texts": [...], "pooling": "cls|mean|pooled|last4_concat", "normalize": bool}
    POST /v1/classify  {"texts": [...], "text_pairs": [...] (optional, pair tasks)}   (fine-tuning workdirs)
    POST /v1/tokenize  {"texts": [...], "text_pairs": [...] (optional)}
    GET  /healthz, GET /metrics (Prometheus text), GET /v1/attention?text=...

Every answer is JSON (but /metrics); a bad request gets a 4xx with ``{"error": "..."}`` and the
server carries on. Texts longer than ``max_seq_length`` tokens are cut and flagged (``truncated``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bert_jax.serve import pooling
from bert_jax.serve.batching import Batcher
from bert_jax.serve.metrics import Metrics

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _texts(body: dict, key: str, limit: int, required: bool = True) -> list[str] | None:
    texts = body.get(key)
    if texts is None and not required:
        return None
    if not isinstance(texts, list):
        raise ApiError(400, f"{key!r}: expected a list of strings")
    if not texts:
        raise ApiError(400, f"{key!r}: empty list (expected at least one text)")
    if len(texts) > limit:
        raise ApiError(413, f"{key!r}: {len(texts)} texts, more than the limit of {limit} per request")
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise ApiError(400, f"{key!r}: item {bad[0]} is {type(texts[bad[0]]).__name__}, expected a string")
    return texts


def attention_html(engine, text: str) -> str:
    """The attention page of `bert_jax.visualize` for ``text`` through the served model."""
    from bert_jax.visualize.html import attention_page

    return attention_page(engine.model, engine.tokenizer, text, max_seq_length=engine.max_seq_length,
                          title=engine.source)


def state(request: Request):
    """The app's engine, batcher, metrics and limits (`create_app` puts them on ``app.state``)."""
    return request.app.state


async def read_json(request: Request) -> dict:
    """The request's JSON object, within the size limit."""
    limit = state(request).max_body_bytes
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise ApiError(415, f"content-type {ctype or '(none)'!r}: expected application/json")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body of {declared} bytes: the limit is {limit}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"body over {limit} bytes")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"body is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ApiError(400, "body: expected a JSON object")
    return data


async def rows_of(request: Request, body: dict) -> list:
    """The body's ``texts`` (and ``text_pairs``) tokenised by the engine: one row each."""
    engine, limit = state(request).engine, state(request).max_texts
    texts = _texts(body, "texts", limit)
    pairs = _texts(body, "text_pairs", limit, required=False)
    if pairs is not None and len(pairs) != len(texts):
        raise ApiError(400, f"'text_pairs': {len(pairs)} items for {len(texts)} texts (expected one each)")
    return await run_in_threadpool(engine.encode, texts, pairs)


async def forward(request: Request, rows: list) -> dict:
    """The model's outputs for ``rows``, batched with other requests' rows."""
    return await asyncio.wrap_future(state(request).batcher.submit(rows))


async def encode(request: Request) -> dict:
    """POST /v1/encode: one vector a text, pooled (and normalised) as asked."""
    engine, body = state(request).engine, await read_json(request)
    pool = body.get("pooling", engine.default_pooling)
    if pool not in engine.poolings:
        raise ApiError(400, f"'pooling': {pool!r} is not one of {list(engine.poolings)}"
                       + (" (this checkpoint has no pooler)" if pool == "pooled" else ""))
    norm = body.get("normalize", engine.default_normalize)
    if not isinstance(norm, bool):
        raise ApiError(400, f"'normalize': expected true or false, got {norm!r}")
    rows = await rows_of(request, body)
    vectors = (await forward(request, rows))[pool]  # [N, D]
    if norm:
        vectors = pooling.normalize(vectors)
    return {"vectors": vectors.tolist(), "dim": int(vectors.shape[1]), "pooling": pool, "normalize": norm,
            "truncated": [r.truncated for r in rows], "num_tokens": [len(r.ids) for r in rows]}


async def classify(request: Request) -> dict:
    """POST /v1/classify: a fine-tuned classifier's labels and probabilities (a regressor's scores)."""
    engine = state(request).engine
    if engine.kind not in ("classification", "regression"):
        raise ApiError(400, f"{engine.source} is not a fine-tuned classifier (serve a fine-tuning workdir)")
    rows = await rows_of(request, await read_json(request))
    logits = (await forward(request, rows))["logits"]  # [N, C]
    out = {"truncated": [r.truncated for r in rows]}
    if engine.kind == "regression":
        return {"scores": logits[:, 0].tolist(), **out}
    z = np.exp(logits - logits.max(-1, keepdims=True))
    probs = z / z.sum(-1, keepdims=True)  # [N, C]
    ids = probs.argmax(-1)
    names = engine.label_names or tuple(str(i) for i in range(probs.shape[1]))
    return {"labels": [names[i] for i in ids], "label_ids": ids.tolist(), "probabilities": probs.tolist(),
            "label_names": list(names), **out}


async def tokenize(request: Request) -> dict:
    """POST /v1/tokenize: the tokens, ids and segments the model would see."""
    engine, rows = state(request).engine, await rows_of(request, await read_json(request))
    return {"tokens": [engine.tokens(r) for r in rows], "ids": [r.ids for r in rows],
            "segment_ids": [r.segments for r in rows], "truncated": [r.truncated for r in rows]}


async def healthz(request: Request) -> dict:
    """GET /healthz: the model served and its limits."""
    engine = state(request).engine
    return {"status": "ok", "model": engine.source, "kind": engine.kind, "poolings": list(engine.poolings),
            "default_pooling": engine.default_pooling, "max_seq_length": engine.max_seq_length,
            "max_batch": engine.max_batch, "compiled_shapes": sorted(set(engine.compiled_shapes))}


async def attention(request: Request) -> Response:
    """GET /v1/attention?text=...: the attention page (501 where the server has none)."""
    page = state(request).attention_page
    if page is None:
        raise ApiError(501, "attention pages are not available in this server; "
                       "use `python -m bert_jax.visualize --init ... --text ...`")
    text = request.query_params.get("text", "")
    if not text:
        raise ApiError(400, "query parameter 'text' is required")
    from starlette.responses import HTMLResponse

    return HTMLResponse(await run_in_threadpool(page, state(request).engine, text))


def handler(name: str, fn):
    """``fn`` as a route: its result as JSON, an `ApiError` as its status, a bug as a logged 500;
    each answer counted in the metrics."""
    async def wrapped(request: Request) -> Response:
        start = time.perf_counter()
        try:
            result = await fn(request)
            response = result if isinstance(result, Response) else JSONResponse(result)
        except ApiError as e:
            response = JSONResponse({"error": e.message}, status_code=e.status)
        except Exception:  # a bug: 500, logged, and the server carries on
            log.exception("%s failed", name)
            response = JSONResponse({"error": "internal error (see the server log)"}, status_code=500)
        state(request).metrics.observe(name, response.status_code, time.perf_counter() - start)
        return response

    return wrapped


async def metrics_page(request: Request) -> Response:
    """GET /metrics: Prometheus text."""
    return Response(generate_latest(state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """404 and 405 as JSON."""
    return JSONResponse({"error": f"{request.method} {request.url.path}: {exc.detail}"}, status_code=exc.status_code)


@contextlib.asynccontextmanager
async def lifespan(app):
    """The batcher runs while the app serves."""
    app.state.batcher.start()
    try:
        yield
    finally:
        await run_in_threadpool(app.state.batcher.stop)  # after uvicorn has drained the connections


def routes() -> list[Route]:
    return [Route("/v1/encode", handler("encode", encode), methods=["POST"]),
            Route("/v1/classify", handler("classify", classify), methods=["POST"]),
            Route("/v1/tokenize", handler("tokenize", tokenize), methods=["POST"]),
            Route("/v1/attention", handler("attention", attention), methods=["GET"]),
            Route("/healthz", handler("healthz", healthz), methods=["GET"]),
            Route("/metrics", metrics_page, methods=["GET"])]


def create_app(engine, *, max_wait_ms: float = 5.0, max_texts: int = 256, max_body_bytes: int = 1 << 20,
               attention_page=attention_html) -> Starlette:
    """The API over ``engine``; ``attention_page(engine, text) -> str`` (HTML) serves /v1/attention (None: 501)."""
    metrics = Metrics(engine, engine.max_batch)
    batcher = Batcher(engine.run, max_batch=engine.max_batch, max_wait_s=max_wait_ms / 1000,
                      on_batch=metrics.batch_size.observe)
    app = Starlette(routes=routes(), lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.engine, app.state.metrics, app.state.batcher = engine, metrics, batcher
    app.state.max_texts, app.state.max_body_bytes, app.state.attention_page = max_texts, max_body_bytes, attention_page
    return app

"""A small Python client in the spirit of bert-as-service's ``BertClient``::

    bc = BertClient("http://127.0.0.1:8125")
    vectors = bc.encode(["First do it", "then do it right"])  # numpy float32 [2, H]

A 4xx/5xx answer raises `ServerError` with the server's message.
"""

from __future__ import annotations

import httpx
import numpy as np


class ServerError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class BertClient:
    def __init__(self, url: str = "http://127.0.0.1:8125", *, timeout: float = 60.0,
                 client: httpx.Client | None = None):
        self._http = client or httpx.Client(base_url=url, timeout=timeout)

    def _post(self, path: str, body: dict) -> dict:
        r = self._http.post(path, json=body)
        if r.status_code >= 400:
            try:
                message = r.json().get("error", r.text)
            except ValueError:
                message = r.text
            raise ServerError(r.status_code, message)
        return r.json()

    def encode(self, texts: list[str], *, pooling: str | None = None, normalize: bool | None = None) -> np.ndarray:
        """Sentence vectors [len(texts), D] float32 (the server's default pooling unless given)."""
        body = {"texts": list(texts)}
        if pooling is not None:
            body["pooling"] = pooling
        if normalize is not None:
            body["normalize"] = normalize
        return np.asarray(self._post("/v1/encode", body)["vectors"], np.float32)

    def classify(self, texts: list[str], text_pairs: list[str] | None = None) -> dict:
        body = {"texts": list(texts)} | ({"text_pairs": list(text_pairs)} if text_pairs is not None else {})
        return self._post("/v1/classify", body)

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

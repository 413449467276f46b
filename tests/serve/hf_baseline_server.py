"""The load test's baseline: a plain Hugging Face transformers pipeline behind Python's standard
``ThreadingHTTPServer``, answering ``POST /v1/encode {"texts": [...]}`` with all-MiniLM-L6-v2's
sentence embeddings (the feature-extraction pipeline's token vectors, mean-pooled, L2-normalised),
one request at a time and without batching across requests: what serving the model "by hand" does.

Run in the golden venv (torch + transformers): ``python hf_baseline_server.py MODEL_DIR PORT``.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from transformers import pipeline


def main(model_dir: str, port: int) -> None:
    extract = pipeline("feature-extraction", model=model_dir, tokenizer=model_dir, framework="pt", device=-1)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"status": "ok"})

        def do_POST(self):
            texts = json.loads(self.rfile.read(int(self.headers["content-length"])))["texts"]
            with lock:
                tokens = extract(texts, truncation=True, max_length=128)  # per text: [1, T, 384]
            vectors = [np.asarray(t[0]).mean(0) for t in tokens]
            vectors = [(v / np.linalg.norm(v)).tolist() for v in vectors]
            self._send(200, {"vectors": vectors})

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

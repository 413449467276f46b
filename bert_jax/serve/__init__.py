"""Serving a BERT over HTTP: sentence embeddings (``/v1/encode``), a fine-tuned classifier
(``/v1/classify``), tokenization, health and Prometheus metrics, with dynamic batching over a small
set of shapes compiled at start-up. ``python -m bert_jax.serve --init ...``; docs/serving.md."""

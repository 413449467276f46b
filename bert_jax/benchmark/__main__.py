"""``python -m bert_jax.benchmark``: see `bert_jax.benchmark.timing` for the usage."""

from bert_jax.benchmark.timing import main
from input_pipeline import cli

cli.run(main)

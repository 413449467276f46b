"""``python -m bert_jax.benchmark``: see `bert_jax.benchmark.step` for the usage."""

from bert_jax.benchmark.step import main
from input_pipeline import command_line as cli

cli.run(main)

"""``python -m bert_jax.benchmark``: see `bert_jax.benchmark.command` for the usage."""

from bert_jax.benchmark.command import main
from input_pipeline import command_line as cli

cli.run(main)

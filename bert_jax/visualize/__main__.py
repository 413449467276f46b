"""``python -m bert_jax.visualize``: see `bert_jax.visualize.command`."""

from bert_jax.visualize.command import main
from input_pipeline import command_line as cli

cli.run(main)

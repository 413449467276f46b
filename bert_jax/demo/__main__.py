"""``python -m bert_jax.demo`` (``make demo``): see `bert_jax.demo.pipeline` for the stages."""

from bert_jax.demo.pipeline import main
from input_pipeline import command_line as cli

cli.run(main)

"""``python -m bert_jax.demo`` (``make demo``): see `bert_jax.demo.pipeline` for the stages."""

import sys

from bert_jax.demo.pipeline import main

sys.exit(main())

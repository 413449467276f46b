"""Pre-training's input: each process's rows of every global batch, placed on the mesh, with a
position every checkpoint records.

`make_input` opens the data ``config.data`` names (synthetic batches, in-memory text or TFRecord
shards: `input_pipeline.pretraining.dataset`) as this process's block of rows (`BlockRows`); `placing`
turns a numpy batch into global arrays on the mesh (`bert_jax.training.sharding.global_batch`), with
the real tokens' index for unpadded blocks; `gather_data_states` collects every process's position
for the checkpoint. The batches are prefetched onto the devices in a background thread
(`bert_jax.pretraining.prefetch`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import Mesh

from bert_jax.training import sharding as sh


def vocab_size_of(config) -> int:
    """The vocabulary's size: ``config.data.vocab``'s tokenizer (synthetic data: ``config.model.vocab_size``)."""
    if config.data.kind == "synthetic":
        return config.model.vocab_size
    from input_pipeline.package_data import locate
    from input_pipeline.tokenizers.factory import load_tokenizer

    if not config.data.vocab:
        raise ValueError("config.data.vocab is empty: set --config.data.vocab=PATH (a vocab.txt, a SentencePiece "
                         ".model or a directory holding one)")
    return load_tokenizer(locate(config.data.vocab)).vocab_size


class BlockRows:
    """Rows ``[i * rows, (i + 1) * rows)`` of every batch of ``source``; its position is the source's."""

    def __init__(self, source, i: int, rows: int):
        self.source, self.rows = source, slice(i * rows, (i + 1) * rows)

    def state(self) -> dict:
        return self.source.state()

    def restore(self, state: dict) -> None:
        self.source.restore(state)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return {k: v[self.rows] for k, v in next(self.source).items()}


def make_input(config, split: str, block: tuple[int, int] = (0, 1)):
    """An iterator of this process's rows of the global batches, block i of n (`sh.process_block`),
    with ``state()``/``restore()``. Synthetic and in-memory text input give the same global batches
    for any n; TFRecord shards are split by file (process i reads files i::n)."""
    i, n = block
    if config.batch_size % n:
        raise ValueError(f"batch_size {config.batch_size} is not divisible by {n} processes")
    local = config.batch_size // n
    if config.data.kind == "synthetic":
        if config.data.pack_examples:
            raise ValueError("config.data.pack_examples needs data.kind='pretraining' (synthetic batches "
                             "are not packed; the benchmark packs them with --packing K)")
        from input_pipeline.pretraining.synthetic import SyntheticBatches

        batches = SyntheticBatches(batch_size=config.batch_size, seq_len=config.data.max_seq_length,
                                   max_predictions=config.data.max_predictions_per_seq,
                                   vocab_size=config.model.vocab_size,
                                   seed=config.seed * 1000 + (7 if split == "eval" else 0))
        return batches if n == 1 else BlockRows(batches, i, local)
    if config.data.kind == "pretraining":
        from input_pipeline.pretraining.dataset import make_pretraining_dataset

        return make_pretraining_dataset(config, split=split, batch_size=local, process_index=i, process_count=n)
    raise ValueError(f"config.data.kind={config.data.kind!r}: expected 'pretraining' or 'synthetic'")


def placing(config, mesh: Mesh, rules, accumulation: int = 1) -> Callable:
    """numpy batch → global arrays on the mesh, adding ``token_index`` (the encoder's blocks on the
    real tokens only) when ``config.unpad_multiple`` > 0."""
    place = functools.partial(sh.global_batch, mesh=mesh, rules=rules)
    multiple = config.unpad_multiple
    if not multiple:
        return place
    if jax.process_count() > 1:
        raise ValueError("config.unpad_multiple needs a single process: every process would have to agree on "
                         "each batch's number of real tokens while seeing only its own rows (docs/pretraining.md)")
    if accumulation > 1:
        raise ValueError("config.unpad_multiple does not go with micro-batches: set per_device_batch=0")
    from input_pipeline.unpadding import adding_token_index

    return adding_token_index(place, sh.batch_shards(mesh, rules), multiple)


def gather_data_states(state: dict, block: int = 0) -> list[dict]:
    """Every process's input position (they differ on a pod: each reads its own files), in the
    order of their input blocks (`sh.process_block`), so each process resumes its own stream.
    Single process: ``[state]``."""
    if jax.process_count() == 1:
        return [state]
    from jax.experimental import multihost_utils

    raw = json.dumps([block, state]).encode()
    if len(raw) > 4096:
        raise ValueError(f"input pipeline state too large to gather ({len(raw)} bytes)")
    rows = multihost_utils.process_allgather(np.frombuffer(raw.ljust(4096), np.uint8))  # [processes, 4096]
    rows = [json.loads(bytes(r).decode().strip()) for r in np.asarray(rows)]
    return [s for _, s in sorted(rows, key=lambda row: row[0])]

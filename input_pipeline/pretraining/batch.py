"""The pre-training batch: its keys, shapes and dtypes, defined once.

Every producer (TFRecord parsing in `input_pipeline.pretraining.featurize`, dynamic masking, packing, the
synthetic batches, unpadding) and every consumer (the training step, the benchmark, ahead-of-time
compilation) speaks this layout. Shapes are symbolic: ``batch`` rows of ``length`` tokens,
``predictions`` masked-LM slots per row, ``slots`` examples per packed row, and for unpadded steps
``shards`` (data-parallel batch shards) by ``tokens`` (real tokens per shard, rounded up).

Fine-tuning features (GLUE, SQuAD, NER) are defined with the tasks, in `input_pipeline.tasks.base`.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Key:
    name: str
    shape: tuple[str, ...]  # symbolic axis names
    dtype: type
    meaning: str


REQUIRED = (
    Key("input_ids", ("batch", "length"), np.int32, "WordPiece ids; 0 = [PAD]"),
    Key("input_mask", ("batch", "length"), np.int32, "1 = a real token, 0 = padding"),
    Key("segment_ids", ("batch", "length"), np.int32, "0 = sentence A (with [CLS]), 1 = sentence B"),
    Key("masked_lm_positions", ("batch", "predictions"), np.int32, "where the masked tokens are; 0 in unused slots"),
    Key("masked_lm_ids", ("batch", "predictions"), np.int32, "the original ids at those positions"),
    Key("masked_lm_weights", ("batch", "predictions"), np.float32, "1.0 = a real prediction, 0.0 = an unused slot"),
    Key("next_sentence_labels", ("batch",), np.int32,
        "NSP: 1 = sentence B is random; SOP: 1 = the sentences are swapped ([batch, slots] when packed)"),
)

OPTIONAL = (
    Key("example_ids", ("batch", "length"), np.int32, "packed rows: 1, 2, ... per example, 0 = padding"),
    Key("cls_positions", ("batch", "slots"), np.int32, "packed rows: where each example starts"),
    Key("nsp_weights", ("batch", "slots"), np.float32, "packed rows: 1 = a real example, 0 = an empty slot"),
    Key("token_index", ("shards", "tokens"), np.int32,
        "unpadded steps: each shard's real-token positions (row · length + column), then filler"),
)

REQUIRED_KEYS = tuple(k.name for k in REQUIRED)
# What an unmasked TFRecord holds (masked later, dynamically), and what static masking adds.
MASKED_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
UNMASKED_KEYS = tuple(k for k in REQUIRED_KEYS if k not in MASKED_KEYS)
# Optional keys the model takes as inputs (nsp_weights only weights the loss).
MODEL_INPUT_KEYS = ("example_ids", "cls_positions", "token_index")
FLOAT_KEYS = frozenset(k.name for k in (*REQUIRED, *OPTIONAL) if k.dtype == np.float32)


def shapes(batch: int, length: int, predictions: int, slots: int = 0) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``{key: (shape, dtype)}`` of a padded batch: what a step is compiled for; ``slots`` > 0 (packed
    rows of up to that many examples, ``config.data.pack_examples``) adds the packing keys and gives
    ``next_sentence_labels`` a label per slot."""
    sizes = {"batch": batch, "length": length, "predictions": predictions, "slots": slots}
    out = {k.name: (tuple(sizes[a] for a in k.shape), np.dtype(k.dtype)) for k in REQUIRED}
    if slots:
        out.update({k.name: (tuple(sizes[a] for a in k.shape), np.dtype(k.dtype)) for k in OPTIONAL
                    if k.name in ("example_ids", "cls_positions", "nsp_weights")})
        out["next_sentence_labels"] = ((batch, slots), np.dtype(np.int32))
    return out

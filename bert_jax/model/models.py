"""Models: the encoder composed with heads. Every model has its encoder at ``.bert``, so fine-tuning
restores ``bert`` from a pre-training checkpoint and starts the heads fresh."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.model.config import BertConfig
from bert_jax.model.encoder import BertEncoder, EncoderOutput, packed_mask, packed_positions
from bert_jax.model.heads import ClassificationHead, MaskedLMHead, SpanHead

OBJECTIVES = ("nsp", "sop", "none")


class PreTrainingOutput(NamedTuple):
    mlm_logits: jax.Array  # [batch, P, vocab] (P = all positions when none are given)
    nsp_logits: jax.Array | None  # [batch, 2] ([batch, K, 2] packed); None for the "none" objective
    encoder: EncoderOutput


class BertForPreTraining(nnx.Module):
    """Masked LM + next-sentence (NSP) or sentence-order (SOP) prediction; objective "none" drops
    the second head (RoBERTa-style)."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs, objective: str = "nsp"):
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; expected one of {OBJECTIVES}")
        if objective != "none" and not cfg.use_pooler:
            raise ValueError(f"objective {objective!r} classifies the pooled output: use_pooler=True")
        self.objective = objective
        self.bert = BertEncoder(cfg, rngs=rngs)
        self.mlm = MaskedLMHead(cfg, rngs=rngs)
        self.nsp = None if objective == "none" else ClassificationHead(cfg, 2, rngs=rngs, dropout=False)

    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions=None, *, example_ids=None,
                 cls_positions=None, token_index=None, deterministic=True, rngs=None) -> PreTrainingOutput:
        """Packed rows (several examples in one row, no attention between them): ``example_ids``
        [batch, length] (1, 2, ... per example, 0 = padding) and ``cls_positions`` [batch, K], the
        start of each example, whose NSP/SOP logits come out as [batch, K, 2]. ``token_index``
        [shards, tokens] runs the encoder's blocks on the real tokens only (`token_layout.Unpadded`)."""
        packed = example_ids is not None
        enc = self.bert(input_ids, input_mask, segment_ids, deterministic=deterministic, rngs=rngs,
                        attention_mask=packed_mask(example_ids) if packed else None,
                        position_ids=packed_positions(example_ids) if packed else None, token_index=token_index)
        mlm = self.mlm(enc.sequence_output, self.bert.embeddings.word_embeddings, masked_lm_positions)
        nsp = None
        if self.nsp is not None:
            pooled = enc.pooled_output if cls_positions is None else self.bert.pool(enc.sequence_output, cls_positions)
            nsp = self.nsp(pooled)  # [batch, 2] or [batch, K, 2]
        return PreTrainingOutput(mlm, nsp, enc)


class BertClassifier(nnx.Module):
    """Sequence classification (GLUE); num_labels = 1 is regression (STS-B). It reads the pooled
    [CLS] (``cfg.classifier_pooling`` "cls", the paper; needs the pooler) or the last layer
    averaged over real tokens ("mean"; no pooler needed). Here and in the tagger and span models
    ``token_index`` [shards, tokens] runs the encoder's blocks on the real tokens only
    (`token_layout.Unpadded`; the outputs are the padded ones)."""

    def __init__(self, cfg: BertConfig, num_labels: int, *, rngs: nnx.Rngs):
        if cfg.classifier_pooling == "cls" and not cfg.use_pooler:
            raise ValueError("BertClassifier with classifier_pooling='cls' classifies the pooled output: "
                             "use_pooler=True (or classifier_pooling='mean')")
        self.pooling = cfg.classifier_pooling
        self.bert = BertEncoder(cfg, rngs=rngs)
        self.classifier = ClassificationHead(cfg, num_labels, rngs=rngs)

    def __call__(self, input_ids, input_mask, segment_ids, *, token_index=None, deterministic=True, rngs=None):
        enc = self.bert(input_ids, input_mask, segment_ids, deterministic=deterministic, rngs=rngs,
                        token_index=token_index)
        if self.pooling == "mean":
            pooled = mean_pool(enc.sequence_output, input_mask)  # [batch, embed]
        else:
            pooled = enc.pooled_output  # [batch, embed]
        return self.classifier(pooled, deterministic=deterministic, rngs=rngs)  # [batch, labels]


def mean_pool(sequence: jax.Array, input_mask: jax.Array) -> jax.Array:
    """[batch, length, embed] averaged over the real tokens (``input_mask`` [batch, length] = 1) → [batch, embed]."""
    m = input_mask.astype(sequence.dtype)[..., None]  # [batch, length, 1]
    return (sequence * m).sum(1) / jnp.maximum(m.sum(1), 1)  # [batch, embed]


class BertTagger(nnx.Module):
    """Token classification (NER): a label per token; the pipeline labels the first sub-token."""

    def __init__(self, cfg: BertConfig, num_labels: int, *, rngs: nnx.Rngs):
        self.bert = BertEncoder(cfg, rngs=rngs)
        self.classifier = ClassificationHead(cfg, num_labels, rngs=rngs)

    def __call__(self, input_ids, input_mask, segment_ids, *, token_index=None, deterministic=True, rngs=None):
        enc = self.bert(input_ids, input_mask, segment_ids, deterministic=deterministic, rngs=rngs,
                        token_index=token_index)
        return self.classifier(enc.sequence_output, deterministic=deterministic, rngs=rngs)  # [B, L, labels]


class BertForQuestionAnswering(nnx.Module):
    """Span QA (SQuAD): start and end logits per token; padding never wins."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.bert = BertEncoder(cfg, rngs=rngs)
        self.qa_outputs = SpanHead(cfg, rngs=rngs)

    def __call__(self, input_ids, input_mask, segment_ids, *, token_index=None, deterministic=True, rngs=None):
        enc = self.bert(input_ids, input_mask, segment_ids, deterministic=deterministic, rngs=rngs,
                        token_index=token_index)
        return self.qa_outputs(enc.sequence_output, input_mask)  # ([B, L], [B, L])


def create(model_cls, cfg: BertConfig, *args, seed: int = 0, **kwargs) -> nnx.Module:
    """``model_cls(cfg, *args, rngs=nnx.Rngs(seed), **kwargs)`` with its initialisation compiled as
    one XLA program; eager initialisation dispatches op by op and is several times slower on CPU.
    The parameters are identical to the eager construction's."""
    return nnx.jit(lambda: model_cls(cfg, *args, rngs=nnx.Rngs(seed), **kwargs))()


def create_abstract(model_cls, cfg: BertConfig, *args, **kwargs) -> nnx.Module:
    """``model_cls(cfg, *args, ...)`` with every parameter a ``jax.ShapeDtypeStruct``: nothing is
    initialised, allocated or compiled. For a model whose every parameter is then loaded
    (`bert_jax.model.weights.load_params` fills them in place): released weights load without
    first compiling and running a random initialisation of the same size."""
    return nnx.eval_shape(lambda: model_cls(cfg, *args, rngs=nnx.Rngs(0), **kwargs))

"""Where the BERT family keeps our parameters in Hugging Face checkpoints: one `Family` per ``model_type``.

A family names the base model's prefix, the per-layer tensors, the embedding projection (E -> H),
the pooler and the heads; `bert_jax.interop.convert` turns it into the rows of a name table, the
same way for every family. Only BERT rows carry Google TF names (the ``tf:`` reader is BERT only).

- bert: ``bert.`` + ``encoder.layer.{i}``, pooler ``pooler.dense``; mlm <- ``cls.predictions``,
  nsp <- ``cls.seq_relationship``;
- albert: ``albert.`` + one shared block (``encoder.albert_layer_groups.0.albert_layers.0``), projection
  ``encoder.embedding_hidden_mapping_in``, pooler ``pooler``; mlm <- ``predictions``,
  nsp (SOP) <- ``sop_classifier.classifier``;
- electra: ``electra.`` + ``encoder.layer.{i}``, projection ``embeddings_project`` (only if E != H), no
  pooler; mlm <- ``generator_predictions`` + ``generator_lm_head.bias``, rtd <- ``discriminator_predictions``;
- roberta: ``roberta.`` + ``encoder.layer.{i}``, pooler ``pooler.dense``; mlm <- ``lm_head``;
- modernbert: ``model.`` + ``layers.{i}`` (fused ``attn.Wqkv`` -> query/key/value, ``mlp.Wi`` -> the GeGLU
  kernel [embed, 2, mlp], no ``attn_norm`` in layer 0), ``final_norm``, no pooler; mlm <- ``head`` +
  ``decoder.bias``. Its biases are rows only when the config has them (``use_bias``, ``norm_bias``).
"""

from __future__ import annotations

import dataclasses

# A row: (our path, HF name, Google TF name or None, kind). kind says how the array is laid out:
# "linear" (HF [out, in] vs our [in, out]), "transposed" ([labels, in] in TF too), "qkv_kernel",
# "qkv_bias", "out_kernel" (per-head reshapes), "copy"; ModernBERT's "wqkv_kernel:j" / "wqkv_bias:j"
# (part j of 3 of the fused [3 * embed, ...] tensor, then as qkv_kernel / qkv_bias), "geglu_kernel"
# ([2 * mlp, embed] vs our [embed, 2, mlp]), "geglu_bias", and the copies that exist only when the
# config has them: "bias" (a linear layer's, ``use_bias``), "norm_bias" (a LayerNorm's, ``norm_bias``).
Row = tuple[str, str, "str | None", str]


def linear(ours: str, hf: str, tf: str | None = None, kind: str = "linear") -> list[Row]:
    return [(f"{ours}/kernel", f"{hf}.weight", tf and f"{tf}/kernel", kind),
            (f"{ours}/bias", f"{hf}.bias", tf and f"{tf}/bias", "copy")]


def norm(ours: str, hf: str, tf: str | None = None, bias: str = "copy") -> list[Row]:
    return [(f"{ours}/scale", f"{hf}.weight", tf and f"{tf}/gamma", "copy"),
            (f"{ours}/bias", f"{hf}.bias", tf and f"{tf}/beta", bias)]


def optional_bias_linear(ours: str, hf: str, kind: str = "linear") -> list[Row]:
    """A linear layer whose bias exists only when ``use_bias`` (ModernBERT's)."""
    return [(f"{ours}/kernel", f"{hf}.weight", None, kind), (f"{ours}/bias", f"{hf}.bias", None, "bias")]


def _modernbert_block() -> list[Row]:
    rows = []
    for j, q in enumerate(("query", "key", "value")):
        rows += [(f"attention/{q}/kernel", "attn.Wqkv.weight", None, f"wqkv_kernel:{j}"),
                 (f"attention/{q}/bias", "attn.Wqkv.bias", None, f"wqkv_bias:{j}")]
    return [*rows, *optional_bias_linear("attention/output", "attn.Wo", "out_kernel"),
            *norm("attention_norm", "attn_norm", bias="norm_bias"),
            ("ffn/intermediate/kernel", "mlp.Wi.weight", None, "geglu_kernel"),
            ("ffn/intermediate/bias", "mlp.Wi.bias", None, "geglu_bias"),
            *optional_bias_linear("ffn/output", "mlp.Wo"), *norm("ffn_norm", "mlp_norm", bias="norm_bias")]


def _bert_block(tf: bool) -> list[Row]:
    """A BERT block (also ELECTRA's and RoBERTa's), names relative to the layer's prefix."""
    t = (lambda name: name) if tf else (lambda name: None)
    rows = []
    for q in ("query", "key", "value"):
        rows += [(f"attention/{q}/kernel", f"attention.self.{q}.weight", t(f"attention/self/{q}/kernel"), "qkv_kernel"),
                 (f"attention/{q}/bias", f"attention.self.{q}.bias", t(f"attention/self/{q}/bias"), "qkv_bias")]
    rows += linear("attention/output", "attention.output.dense", t("attention/output/dense"), "out_kernel")
    rows += norm("attention_norm", "attention.output.LayerNorm", t("attention/output/LayerNorm"))
    rows += linear("ffn/intermediate", "intermediate.dense", t("intermediate/dense"))
    rows += linear("ffn/output", "output.dense", t("output/dense"))
    rows += norm("output_norm", "output.LayerNorm", t("output/LayerNorm"))
    return rows


def _albert_block() -> list[Row]:
    rows = []
    for q in ("query", "key", "value"):
        rows += [(f"attention/{q}/kernel", f"attention.{q}.weight", None, "qkv_kernel"),
                 (f"attention/{q}/bias", f"attention.{q}.bias", None, "qkv_bias")]
    return [*rows, *linear("attention/output", "attention.dense", kind="out_kernel"),
            *norm("attention_norm", "attention.LayerNorm"), *linear("ffn/intermediate", "ffn"),
            *linear("ffn/output", "ffn_output"), *norm("output_norm", "full_layer_layer_norm")]


def _embeddings(base: str, tf: bool) -> list[Row]:
    rows = [(f"bert/embeddings/{e}/embedding", f"{base}.embeddings.{e}.weight", f"bert/embeddings/{e}" if tf else None,
             "copy") for e in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    return rows + norm("bert/embeddings/layer_norm", f"{base}.embeddings.LayerNorm", "bert/embeddings/LayerNorm" if tf
                       else None)


def _mlm(transform: str, layer_norm: str, bias: str, tf: bool = False) -> list[Row]:
    t = "cls/predictions/" if tf else None
    return [*linear("mlm/transform", transform, t and t + "transform/dense"),
            *norm("mlm/layer_norm", layer_norm, t and t + "transform/LayerNorm"),
            ("mlm/output_bias", bias, t and t + "output_bias", "copy")]


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str
    name: str  # for messages: "BERT", "ALBERT", "ELECTRA", "RoBERTa"
    base: str  # the base model's attribute in HF's pre-training models: "bert", "albert", ...
    layer_prefix: str  # HF prefix of block {i}
    block: tuple[Row, ...]  # a block's rows, names relative to layer_prefix (TF ones to bert/encoder/layer_{i}/)
    encoder: tuple[Row, ...]  # embeddings, projection, pooler
    heads: dict[str, tuple[Row, ...]]  # "mlm" / "nsp" / "rtd" / task heads -> rows
    tied: tuple[str, ...]  # HF names of tied copies and buffers: ignored on read, never written
    architectures: dict[str, str]  # "encoder" / "pretraining" (mlm + nsp) / "mlm" / "rtd" -> HF class
    shared_layers: bool = False  # ALBERT: one block applied num_layers times
    pair_head: str | None = None  # what nsp/dense is trained for: "nsp" (BERT), "sop" (ALBERT), None
    fixed_mlm_act: str | None = None  # HF's MLM head activation when it ignores hidden_act
    vocab_file: str | None = "vocab.txt"  # the tokenizer file `hf:` takes as the vocabulary, if any
    # Block parameters HF's first layer lacks (ModernBERT's layer 0 attn_norm is an Identity): read as
    # the LayerNorm's initial values (unused: `BertConfig.layer_specs`), never written.
    absent_in_first_layer: tuple[str, ...] = ()

    @property
    def bare_prefixes(self) -> tuple[str, ...]:
        """First components of a bare base-model checkpoint's names (``BertModel`` has no ``bert.``)."""
        names = [hf for _, hf, _, _ in self.encoder] + [self.layer_prefix]
        return tuple(sorted({name.split(".")[1] + "." for name in names}))


_COMMON_TIED = ("embeddings.position_ids", "embeddings.token_type_ids")
_BERT_TASK_HEADS = {  # fine-tuned heads (run_classifier / run_squad names on the TF side)
    "classifier": (("classifier/dense/kernel", "classifier.weight", "output_weights", "transposed"),
                   ("classifier/dense/bias", "classifier.bias", "output_bias", "copy")),
    "qa_outputs": (("qa_outputs/dense/kernel", "qa_outputs.weight", "cls/squad/output_weights", "transposed"),
                   ("qa_outputs/dense/bias", "qa_outputs.bias", "cls/squad/output_bias", "copy")),
}

FAMILIES: dict[str, Family] = {
    "bert": Family(
        "bert", "BERT", "bert", "bert.encoder.layer.{i}.", tuple(_bert_block(tf=True)),
        tuple(_embeddings("bert", tf=True) + linear("bert/pooler", "bert.pooler.dense", "bert/pooler/dense")),
        {"mlm": tuple(_mlm("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                           "cls.predictions.bias", tf=True)),
         "nsp": (("nsp/dense/kernel", "cls.seq_relationship.weight", "cls/seq_relationship/output_weights",
                  "transposed"),
                 ("nsp/dense/bias", "cls.seq_relationship.bias", "cls/seq_relationship/output_bias", "copy")),
         **_BERT_TASK_HEADS},
        (*_COMMON_TIED, "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
        {"encoder": "BertModel", "pretraining": "BertForPreTraining", "mlm": "BertForMaskedLM"},
        pair_head="nsp"),
    "albert": Family(
        "albert", "ALBERT", "albert", "albert.encoder.albert_layer_groups.0.albert_layers.0.", tuple(_albert_block()),
        tuple(_embeddings("albert", tf=False) + linear("bert/embedding_projection",
                                                       "albert.encoder.embedding_hidden_mapping_in")
              + linear("bert/pooler", "albert.pooler")),
        {"mlm": tuple(_mlm("predictions.dense", "predictions.LayerNorm", "predictions.bias")),
         "nsp": tuple(linear("nsp/dense", "sop_classifier.classifier"))},
        (*_COMMON_TIED, "predictions.decoder.weight", "predictions.decoder.bias"),
        {"encoder": "AlbertModel", "pretraining": "AlbertForPreTraining", "mlm": "AlbertForMaskedLM"},
        shared_layers=True, pair_head="sop", vocab_file="spiece.model"),  # <pad> <unk> [CLS] [SEP] [MASK]
    "electra": Family(
        "electra", "ELECTRA", "electra", "electra.encoder.layer.{i}.", tuple(_bert_block(tf=False)),
        tuple(_embeddings("electra", tf=False) + linear("bert/embedding_projection", "electra.embeddings_project")),
        {"mlm": tuple(_mlm("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias")),
         "rtd": tuple(linear("rtd/dense", "discriminator_predictions.dense")
                      + linear("rtd/prediction", "discriminator_predictions.dense_prediction"))},
        (*_COMMON_TIED, "generator_lm_head.weight"),
        {"encoder": "ElectraModel", "mlm": "ElectraForMaskedLM", "rtd": "ElectraForPreTraining"},
        fixed_mlm_act="gelu"),
    "roberta": Family(
        "roberta", "RoBERTa", "roberta", "roberta.encoder.layer.{i}.", tuple(_bert_block(tf=False)),
        tuple(_embeddings("roberta", tf=False) + linear("bert/pooler", "roberta.pooler.dense")),
        {"mlm": tuple(_mlm("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"))},
        (*_COMMON_TIED, "lm_head.decoder.weight", "lm_head.decoder.bias"),
        {"encoder": "RobertaModel", "mlm": "RobertaForMaskedLM"},
        fixed_mlm_act="gelu", vocab_file="vocab.json"),  # + merges.txt beside it
    "modernbert": Family(
        "modernbert", "ModernBERT", "model", "model.layers.{i}.", tuple(_modernbert_block()),
        (("bert/embeddings/word_embeddings/embedding", "model.embeddings.tok_embeddings.weight", None, "copy"),
         *norm("bert/embeddings/layer_norm", "model.embeddings.norm", bias="norm_bias"),
         *norm("bert/final_norm", "model.final_norm", bias="norm_bias")),
        {"mlm": (*optional_bias_linear("mlm/transform", "head.dense"), *norm("mlm/layer_norm", "head.norm",
                                                                              bias="norm_bias"),
                 ("mlm/output_bias", "decoder.bias", None, "copy"))},
        ("decoder.weight",),
        {"encoder": "ModernBertModel", "mlm": "ModernBertForMaskedLM"},
        vocab_file="tokenizer.json", absent_in_first_layer=("attention_norm/scale", "attention_norm/bias")),
}


def family(model_type: str | None, *, source: str = "config.json") -> Family:
    """The family of a config.json's ``model_type`` (absent: BERT, as in Google's bert_config.json)."""
    name = model_type or "bert"
    if name not in FAMILIES:
        raise ValueError(f"{source}: model_type {name!r} is not supported; expected one of {sorted(FAMILIES)}")
    return FAMILIES[name]

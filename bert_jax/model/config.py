"""The model configuration: one frozen dataclass and a size table.

Variants (eval without dropout, bf16 compute, scan over layers) are `dataclasses.replace` of a
config, never extra keyword plumbing:

    cfg = BertConfig.from_size("base", vocab_size=30522)
    eval_cfg = dataclasses.replace(cfg, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax.numpy as jnp

from bert_jax.model.execution import (
    DROPOUT_IMPLS,
    resolve_attention,
    resolve_dropout,
    resolve_dtype,
    resolve_scan,
)

CLASSIFIER_POOLINGS = ("cls", "mean")

# name: (num_layers, hidden_size, num_heads). intermediate = 4 * hidden (the paper's choice).
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
# The family's sizes: the fields each sets on top of BERT's defaults (intermediate = 4 * hidden).
# ALBERT (Lan et al., 2020, Table 1): factorised embeddings E = 128 and one block shared by all
# layers; 12M / 18M / 60M / 235M parameters with a 30k vocabulary. ELECTRA (Clark et al., 2020,
# Table 6): the discriminator's sizes; small has E = 128 < hidden.
FAMILY_SIZES: dict[str, dict[str, Any]] = {
    **{f"albert-{name}": dict(num_layers=layers, hidden_size=hidden, num_heads=heads, embedding_size=128,
                              share_layers=True, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                              attention_dropout_prob=0.0)
       for name, (layers, hidden, heads) in {"base": (12, 768, 12), "large": (24, 1024, 16),
                                             "xlarge": (24, 2048, 16), "xxlarge": (12, 4096, 64)}.items()},
    "electra-small": dict(num_layers=12, hidden_size=256, num_heads=4, embedding_size=128, use_pooler=False),
    "electra-base": dict(num_layers=12, hidden_size=768, num_heads=12, use_pooler=False),
    "electra-large": dict(num_layers=24, hidden_size=1024, num_heads=16, use_pooler=False),
}

HiddenAct = Literal["gelu", "gelu_new", "gelu_tanh", "relu"]


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Every hyper-parameter of BERT (Devlin et al., 2019) plus compute settings.

    Attributes mirror Google's ``bert_config.json`` / Hugging Face's ``BertConfig`` so converted
    checkpoints carry their configuration over one-to-one.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    # ALBERT/ELECTRA's factorised embeddings: tables of width E, then a dense E -> hidden_size.
    # None: E = hidden_size and no projection (BERT, RoBERTa).
    embedding_size: int | None = None
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    # Position ids are arange(length) + position_offset: RoBERTa's start after its padding id (2).
    position_offset: int = 0
    # ALBERT's cross-layer sharing: one block's parameters applied num_layers times.
    share_layers: bool = False
    # "gelu" is the paper's exact erf form; "gelu_new"/"gelu_tanh" the tanh approximation.
    hidden_act: HiddenAct = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    # Whether the encoder has the tanh(dense([CLS])) pooler (sentence-transformers checkpoints
    # such as all-MiniLM-L6-v2 ship none).
    use_pooler: bool = True
    # What sequence classifiers (`BertClassifier`) read: "cls", the pooled [CLS] (the paper), or
    # "mean", the last layer averaged over real tokens (sentence-transformers; ModernBERT's
    # ``classifier_pooling``), which needs no pooler and starts from a varied feature when pre-training
    # left [CLS] nearly constant (docs/records.md, "Mean pooling and lr 5e-4 for the demo's BERT").
    classifier_pooling: Literal["cls", "mean"] = "cls"
    # "auto" fields are the platform's choice (bert_jax/model/execution.py), made once when a job
    # starts (`for_platform`, bert_jax/resolve.py); a model is built from concrete values only.
    # Compute dtype; "auto": bfloat16 on GPU/TPU, float32 on CPU.
    dtype: str = "float32"
    param_dtype: str = "float32"
    # Execution: jax.lax.scan over the layers' stacked parameters (fast compile), or unrolled blocks
    # with per-layer parameters (False; faster on CPU); "auto": unrolled on CPU, scanned elsewhere
    # (and for ALBERT's shared block).
    # Checkpoints and stored weights hold one (stacked) layout and load into either. Rematerialisation
    # per block.
    scan_layers: bool | Literal["auto"] = True
    remat_policy: str = "none"  # none | full | dots_saveable | ... (jax.checkpoint_policies names)
    # jax.nn.dot_product_attention on XLA ("xla") or cuDNN's flash attention for padding masks
    # ("cudnn"), unless probabilities or attention dropout are needed, or "explicit" softmax always;
    # "auto": cudnn on an NVIDIA GPU where it applies, else xla.
    attention_impl: Literal["auto", "xla", "cudnn", "explicit"] = "xla"
    # How dropout draws its mask: "jax" (jax.random.bernoulli), "fused" (Threefry unrolled into the
    # dropout's fusion: bert_jax/model/dropout.py); "auto": fused on CPU, jax elsewhere.
    dropout_impl: Literal["auto", "jax", "fused"] = "jax"

    def __post_init__(self):
        if isinstance(self.scan_layers, str) and self.scan_layers.lower() in ("true", "false"):
            # ml_collections configs hold the field as a string ("auto" | "true" | "false")
            object.__setattr__(self, "scan_layers", self.scan_layers.lower() == "true")
        checks = {
            "vocab_size": self.vocab_size > 0,
            "num_layers": self.num_layers > 0,
            "num_heads": self.num_heads > 0,
            "hidden_size": self.hidden_size > 0 and self.hidden_size % max(self.num_heads, 1) == 0,
            "intermediate_size": self.intermediate_size > 0,
            "max_position_embeddings": self.max_position_embeddings > 0,
            "type_vocab_size": self.type_vocab_size > 0,
            "embedding_size": self.embedding_size is None or self.embedding_size > 0,
            "position_offset": self.position_offset >= 0,
            "hidden_dropout_prob": 0.0 <= self.hidden_dropout_prob < 1.0,
            "attention_dropout_prob": 0.0 <= self.attention_dropout_prob < 1.0,
            "hidden_act": self.hidden_act in ("gelu", "gelu_new", "gelu_tanh", "relu"),
            "dropout_impl": self.dropout_impl in DROPOUT_IMPLS,
            "scan_layers": isinstance(self.scan_layers, bool) or self.scan_layers == "auto",
            "classifier_pooling": self.classifier_pooling in CLASSIFIER_POOLINGS,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"invalid BertConfig field(s) {bad}: {[getattr(self, k) for k in bad]} "
                "(hidden_size must be divisible by num_heads; probabilities in [0, 1))"
            )
        jnp.dtype(resolve_dtype(self.dtype, "cpu")), jnp.dtype(self.param_dtype)  # raise early on an unknown dtype
        resolve_attention(self.attention_impl, "cpu")  # and on an unknown attention_impl, naming the choices

    @property
    def max_length(self) -> int:
        """The longest row (specials included) the position table takes."""
        return self.max_position_embeddings - self.position_offset

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def embed_dim(self) -> int:
        """E: the width of the embedding tables (hidden_size unless factorised)."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @property
    def stored_layers(self) -> int:
        """How many blocks' parameters the encoder holds: 1 when shared, else num_layers."""
        return 1 if self.share_layers else self.num_layers

    def for_platform(self, platform: str) -> BertConfig:
        """This config with every "auto" field resolved for ``platform`` ("cpu", "gpu", "tpu", ...;
        `bert_jax.model.execution`): what a job does once, at its start."""
        dtype = resolve_dtype(self.dtype, platform)
        return dataclasses.replace(
            self, dtype=dtype, scan_layers=resolve_scan(self.scan_layers, platform, shared=self.share_layers),
            attention_impl=resolve_attention(self.attention_impl, platform, dtype=dtype, head_dim=self.head_dim),
            dropout_impl=resolve_dropout(self.dropout_impl, platform))

    @property
    def unresolved(self) -> list[str]:
        """The fields still "auto"."""
        return [k for k in ("dtype", "scan_layers", "attention_impl", "dropout_impl") if getattr(self, k) == "auto"]

    def check_resolved(self) -> None:
        """Raises ValueError naming the fields still "auto" (a model needs concrete values)."""
        if self.unresolved:
            raise ValueError(f"BertConfig fields {self.unresolved} are 'auto': resolve them for the platform "
                             "first (cfg.for_platform('cpu' | 'gpu' | 'tpu'); bert_jax.resolve does a job's config)")

    @property
    def scanned(self) -> bool:
        """Whether the blocks run as one ``lax.scan`` (ALBERT's shared block always does)."""
        self.check_resolved()
        return bool(self.scan_layers)

    @property
    def stacks_layers(self) -> bool:
        """Whether the blocks' parameters are stacked on a ``layers`` axis (scanned, or ALBERT's
        one shared block) rather than held per layer (``layers/0/...``)."""
        return self.share_layers or self.scanned

    @property
    def compute_dtype(self) -> Any:
        self.check_resolved()
        return jnp.dtype(self.dtype)

    @classmethod
    def from_size(cls, size: str, **overrides: Any) -> BertConfig:
        """BERT's sizes (`SIZES`) or the family's (`FAMILY_SIZES`: albert-base, electra-small, ...)."""
        if size in SIZES:
            layers, hidden, heads = SIZES[size]
            base = dict(num_layers=layers, hidden_size=hidden, num_heads=heads)
        elif size in FAMILY_SIZES:
            base = dict(FAMILY_SIZES[size])
        else:
            raise ValueError(f"unknown model size {size!r}; expected one of {[*SIZES, *FAMILY_SIZES]}")
        return cls(**{"intermediate_size": 4 * base["hidden_size"], **base, **overrides})

    def deterministic(self) -> BertConfig:
        """The same model with dropout off (evaluation, feature extraction, parity tests)."""
        return dataclasses.replace(self, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown BertConfig key(s) {unknown}; expected a subset of {sorted(known)}")
        return cls(**d)


def count_params(cfg: BertConfig, *, with_pooler: bool | None = None, with_mlm: bool = False,
                 with_nsp: bool = False, with_embeddings: bool = True) -> int:
    """Closed-form parameter count (matches the model's; tested against it). ``with_embeddings=False``
    counts an encoder that borrows another's tables (ELECTRA's generator): its projection stays."""
    h, e, i = cfg.hidden_size, cfg.embed_dim, cfg.intermediate_size
    emb = (cfg.vocab_size + cfg.max_position_embeddings + cfg.type_vocab_size) * e + 2 * e
    projection = e * h + h if e != h else 0
    block = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    pooler = h * h + h if (cfg.use_pooler if with_pooler is None else with_pooler) else 0
    mlm = (h * e + e + 2 * e + cfg.vocab_size) if with_mlm else 0
    nsp = (2 * h + 2) if with_nsp else 0
    return emb * with_embeddings + projection + cfg.stored_layers * block + pooler + mlm + nsp

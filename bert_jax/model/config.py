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

# name: (num_layers, hidden_size, num_heads). intermediate = 4 * hidden (the paper's choice).
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
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
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    # "gelu" is the paper's exact erf form; "gelu_new"/"gelu_tanh" the tanh approximation.
    hidden_act: HiddenAct = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    # Whether the encoder has the tanh(dense([CLS])) pooler (sentence-transformers checkpoints
    # such as all-MiniLM-L6-v2 ship none).
    use_pooler: bool = True
    dtype: str = "float32"  # compute dtype: "bfloat16" on accelerators
    param_dtype: str = "float32"
    # Execution: jax.lax.scan over the stacked layers (fast compile) and rematerialisation.
    scan_layers: bool = True
    remat_policy: str = "none"  # none | full | dots_saveable | ... (jax.checkpoint_policies names)
    # "auto": fused jax.nn.dot_product_attention unless probabilities or attention dropout are needed.
    attention_impl: Literal["auto", "xla", "cudnn", "explicit"] = "auto"

    def __post_init__(self):
        checks = {
            "vocab_size": self.vocab_size > 0,
            "num_layers": self.num_layers > 0,
            "num_heads": self.num_heads > 0,
            "hidden_size": self.hidden_size > 0 and self.hidden_size % max(self.num_heads, 1) == 0,
            "intermediate_size": self.intermediate_size > 0,
            "max_position_embeddings": self.max_position_embeddings > 0,
            "type_vocab_size": self.type_vocab_size > 0,
            "hidden_dropout_prob": 0.0 <= self.hidden_dropout_prob < 1.0,
            "attention_dropout_prob": 0.0 <= self.attention_dropout_prob < 1.0,
            "hidden_act": self.hidden_act in ("gelu", "gelu_new", "gelu_tanh", "relu"),
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"invalid BertConfig field(s) {bad}: {[getattr(self, k) for k in bad]} "
                "(hidden_size must be divisible by num_heads; probabilities in [0, 1))"
            )
        jnp.dtype(self.dtype), jnp.dtype(self.param_dtype)  # raise early on an unknown dtype

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    @classmethod
    def from_size(cls, size: str, **overrides: Any) -> BertConfig:
        if size not in SIZES:
            raise ValueError(f"unknown model size {size!r}; expected one of {list(SIZES)}")
        layers, hidden, heads = SIZES[size]
        base = dict(
            num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden
        )
        return cls(**{**base, **overrides})

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
                 with_nsp: bool = False) -> int:
    """Closed-form parameter count (matches the model's; tested against it)."""
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    emb = (cfg.vocab_size + cfg.max_position_embeddings + cfg.type_vocab_size) * h + 2 * h
    block = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    pooler = h * h + h if (cfg.use_pooler if with_pooler is None else with_pooler) else 0
    mlm = (h * h + h + 2 * h + cfg.vocab_size) if with_mlm else 0
    nsp = (2 * h + 2) if with_nsp else 0
    return emb + layers * block + pooler + mlm + nsp

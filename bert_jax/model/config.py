"""The model configuration: one frozen dataclass and a size table.

Variants (eval without dropout, bf16 compute, scan over layers) are `dataclasses.replace` of a
config, never extra keyword plumbing:

    cfg = BertConfig.from_size("base", vocab_size=30522)
    eval_cfg = dataclasses.replace(cfg, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple

import jax.numpy as jnp
import numpy as np

CLASSIFIER_POOLINGS = ("cls", "mean")
POSITION_EMBEDDINGS = ("absolute", "rotary")
NORM_POSITIONS = ("post", "pre")
FFNS = ("dense", "geglu")
INIT_METHODS = ("bert", "megatron")
# *_interpret: a Pallas kernel in Pallas' interpreter (any backend: how the CPU tests check it).
ATTENTION_IMPLS = ("xla", "cudnn", "explicit", "splash", "splash_interpret", "flash", "flash_interpret")
DROPOUT_IMPLS = ("jax", "fused")
NORM_IMPLS = ("xla", "fused", "fused_interpret")
GELU_IMPLS = ("erfc", "erf")
EXECUTION_FIELDS = ("dtype", "scan_layers", "stacked_params", "attention_impl", "dropout_impl", "norm_impl",
                    "recompute_activation", "gelu_impl")

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
    # ModernBERT (Warner et al., 2024, Table 3; Hugging Face's released configs): rotary positions
    # (global layers' base 160k, local layers' 10k), no token types, pre-LayerNorm without biases and a
    # final norm, GeGLU feed-forward, no biases in the linear layers, every third layer global and the
    # others a 128-token window; base 149M, large 395M parameters. tiny/mini are for tests and runlocal.
    **{f"modernbert-{name}": dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=inter,
                                  vocab_size=50368, max_position_embeddings=8192, type_vocab_size=0,
                                  position_embedding="rotary", rope_theta=160_000.0, local_rope_theta=10_000.0,
                                  local_window=128, global_every=3, norm_position="pre", ffn="geglu",
                                  use_bias=False, norm_bias=False, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
                                  attention_dropout_prob=0.0, use_pooler=False, init_method="megatron")
       for name, (layers, hidden, heads, inter) in {"tiny": (2, 128, 2, 192), "mini": (4, 256, 4, 384),
                                                    "base": (22, 768, 12, 1152),
                                                    "large": (28, 1024, 16, 2624)}.items()},
}

def _is_dtype(name: str) -> bool:
    try:
        jnp.dtype(name)
    except TypeError:
        return False
    return True


HiddenAct = Literal["gelu", "gelu_new", "gelu_tanh", "relu"]


class LayerSpec(NamedTuple):
    """One block's (or, as arrays [num_layers], every block's) place in the stack: what alternates
    between ModernBERT's global and local layers, and its first block's unnormed attention input."""

    window: Any  # int32: the local window in tokens (each query sees +-window // 2); 0 = global
    rope_theta: Any  # float32: the rotary base of the layer
    norm_input: Any  # bool: a pre-norm block normalises its attention input (all but ModernBERT's layer 0)

    def at(self, i: int) -> LayerSpec:
        """Layer i's entries as Python values (unrolled blocks branch on them when tracing)."""
        return LayerSpec(int(self.window[i]), float(self.rope_theta[i]), bool(self.norm_input[i]))


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
    # 0: no token-type table, segment ids are ignored (ModernBERT); 1: one type, ignored too (RoBERTa).
    type_vocab_size: int = 2
    # Position ids are arange(length) + position_offset: RoBERTa's start after its padding id (2).
    position_offset: int = 0
    # ModernBERT's switches; the defaults are BERT's.
    # "absolute": a learned position table added to the embeddings; "rotary": no table, queries and keys
    # rotated by their position (RoPE, GPT-NeoX's half-split layout) with base rope_theta in global
    # layers and local_rope_theta in local ones. max_position_embeddings then only bounds the length.
    position_embedding: Literal["absolute", "rotary"] = "absolute"
    rope_theta: float = 10_000.0
    local_rope_theta: float = 10_000.0
    # Local attention: a layer that is not global sees the keys within local_window // 2 positions of
    # the query (HF ModernBERT's local_attention, 128: +-64). Layer i is global iff i % global_every == 0
    # (layer 0 always). local_window 0: every layer global (BERT).
    local_window: int = 0
    global_every: int = 1
    # "post": LN(x + sublayer(x)) (BERT); "pre": x + sublayer(LN(x)), the first block's attention
    # reading the normed embeddings as they are, and a final LayerNorm after the last block (ModernBERT).
    norm_position: Literal["post", "pre"] = "post"
    # "dense": dense -> act -> dense; "geglu": one projection to 2 x intermediate, act(first half) x
    # second half, dense back (ModernBERT's GeGLU).
    ffn: Literal["dense", "geglu"] = "dense"
    # Biases of the blocks' linear layers and of the MLM head's transform (not the MLM output bias,
    # the pooler or task heads); of every LayerNorm.
    use_bias: bool = True
    norm_bias: bool = True
    # ALBERT's cross-layer sharing: one block's parameters applied num_layers times.
    share_layers: bool = False
    # "gelu" is the paper's exact erf form; "gelu_new"/"gelu_tanh" the tanh approximation.
    hidden_act: HiddenAct = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    # How fresh weights are drawn (bert_jax/model/layers.py, weight_init): N(0, initializer_range²) cut at
    # ±2σ; "megatron" (ModernBERT's reference) draws the blocks' output projections with σ / sqrt(2 · num_layers).
    init_method: Literal["bert", "megatron"] = "bert"
    # Whether the encoder has the tanh(dense([CLS])) pooler (sentence-transformers checkpoints
    # such as all-MiniLM-L6-v2 ship none).
    use_pooler: bool = True
    # What sequence classifiers (`BertClassifier`) read: "cls", the pooled [CLS] (the paper), or
    # "mean", the last layer averaged over real tokens (sentence-transformers; ModernBERT's
    # ``classifier_pooling``), which needs no pooler and starts from a varied feature when pre-training
    # left [CLS] nearly constant (docs/records.md, "Mean pooling and lr 5e-4 for the demo's BERT").
    classifier_pooling: Literal["cls", "mean"] = "cls"
    # Concrete values only (`__post_init__` refuses anything else): what a job config's auto values
    # of the execution fields below mean on a platform is bert_jax/resolve.py's choice, made once
    # when the job starts, never the model's.
    # Compute dtype (float32, bfloat16, ...).
    dtype: str = "float32"
    param_dtype: str = "float32"
    # Execution: jax.lax.scan over the layers' stacked parameters (fast compile), or unrolled blocks
    # with per-layer parameters (False; faster on CPU).
    # Checkpoints and stored weights hold one (stacked) layout and load into either. Rematerialisation
    # per block.
    scan_layers: bool = True
    # Unrolled blocks only (a scan always reads the stack): each block's parameters sliced from the
    # stacked arrays the scan uses (one array a parameter kind: 16 for BERT's blocks) instead of held
    # per layer (one a layer and kind: 192 for BERT-base's), the same numbers; fewer arrays for the
    # step's dispatch and the optimizer's kernels (docs/records.md, "Unrolled blocks over stacked
    # parameters").
    stacked_params: bool = False
    remat_policy: str = "none"  # none | full | dots_saveable | ... (jax.checkpoint_policies names)
    # jax.nn.dot_product_attention on XLA ("xla") or cuDNN's flash attention for padding masks
    # ("cudnn"), or the TPU's Pallas splash attention ("splash": segment ids for padding and packing,
    # ModernBERT's local windows; lengths a multiple of 128, else XLA), unless probabilities or
    # attention dropout are needed, or "explicit" softmax always; "flash": the GPU's Pallas (Triton)
    # flash attention with the dropout drawn inside it (bert_jax/model/flash.py; segment ids, windows).
    attention_impl: Literal["xla", "cudnn", "explicit", "splash", "splash_interpret", "flash",
                            "flash_interpret"] = "xla"
    # How dropout draws its mask: "jax" (jax.random.bernoulli), "fused" (Threefry unrolled into the
    # dropout's fusion: bert_jax/model/dropout.py).
    dropout_impl: Literal["jax", "fused"] = "jax"
    # A post-norm block's LN(x + dropout(a)): XLA's ops ("xla"), or one GPU kernel ("fused": Pallas,
    # lowered to Triton, the mask drawn inside it; bert_jax/model/fused_norm.py; "fused_interpret":
    # that kernel in Pallas' interpreter). A width the kernel does not take runs on XLA.
    norm_impl: Literal["xla", "fused", "fused_interpret"] = "xla"
    # The dense feed-forward's activation recomputed in the backward from its input (jax.checkpoint):
    # the same numbers, less memory; less HBM traffic on a GPU, more on a TPU (docs/records.md,
    # "GELU recomputed in the backward").
    recompute_activation: bool = False
    # The exact GELU ("gelu") as jax.nn.gelu computes it, through erfc ("erfc"), or as
    # x · (1 + erf(x / √2)) / 2 in float32 ("erf": the same values within 1e-6 in float32, a fraction of
    # erfc's arithmetic: docs/records.md, "GELU through erf on a GPU"). GeGLU's is always through erf.
    gelu_impl: Literal["erfc", "erf"] = "erfc"

    def __post_init__(self):
        for name in ("scan_layers", "stacked_params", "recompute_activation"):
            value = getattr(self, name)
            if isinstance(value, str) and value.lower() in ("true", "false"):
                # ml_collections configs hold the field as a string ("true" | "false")
                object.__setattr__(self, name, value.lower() == "true")
        execution = {"dtype": _is_dtype(self.dtype), "scan_layers": isinstance(self.scan_layers, bool),
                     "stacked_params": isinstance(self.stacked_params, bool),
                     "attention_impl": self.attention_impl in ATTENTION_IMPLS,
                     "dropout_impl": self.dropout_impl in DROPOUT_IMPLS,
                     "norm_impl": self.norm_impl in NORM_IMPLS,
                     "recompute_activation": isinstance(self.recompute_activation, bool),
                     "gelu_impl": self.gelu_impl in GELU_IMPLS}
        if bad := [k for k, ok in execution.items() if not ok]:
            raise ValueError(
                f"BertConfig field(s) {bad} = {[getattr(self, k) for k in bad]}: a model takes concrete values "
                f"(dtype: a dtype name such as float32 or bfloat16; scan_layers, stacked_params: True or False; "
                f"attention_impl: "
                f"{' | '.join(ATTENTION_IMPLS)}; dropout_impl: {' | '.join(DROPOUT_IMPLS)}; norm_impl: "
                f"{' | '.join(NORM_IMPLS)}; recompute_activation: True or False; gelu_impl: "
                f"{' | '.join(GELU_IMPLS)}); a job config's 'auto' "
                "is resolved for its platform first (bert_jax.resolve.resolve)")
        checks = {
            "vocab_size": self.vocab_size > 0,
            "num_layers": self.num_layers > 0,
            "num_heads": self.num_heads > 0,
            "hidden_size": self.hidden_size > 0 and self.hidden_size % max(self.num_heads, 1) == 0,
            "intermediate_size": self.intermediate_size > 0,
            "max_position_embeddings": self.max_position_embeddings > 0,
            "type_vocab_size": self.type_vocab_size >= 0,
            "embedding_size": self.embedding_size is None or self.embedding_size > 0,
            "position_offset": self.position_offset >= 0,
            "hidden_dropout_prob": 0.0 <= self.hidden_dropout_prob < 1.0,
            "attention_dropout_prob": 0.0 <= self.attention_dropout_prob < 1.0,
            "hidden_act": self.hidden_act in ("gelu", "gelu_new", "gelu_tanh", "relu"),
            "classifier_pooling": self.classifier_pooling in CLASSIFIER_POOLINGS,
            "position_embedding": self.position_embedding in POSITION_EMBEDDINGS,
            "rope_theta": self.rope_theta > 0,
            "local_rope_theta": self.local_rope_theta > 0,
            "local_window": self.local_window >= 0,
            "global_every": self.global_every >= 1,
            "norm_position": self.norm_position in NORM_POSITIONS,
            "ffn": self.ffn in FFNS,
            "init_method": self.init_method in INIT_METHODS,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"invalid BertConfig field(s) {bad}: {[getattr(self, k) for k in bad]} "
                "(hidden_size must be divisible by num_heads; probabilities in [0, 1); position_embedding: "
                f"{' | '.join(POSITION_EMBEDDINGS)}; norm_position: {' | '.join(NORM_POSITIONS)}; ffn: "
                f"{' | '.join(FFNS)}; init_method: {' | '.join(INIT_METHODS)}; thetas > 0; local_window >= 0; "
                "global_every >= 1)"
            )
        if self.rotary and (self.head_dim % 2 or self.position_offset):
            raise ValueError(f"position_embedding='rotary' needs an even head width (hidden_size / num_heads = "
                             f"{self.head_dim}) and position_offset 0 (got {self.position_offset})")
        jnp.dtype(self.param_dtype)  # raise early on an unknown dtype

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
    def rotary(self) -> bool:
        return self.position_embedding == "rotary"

    @property
    def pre_norm(self) -> bool:
        return self.norm_position == "pre"

    def layer_specs(self) -> LayerSpec | None:
        """What differs between the blocks beyond their parameters, one entry per layer: `LayerSpec`
        of arrays [num_layers] (a ``lax.scan`` carries them beside the stacked parameters; unrolled
        blocks get `LayerSpec.at` Python values). None for BERT, whose blocks are all alike."""
        if not (self.rotary or self.local_window or self.pre_norm):
            return None
        i = np.arange(self.num_layers)
        is_global = (i % self.global_every == 0) | (self.local_window == 0)
        return LayerSpec(window=np.where(is_global, 0, self.local_window).astype(np.int32),
                         rope_theta=np.where(is_global, self.rope_theta, self.local_rope_theta).astype(np.float32),
                         norm_input=(i > 0) | (not self.pre_norm))

    @property
    def stored_layers(self) -> int:
        """How many blocks' parameters the encoder holds: 1 when shared, else num_layers."""
        return 1 if self.share_layers else self.num_layers

    @property
    def scanned(self) -> bool:
        """Whether the blocks run as one ``lax.scan`` (ALBERT's shared block always does)."""
        return bool(self.scan_layers)

    @property
    def stacks_layers(self) -> bool:
        """Whether the blocks' parameters are stacked on a ``layers`` axis (scanned, ALBERT's one
        shared block, or ``stacked_params``) rather than held per layer (``layers/0/...``)."""
        return self.share_layers or self.scanned or self.stacked_params

    @property
    def compute_dtype(self) -> Any:
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
    counts an encoder that borrows another's tables (ELECTRA's generator): its projection stays.
    A pre-norm stack holds layer 0's attention LayerNorm too (unused: `BertConfig.layer_specs`)."""
    h, e, i = cfg.hidden_size, cfg.embed_dim, cfg.intermediate_size
    b, nb = int(cfg.use_bias), int(cfg.norm_bias)
    norm = lambda width: width * (1 + nb)  # noqa: E731
    positions = cfg.max_position_embeddings if cfg.position_embedding == "absolute" else 0
    emb = (cfg.vocab_size + positions + cfg.type_vocab_size) * e + norm(e)
    projection = e * h + h if e != h else 0
    wi = 2 * i if cfg.ffn == "geglu" else i
    block = 4 * h * h + b * 4 * h + 2 * norm(h) + (h * wi + b * wi) + (i * h + b * h)
    final = norm(h) if cfg.norm_position == "pre" else 0
    pooler = h * h + h if (cfg.use_pooler if with_pooler is None else with_pooler) else 0
    mlm = (h * e + b * e + norm(e) + cfg.vocab_size) if with_mlm else 0
    nsp = (2 * h + 2) if with_nsp else 0
    return emb * with_embeddings + projection + cfg.stored_layers * block + final + pooler + mlm + nsp

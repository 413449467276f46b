"""BertConfig: size table, validation, parameter counts against the paper."""

import dataclasses

import jax
import pytest
from flax import nnx

from bert_jax.model.config import SIZES, BertConfig, count_params
from bert_jax.model.models import BertForPreTraining


def test_size_table_shapes():
    assert SIZES["tiny"] == (2, 128, 2) and SIZES["base"] == (12, 768, 12)
    cfg = BertConfig.from_size("large")
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size) == (24, 1024, 16, 4096)


@pytest.mark.parametrize("size,paper", [("base", 110e6), ("large", 340e6)])
def test_param_count_matches_paper(size, paper):
    # The paper reports 110M / 340M, rounded to the nearest 10M; we allow 2% around them.
    cfg = BertConfig.from_size(size, vocab_size=30522)
    model = nnx.eval_shape(lambda: BertForPreTraining(cfg, rngs=nnx.Rngs(0), objective="none"))
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    n_model = sum(x.size for x in leaves)
    assert n_model == count_params(cfg, with_mlm=True)
    encoder_only = count_params(cfg)
    assert abs(encoder_only - paper) / paper < 0.02, encoder_only


def test_eval_variant_is_dataclasses_replace():
    cfg = BertConfig.from_size("tiny")
    ev = cfg.deterministic()
    assert ev == dataclasses.replace(cfg, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 3  # type: ignore[misc]


@pytest.mark.parametrize("bad", [dict(hidden_size=100, num_heads=3), dict(hidden_dropout_prob=1.0),
                                 dict(hidden_act="swish"), dict(vocab_size=0)])
def test_invalid_config_is_rejected(bad):
    with pytest.raises(ValueError, match="invalid BertConfig"):
        BertConfig(**bad)


def test_unknown_size_and_keys():
    with pytest.raises(ValueError, match="unknown model size"):
        BertConfig.from_size("huge")
    with pytest.raises(ValueError, match="unknown BertConfig key"):
        BertConfig.from_dict({"hidden": 3})
    cfg = BertConfig.from_size("mini")
    assert BertConfig.from_dict(cfg.to_dict()) == cfg

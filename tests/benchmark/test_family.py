"""The benchmark across the family (``--model``): arguments, each FLOP formula against the jitted
step, and the parameter rows against the papers."""

import dataclasses
import math
import re

import jax
import pytest
from flax import nnx

from bert_jax.benchmark import args as benchmark_args
from bert_jax.benchmark import timing
from bert_jax.benchmark.flops import model_flops
from bert_jax.benchmark.params import PAPER_PARAMS, PAPER_VOCAB, param_counts
from bert_jax.config_args import config_module, load_config_file
from bert_jax.model.config import SIZES, count_params
from bert_jax.training import train_step as ts
from bert_jax.training.trainer import model_config

SHAPES = ["--seq_len", "32", "--vocab_size", "512", "--mesh", "1,1,1",
          "--output", ""]


def test_model_picks_the_recipe_sizes_and_vocabulary(capsys):
    parse = benchmark_args.parse_args
    recipes = config_module("pretrain")
    assert benchmark_args.model_sizes() == {"bert": tuple(SIZES), "roberta": tuple(SIZES),
                                            **{m: recipes.FAMILY_SIZE_NAMES[m] for m in ("albert", "electra")}}
    assert set(benchmark_args.model_sizes()) == set(recipes.MODELS)
    a = parse([])
    assert (a.model, a.size, a.vocab_size, a.attention_dropout) == ("bert", "base", 30522, None)
    for model, size, vocab in [("roberta", "base", 50265), ("albert", "base", 30000), ("electra", "small", 30522)]:
        a = parse(["--model", model])
        assert (a.size, a.vocab_size) == (size, vocab), model
    assert parse(["--model", "roberta", "--size", "tiny", "--vocab_size", "99"]).vocab_size == 99
    for argv, message in [(["--model", "albert", "--size", "tiny"],
                           "--size tiny for --model albert: expected one of base | large | xlarge | xxlarge"),
                          (["--model", "electra", "--size", "xlarge"], "expected one of small | base | large"),
                          (["--size", "xxlarge"], "--size xxlarge for --model bert: expected one of tiny"),
                          (["--model", "gpt2"], "invalid choice: 'gpt2'"),
                          (["--model", "electra", "--packing", "2"], "ELECTRA has no sentence-level head"),
                          (["--model", "albert", "--compare", "hf-torch"], "goes with --model bert"),
                          (["--size", "tiny", "--variant", "--model roberta"], "not the shapes or the mode; --model")]:
        with pytest.raises(SystemExit):
            parse(argv)
        assert message in capsys.readouterr().err, argv


DOT = re.compile(r"stablehlo\.dot_general .*contracting_dims = \[([\d, ]*)\] x .*: "
                 r"\(tensor<([\dx]+)x\w+>, tensor<[^>]*>\) -> tensor<([\dx]+)x\w+>")


def matmul_flops(lowered) -> int:
    """2·M·N·K summed over every dot_general of the lowered (StableHLO) step."""
    total = 0
    for line in lowered.as_text().splitlines():
        if "stablehlo.dot_general" in line:
            contracting, lhs, out = DOT.search(line).groups()
            lhs = [int(d) for d in lhs.split("x")]
            k = math.prod(lhs[int(i)] for i in contracting.split(",") if i.strip())
            total += 2 * k * math.prod(int(d) for d in out.split("x"))
    return total


@pytest.mark.parametrize("model,size", [("bert", "tiny"), ("roberta", "tiny"), ("albert", "base"),
                                        ("electra", "small")])
def test_flops_match_the_jitted_step(model, size, monkeypatch):
    """Each formula against the step the benchmark jits, unrolled (--noscan: a scanned body counts
    once) and two layers deep (the formulas are linear in L; it keeps lowering fast): exactly the
    matmuls of the lowered program, less the pooler + NSP/SOP head the formula leaves out; and XLA's
    cost_analysis, which also counts element-wise work and the optimizer, within [1, 1.2] x it."""
    def two_layers(name, arg):
        config = load_config_file(name, arg)
        config.model.num_layers = 2
        return config

    monkeypatch.setattr(timing, "load_config_file", two_layers)
    bench = timing.Bench(benchmark_args.parse_args([*SHAPES, "--model", model, "--size", size, "--noscan"]))
    cfg, b = bench.cfg, 2
    assert (cfg.num_layers, cfg.scan_layers, cfg.share_layers) == (2, False, model == "albert")
    lowered = bench.lower(b)
    flops = bench.flops(b)
    assert flops == model_flops(cfg, bench.objective, b, 32, 5, None, bench.generator_fraction)
    h = cfg.hidden_size
    sentence_head = 6 * b * (h * h + 2 * h) if bench.objective in ("nsp", "sop") else 0  # pooler + NSP/SOP
    assert matmul_flops(lowered) == flops + sentence_head
    xla = lowered.cost_analysis()["flops"]
    assert flops <= xla <= 1.2 * flops, xla / flops
    row = bench.describe(b)["params"]  # the run's parameter row, from the state
    assert row["encoder"] == count_params(cfg) and row["paper_vocab"] == PAPER_VOCAB[model]


def test_each_family_term_is_what_the_formula_says():
    """The terms that set the family apart, by hand: ALBERT's projection and E-wide head, sharing
    that saves no FLOPs, ELECTRA's generator + discriminator + replaced-token head."""
    b, s, p, v = 2, 16, 3, 100
    albert = model_config(load_config_file("pretrain", "model=albert,size=base"), v)
    h, e, i, n = 768, 128, 3072, 12
    blocks = 6 * b * s * n * (4 * h * h + 2 * h * i) + 12 * n * b * s * s * h
    assert model_flops(albert, "sop", b, s, p) == blocks + 6 * b * s * e * h + 6 * b * p * (h * e + e * v)
    unshared = dataclasses.replace(albert, share_layers=False)
    assert model_flops(unshared, "sop", b, s, p) == model_flops(albert, "sop", b, s, p)
    small = model_config(load_config_file("pretrain", "model=electra,size=small"), v)  # H 256, E 128, I 1024
    hg, ig = 64, 256  # the generator: a quarter of the discriminator
    generator = (6 * b * s * n * (4 * hg * hg + 2 * hg * ig) + 12 * n * b * s * s * hg + 6 * b * s * e * hg
                 + 6 * b * p * (hg * e + e * v))
    h, i = 256, 1024
    discriminator = (6 * b * s * n * (4 * h * h + 2 * h * i) + 12 * n * b * s * s * h + 6 * b * s * e * h
                     + 6 * b * s * (h * h + h))
    assert model_flops(small, "rtd", b, s, p, generator_fraction=0.25) == generator + discriminator
    with pytest.raises(ValueError, match="generator_fraction"):
        model_flops(small, "rtd", b, s, p)


# Our encoder at the paper's vocabulary / the paper's figure. ALBERT xlarge and xxlarge come out at
# 58.7M and 222.6M with the architecture the paper describes (as do Hugging Face's checkpoints).
RATIOS = {("bert", "base"): 0.995, ("bert", "large"): 0.986, ("roberta", "base"): 0.997,
          ("roberta", "large"): 1.001, ("albert", "base"): 0.974, ("albert", "large"): 0.982,
          ("albert", "xlarge"): 0.978, ("albert", "xxlarge"): 0.947, ("electra", "small"): 0.963,
          ("electra", "base"): 0.99, ("electra", "large"): 0.997}


@pytest.mark.parametrize("model,size", sorted(PAPER_PARAMS))
def test_parameter_rows_against_the_papers(model, size):
    config = load_config_file("pretrain", f"model={model},size={size},synthetic=True")
    cfg = model_config(config, 512)  # the state at a small vocabulary, restated at the paper's
    cfg = cfg.for_platform("cpu")  # as a job resolves it
    electra = dict(config.electra) if "electra" in config else None
    params = nnx.state(nnx.eval_shape(lambda: ts.pretraining_model(cfg, config.objective, electra)(0)),
                       nnx.Param).to_pure_dict()
    row = param_counts(model, size, params, cfg.embed_dim, 512, cfg.max_position_embeddings,
                       config.model.max_position_embeddings)
    assert row["total"] == sum(x.size for x in jax.tree.leaves(params))
    assert row["encoder"] == count_params(cfg) < row["total"]
    assert row["encoder_at_paper_vocab"] == count_params(dataclasses.replace(cfg, vocab_size=PAPER_VOCAB[model]))
    assert row["paper"] == PAPER_PARAMS[model, size]
    assert row["ours_over_paper"] == pytest.approx(RATIOS[model, size], abs=0.0015)

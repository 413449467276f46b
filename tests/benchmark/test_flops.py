"""Model FLOPs (bert_jax/benchmark/flops.py): BERT's formula against a hand count of every matmul, each
family formula against the matmuls of the step the benchmark jits, the family's terms by hand, and
the published peaks."""

import dataclasses
import math
import re

import pytest

from bert_jax.benchmark import step
from bert_jax.benchmark.flops import dense_mlm_flops, model_flops, pretraining_flops, published_peak
from bert_jax.config_args import load_config_file
from bert_jax.model.config import BertConfig


def test_flops_match_a_hand_count_of_every_matmul():
    cfg = BertConfig.from_size("tiny", vocab_size=100)  # L=2, H=128, I=512
    b, s, p = 3, 16, 4
    h, i, v = 128, 512, 100
    per_layer = [  # (rows, contraction, columns) of each forward matmul
        (b * s, h, h), (b * s, h, h), (b * s, h, h),  # query, key, value
        (b * s, h, h),  # attention output projection
        (b * s * s, h, 1),  # scores: B·N heads of (S x H/N) @ (H/N x S) = B·S·S·H multiply-adds
        (b * s * s, h, 1),  # probabilities @ values, same count
        (b * s, h, i), (b * s, i, h),  # feed-forward
    ]
    head = [(b * p, h, h), (b * p, h, v)]  # MLM transform and tied decoder on the P gathered positions
    forward = 2 * cfg.num_layers * sum(m * k * n for m, k, n in per_layer) + 2 * sum(m * k * n for m, k, n in head)
    assert pretraining_flops(cfg, b, s, p) == 3 * forward  # backward = 2 x forward
    t = 7  # unpadded: the blocks' dense work on 7 token slots, attention still on [b, s]
    dense_per_token = 3 * 2 * cfg.num_layers * (4 * h * h + 2 * h * i)
    assert pretraining_flops(cfg, b, s, p, tokens=t) == 3 * forward - (b * s - t) * dense_per_token
    # BERT-base at S=128, B=8, P=20: 559 GFLOP with the gathered head, 684 with a dense one.
    base = BertConfig.from_size("base")
    assert round(pretraining_flops(base, 8, 128, 20) / 1e9) == 559
    assert round(dense_mlm_flops(base, 8, 128) / 1e9) == 684


def test_published_peaks_by_device_kind():
    assert published_peak("NVIDIA H100 80GB HBM3", "bfloat16")[0] == 989e12
    assert published_peak("NVIDIA H100 PCIe", "bfloat16")[0] == 756e12
    assert published_peak("NVIDIA A100-SXM4-40GB", "bfloat16")[0] == 312e12
    assert published_peak("TPU v5 lite", "bfloat16")[0] == 197e12
    assert published_peak("TPU v5", "float32")[0] == 459e12
    assert published_peak("cpu", "float32") is None


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
                                        ("electra", "small"), ("modernbert", "base")])
def test_flops_match_the_jitted_step(model, size, monkeypatch):
    """Each formula against the step the benchmark jits, unrolled (--noscan: a scanned body counts
    once) and two layers deep (the formulas are linear in L; it keeps lowering fast): exactly the
    matmuls of the lowered program, less the pooler + NSP/SOP head the formula leaves out; and XLA's
    cost_analysis, which also counts element-wise work and the optimizer, within [1, 1.2] x it."""
    def two_layers(name, arg):
        config = load_config_file(name, arg)
        config.model.num_layers = 2
        return config

    monkeypatch.setattr(step, "load_config_file", two_layers)
    bench = step.Bench(step.parse_args(["--seq_len", "32", "--vocab_size", "512", "--mesh", "1,1,1", "--output", "",
                                        "--model", model, "--size", size, "--noscan", "--batch_size", "2"]))
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


def test_modernberts_local_layers_count_the_keys_in_their_window():
    """A local layer attends to the keys within window // 2 of each query (a numpy count of the band),
    and the global ones (every third, layer 0 first) to all: 12·B·H per (query, key) pair."""
    import numpy as np

    from bert_jax.benchmark.flops import attended_pairs

    for length, window in ((8, 4), (1024, 128), (64, 128), (10, 2)):
        idx = np.arange(length)
        assert attended_pairs(length, window) == int((np.abs(idx[:, None] - idx[None, :]) <= window // 2).sum())
    cfg = BertConfig.from_size("modernbert-base", vocab_size=100)  # 22 layers: 8 global, 14 local
    b, s, h = 2, 1024, cfg.hidden_size
    everything_global = dataclasses.replace(cfg, local_window=0)
    saved = 12 * b * h * 14 * (s * s - attended_pairs(s, 128))
    assert model_flops(everything_global, "none", b, s, 5) - model_flops(cfg, "none", b, s, 5) == saved


def test_each_family_term_is_what_the_formula_says():
    """The terms that set the family apart, by hand: ALBERT's projection and E-wide head, sharing
    that saves no FLOPs, ELECTRA's generator + discriminator + replaced-token head."""
    b, s, p, v = 2, 16, 3, 100
    albert = BertConfig.from_size("albert-base", vocab_size=v)
    h, e, i, n = 768, 128, 3072, 12
    assert (albert.hidden_size, albert.embed_dim, albert.share_layers) == (h, e, True)
    blocks = 6 * b * s * n * (4 * h * h + 2 * h * i) + 12 * n * b * s * s * h
    assert model_flops(albert, "sop", b, s, p) == blocks + 6 * b * s * e * h + 6 * b * p * (h * e + e * v)
    unshared = dataclasses.replace(albert, share_layers=False)
    assert model_flops(unshared, "sop", b, s, p) == model_flops(albert, "sop", b, s, p)
    small = BertConfig.from_size("electra-small", vocab_size=v)  # H 256, E 128, I 1024
    hg, ig = 64, 256  # the generator: a quarter of the discriminator
    generator = (6 * b * s * n * (4 * hg * hg + 2 * hg * ig) + 12 * n * b * s * s * hg + 6 * b * s * e * hg
                 + 6 * b * p * (hg * e + e * v))
    h, i = 256, 1024
    discriminator = (6 * b * s * n * (4 * h * h + 2 * h * i) + 12 * n * b * s * s * h + 6 * b * s * e * h
                     + 6 * b * s * (h * h + h))
    assert model_flops(small, "rtd", b, s, p, generator_fraction=0.25) == generator + discriminator
    with pytest.raises(ValueError, match="generator_fraction"):
        model_flops(small, "rtd", b, s, p)

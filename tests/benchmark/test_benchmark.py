"""The training-step benchmark: FLOP formula against a hand count, a tiny run, memory-only, search."""

import json
import sys

import pytest

from bert_jax.benchmark import command as benchmark
from bert_jax.benchmark import memory as benchmark_memory
from bert_jax.benchmark.flops import dense_mlm_flops, pretraining_flops, published_peak
from bert_jax.model.config import BertConfig
from input_pipeline.command_line import UserError

# Less LLVM optimisation: the step compiles in about half the time (its speed does not matter here).
TINY = ["--size", "tiny", "--seq_len", "32", "--vocab_size", "512", "--mesh", "1,1,1",
        "--xla_option", "xla_backend_optimization_level=0"]


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


def test_largest_fitting_search():
    limit = 1 << 16
    for q in (500, 5000, 10**9):  # from strongly convex to affine
        for a, c, budget in [(100, 7, 1000), (100, 7, 99), (100, 7, 107), (5, 1, 10**6), (3, 2, 10**12),
                             (3, 2, 777_777)]:
            def f(n, a=a, c=c, q=q):
                return a + c * n + n * n // q

            expected = max(n for n in range(limit + 1) if n == 0 or f(n) <= budget)
            calls = set()
            found = benchmark_memory.largest_fitting(lambda n, calls=calls, f=f: calls.add(n) or f(n), budget, limit)
            assert found == expected, (q, a, c, budget)
            assert len(calls) <= 26
            if q > 500 and budget == 1000:  # nearly affine, as memory in the batch is: a few compiles
                assert len(calls) <= 4


def test_benchmark_runs_tiny_model_and_writes_json(tmp_path):
    out = tmp_path / "results.jsonl"
    (r,) = benchmark.main([*TINY, "--batch_size", "4", "--steps", "2", "--warmup", "1", "--output", str(out),
                           "--profile", str(tmp_path / "trace")])
    for key in ("compile_s", "step_time_median_s", "step_time_min_s", "sequences_per_s", "tokens_per_s",
                "model_flops_per_step", "achieved_flops_per_s", "peak_flops_per_s", "mfu"):
        assert r[key] > 0, key
    assert r["model_flops_per_step"] == pretraining_flops(BertConfig.from_size("tiny", vocab_size=512), 4, 32, 5)
    assert "measured" in r["peak_source"]  # CPU: the matmul measured in the same run
    assert "explicit" in r["attention_path"]  # attention dropout 0.1 needs the probabilities
    line = json.loads(out.read_text().splitlines()[-1])
    assert line["mode"] == "train_step" and line["batch_size"] == 4
    assert list((tmp_path / "trace").rglob("*.trace.json.gz"))  # --profile: one traced step


@pytest.mark.slow  # ~10 s
def test_memory_only_compiles_without_running(tmp_path):
    out = tmp_path / "m.jsonl"
    (r,) = benchmark.main([*TINY, "--batch_size", "8", "--memory_only", "--attention_dropout", "0",
                           "--output", str(out)])
    assert r["mode"] == "memory_only" and "step_time_median_s" not in r
    assert r["memory"]["estimate_bytes"] > r["memory"]["temp_bytes"] > 0
    assert r["attention_path"].startswith("jax.nn.dot_product_attention")
    assert json.loads(out.read_text())["memory"] == r["memory"]


@pytest.mark.slow  # ~30 s
def test_variants_take_turns_with_our_step(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # variants alone need no 'bench' extra
    out = tmp_path / "v.jsonl"
    (r,) = benchmark.main([*TINY, "--batch_size", "2", "--steps", "2", "--warmup", "1", "--compare_block", "1",
                           "--short_seq_prob", "0.8", "--variant", "--packing 3 --rng_impl rbg --attention_dropout 0",
                           "--variant", "--unpad_multiple 8", "--output", str(out)])
    assert r["variants"] == ["--packing 3 --rng_impl rbg --attention_dropout 0", "--unpad_multiple 8"]
    names = [x["name"] for x in r["implementations"]]
    assert names == ["ours", "ours --packing 3 --rng_impl rbg --attention_dropout 0", "ours --unpad_multiple 8"]
    unpacked, packed, unpadded = (x["real_tokens_per_step"] for x in r["implementations"])
    assert 0 < unpacked < packed <= 2 * 32  # short examples leave padding, which packing fills
    assert unpadded == unpacked  # the same batches; the blocks skip their padding
    assert "token slots" in r["implementations"][2]["label"]
    flops = [x["model_flops_per_step"] for x in r["implementations"]]
    assert flops[0] == flops[1] > flops[2]  # the same work, but unpadded blocks skip padding
    for x in r["implementations"]:
        assert x["step_time_median_s"] > 0 and x["loss_last"] > 0
    assert set(r["ratio_tokens_per_s"]) == set(names[1:])
    assert json.loads(out.read_text())["implementations"] == r["implementations"]


def test_variant_arguments(capsys):
    args = benchmark.parse_args(["--size", "tiny", "--variant", "--noscan", "--variant=--rng_impl rbg", "--output", ""])
    (n1, v1), (n2, v2) = args.variants
    assert (n1, v1.scan, v1.rng_impl, v1.size, v1.output) == ("--noscan", False, "threefry2x32", "tiny", "")
    assert (n2, v2.scan, v2.rng_impl) == ("--rng_impl rbg", "auto", "rbg")
    for argv, message in [(["--variant", "--seq_len 64"], "not the shapes or the mode; --seq_len"),
                          (["--variant", "rbg"], "no flag"),
                          (["--variant", "--compare hf-torch"], "--compare"),
                          (["--variant", "--noscan", "--memory_only"], "do not go with")]:
        with pytest.raises(SystemExit):
            benchmark.parse_args(argv)
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--batch_size", "3", "--mesh", "2,1,1"]])
def test_batch_not_divisible_by_the_mesh_is_an_error(argv):
    with pytest.raises(ValueError, match="not divisible"):
        benchmark.main(["--size", "tiny", "--vocab_size", "512", "--memory_only", "--output", "",
                        *argv])


@pytest.mark.slow  # ~40 s (torch and transformers imports, three compiles); CI lacks the extra anyway
def test_compare_with_hugging_face_on_a_tiny_model(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="--compare needs the 'bench' extra: pip install -e '.[bench]'")
    pytest.importorskip("transformers", reason="--compare needs the 'bench' extra: pip install -e '.[bench]'")
    monkeypatch.setenv("USE_TF", "0")  # as benchmark_compare would set, but undone after the test
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "c.jsonl"
    (r,) = benchmark.main([*TINY, "--compare", "hf-torch,hf-flax", "--batch_size", "2", "--steps", "2",
                           "--warmup", "1", "--compare_block", "1", "--torch_threads", "1", "--output", str(out)])
    assert r["mode"] == "compare" and r["batch_size"] == 2 and r["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}
    rows = {x["name"]: x for x in r["implementations"]}
    assert list(rows) == ["ours", "hf-torch", "hf-flax"]
    for x in rows.values():
        for key in ("step_time_median_s", "step_time_min_s", "tokens_per_s", "model_flops_per_step",
                    "achieved_flops_per_s", "mfu", "ours_over_theirs", "loss_last"):
            assert x[key] > 0, (x["name"], key)
    cfg = BertConfig.from_size("tiny", vocab_size=512)
    assert rows["ours"]["model_flops_per_step"] == pretraining_flops(cfg, 2, 32, 5)
    assert rows["hf-torch"]["model_flops_per_step"] == rows["hf-flax"]["model_flops_per_step"] == dense_mlm_flops(
        cfg, 2, 32)
    assert rows["ours"]["ours_over_theirs"] == 1.0
    assert r["ratio_tokens_per_s"] == {n: rows[n]["ours_over_theirs"] for n in ("hf-torch", "hf-flax")}
    assert r["transformers_version"] == "4.57.6"
    line = json.loads(out.read_text())
    assert line["mode"] == "compare" and line["implementations"] == r["implementations"]


def test_compare_without_the_bench_extra_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(UserError, match=r"needs transformers.*pip install -e '\.\[bench\]'"):
        benchmark.main(["--size", "tiny", "--compare", "hf-torch,hf-flax", "--output", ""])


@pytest.mark.slow  # ~17 s; the rule itself: tests/training/test_sharding.py
def test_micro_batches_follow_the_batch_and_the_flag():
    """--per_device_batch auto (the trainer's default): micro-batches of 8 on the CPU at batch 32
    (the rule itself: tests/training/test_sharding.py), with less temporary memory than the whole
    batch; 0 runs the whole batch; a bad value is an error."""
    (b32,) = benchmark.main([*TINY, "--batch_size", "32", "--memory_only"])
    assert b32["accumulation_steps"] == 4
    (whole,) = benchmark.main([*TINY, "--batch_size", "32", "--memory_only", "--per_device_batch", "0"])
    assert whole["accumulation_steps"] == 1
    assert b32["memory"]["temp_bytes"] < whole["memory"]["temp_bytes"]
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--per_device_batch", "eight"])


def test_compare_argument_errors(capsys):
    for argv, message in [(["--compare", "hf-jax"], "expected a comma list"),
                          (["--compare", "hf-flax", "--memory_only"], "do not go with"),
                          (["--compare", "hf-flax", "--dtype", "bfloat16"], "float32"),
                          (["--compare", "hf-flax", "--mesh", "2,1,1"], "one device")]:
        with pytest.raises(SystemExit):
            benchmark.parse_args(argv)
        assert message in capsys.readouterr().err

"""The step benchmark (``python -m bert_jax.benchmark``: bert_jax/benchmark/step.py, peers.py and
trainer_steps.py): its arguments, a tiny timed run, memory only, the batch search, variants and Hugging
Face taking turns, and the parameter rows against the papers."""

import dataclasses
import json
import sys

import pytest

from bert_jax.benchmark import peers, step, trainer_steps
from bert_jax.benchmark.flops import dense_mlm_flops, pretraining_flops
from bert_jax.config_args import config_module
from bert_jax.model.config import BertConfig, count_params
from input_pipeline.command_line import UserError

# Less LLVM optimisation: the step compiles in about half the time (its speed does not matter here).
TINY = ["--size", "tiny", "--seq_len", "32", "--vocab_size", "512", "--mesh", "1,1,1",
        "--xla_option", "xla_backend_optimization_level=0"]


def test_largest_fitting_search():
    limit = 1 << 16
    for q in (500, 5000, 10**9):  # from strongly convex to affine
        for a, c, budget in [(100, 7, 1000), (100, 7, 99), (100, 7, 107), (5, 1, 10**6), (3, 2, 10**12),
                             (3, 2, 777_777)]:
            def f(n, a=a, c=c, q=q):
                return a + c * n + n * n // q

            expected = max(n for n in range(limit + 1) if n == 0 or f(n) <= budget)
            calls = set()
            found = trainer_steps.largest_fitting(lambda n, calls=calls, f=f: calls.add(n) or f(n), budget, limit)
            assert found == expected, (q, a, c, budget)
            assert len(calls) <= 26
            if q > 500 and budget == 1000:  # nearly affine, as memory in the batch is: a few compiles
                assert len(calls) <= 4
    known, calls = {}, []
    assert trainer_steps.largest_fitting(lambda n: calls.append(n) or 10 * n, 1000, known=known) == 100
    assert trainer_steps.largest_fitting(lambda n: calls.append(n) or 10 * n, 505, known=known) == 50
    assert sorted(calls) == [1, 2, 50, 51, 100, 101]  # the second budget reuses the first's compiles


def test_benchmark_runs_tiny_model_and_writes_json(tmp_path):
    out = tmp_path / "results.jsonl"
    (r,) = step.main([*TINY, "--batch_size", "4", "--steps", "2", "--warmup", "1", "--output", str(out),
                      "--profile", str(tmp_path / "trace")])
    for key in ("compile_s", "step_time_median_s", "step_time_min_s", "sequences_per_s", "tokens_per_s",
                "model_flops_per_step", "achieved_flops_per_s", "peak_flops_per_s", "mfu"):
        assert r[key] > 0, key
    assert r["model_flops_per_step"] == pretraining_flops(BertConfig.from_size("tiny", vocab_size=512), 4, 32, 5)
    assert "measured" in r["peak_source"]  # CPU: the matmul measured in the same run
    assert "explicit" in r["attention_path"]  # attention dropout 0.1 needs the probabilities
    m = r["memory"]
    assert m["total"] == m["arguments"] + m["outputs"] - m["aliased"] + m["temporaries"] + m["generated_code"] > 0
    line = json.loads(out.read_text().splitlines()[-1])
    assert line["mode"] == "train_step" and line["batch_size"] == 4
    assert list((tmp_path / "trace").rglob("*.trace.json.gz"))  # --profile: one traced step
    assert "MFU" in step.summary(r) and "parameters: " in step.summary(r)


@pytest.mark.slow  # ~10 s
def test_memory_only_compiles_without_running(tmp_path):
    out = tmp_path / "m.jsonl"
    (r,) = step.main([*TINY, "--batch_size", "8", "--memory_only", "--attention_dropout", "0", "--output", str(out)])
    assert r["mode"] == "memory_only" and "step_time_median_s" not in r
    assert r["memory"]["total"] > r["memory"]["temporaries"] > 0
    assert r["attention_path"].startswith("jax.nn.dot_product_attention")
    assert json.loads(out.read_text())["memory"] == r["memory"]


def test_find_max_batch_searches_by_compiling(monkeypatch):
    """--find_max_batch: the largest multiple of --batch_multiple whose compiled memory fits each budget,
    each batch compiled once (compiles stubbed: 1 GiB + 10 MiB a row; the real memory: above)."""
    compiled = []
    monkeypatch.setattr(step.Bench, "compile", lambda self, b: (compiled.append(b) or b, 0.0))
    monkeypatch.setattr(trainer_steps, "memory", lambda b: {"total": 2**30 + b * 10 * 2**20})
    (r,) = step.main([*TINY, "--find_max_batch", "--memory_gb", "2,1.5", "--batch_multiple", "8", "--output", ""])
    assert r["mode"] == "find_max_batch" and r["max_batch"] == {"1.5": 48, "2.0": 96}
    assert sorted(compiled) == [8, 16, 48, 56, 96, 104]
    assert r["estimates_gib"][48] == round((1024 + 480) / 1024, 3) and "1.5 GiB -> 48" in step.summary(r)


@pytest.mark.slow  # ~30 s
def test_variants_take_turns_with_our_step(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # variants alone need no 'bench' extra
    out = tmp_path / "v.jsonl"
    (r,) = step.main([*TINY, "--batch_size", "2", "--steps", "2", "--warmup", "1", "--compare_block", "1",
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
    assert "ours --unpad_multiple 8" in peers.summary(r)


def test_a_variant_that_does_not_compile_is_reported_and_the_others_timed(monkeypatch):
    """A variant the compiler refuses (cuDNN's attention on a CPU: "cuDNN is not detected") is a line of
    the result, not the end of the comparison: our step (and any other variant) is still timed."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    (r,) = step.main([*TINY, "--batch_size", "2", "--steps", "1", "--warmup", "1", "--compare_block", "1",
                      "--attention_dropout", "0", "--variant", "--attention_impl cudnn", "--output", ""])
    assert [x["name"] for x in r["implementations"]] == ["ours"] and r["implementations"][0]["step_time_median_s"] > 0
    assert list(r["failed"]) == ["--attention_impl cudnn"]
    assert "cuDNN is not detected" in r["failed"]["--attention_impl cudnn"]
    assert "ours --attention_impl cudnn: failed to build or compile: RuntimeError" in peers.summary(r)


@pytest.mark.slow  # ~40 s (torch and transformers imports, three compiles); CI lacks the extra anyway
def test_compare_with_hugging_face_on_a_tiny_model(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="--compare needs the 'bench' extra: pip install -e '.[bench]'")
    pytest.importorskip("transformers", reason="--compare needs the 'bench' extra: pip install -e '.[bench]'")
    monkeypatch.setenv("USE_TF", "0")  # as load_libraries would set, but undone after the test
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "c.jsonl"
    (r,) = step.main([*TINY, "--compare", "hf-torch,hf-flax", "--batch_size", "2", "--steps", "2", "--warmup", "1",
                      "--compare_block", "1", "--torch_threads", "1", "--output", str(out)])
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
        step.main(["--size", "tiny", "--compare", "hf-torch,hf-flax", "--output", ""])


def test_batch_not_divisible_by_the_mesh_is_an_error():
    with pytest.raises(ValueError, match="not divisible"):
        step.main(["--size", "tiny", "--vocab_size", "512", "--memory_only", "--output", "", "--batch_size", "3",
                   "--mesh", "2,1,1"])


@pytest.mark.slow  # ~17 s; the rule itself: tests/training/test_sharding.py
def test_micro_batches_follow_the_batch_and_the_flag():
    """--per_device_batch auto (the trainer's default): micro-batches of 8 on the CPU at batch 32, with
    less temporary memory than the whole batch; 0 runs the whole batch."""
    (b32,) = step.main([*TINY, "--batch_size", "32", "--memory_only"])
    assert b32["accumulation_steps"] == 4
    (whole,) = step.main([*TINY, "--batch_size", "32", "--memory_only", "--per_device_batch", "0"])
    assert whole["accumulation_steps"] == 1
    assert b32["memory"]["temporaries"] < whole["memory"]["temporaries"]


def test_model_picks_the_recipe_sizes_and_vocabulary(capsys):
    recipes = config_module("pretrain")
    a = step.parse_args([])
    assert (a.model, a.size, a.vocab_size, a.attention_dropout, a.max_predictions) == ("bert", "base", 30522, None, 20)
    for model, size, vocab in [("roberta", "base", 50265), ("albert", "base", 30000), ("electra", "small", 30522)]:
        a = step.parse_args(["--model", model])
        assert (a.size, a.vocab_size) == (size, vocab), model
    assert step.parse_args(["--model", "roberta", "--size", "tiny", "--vocab_size", "99"]).vocab_size == 99
    assert step.parse_args(["--seq_len", "512"]).max_predictions == 80
    sizes = dict(recipes.SIZE_NAMES)
    for model, names in sizes.items():
        step.parse_args(["--model", model, "--size", names[-1]])
    for argv, message in [(["--model", "albert", "--size", "tiny"],
                           "--size tiny for --model albert: expected one of base | large | xlarge | xxlarge"),
                          (["--model", "electra", "--size", "xlarge"], "expected one of small | base | large"),
                          (["--size", "xxlarge"], "--size xxlarge for --model bert: expected one of tiny"),
                          (["--model", "gpt2"], "invalid choice: 'gpt2'"),
                          (["--model", "electra", "--packing", "2"], "ELECTRA has no sentence-level head"),
                          (["--batch_size", "8,0"], "--batch_size 8,0: expected a comma list"),
                          (["--seq_len", "128", "--max_predictions", "200"], "expected at most --seq_len"),
                          (["--per_device_batch", "eight"], "per_device_batch"),
                          (["--model", "albert", "--compare", "hf-torch"], "goes with --model bert"),
                          (["--size", "tiny", "--variant", "--model roberta"], "not the shapes or the mode; --model")]:
        with pytest.raises(SystemExit) as e:
            step.parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_variant_and_compare_arguments(capsys):
    args = step.parse_args(["--size", "tiny", "--variant", "--noscan", "--variant=--rng_impl rbg", "--output", ""])
    (n1, v1), (n2, v2) = args.variants
    assert (n1, v1.scan, v1.rng_impl, v1.size, v1.output) == ("--noscan", False, "threefry2x32", "tiny", "")
    assert (n2, v2.scan, v2.rng_impl) == ("--rng_impl rbg", "auto", "rbg")
    assert step.parse_args(["--compare", "hf-torch"]).mesh == "1,1,1" and step.parse_args([]).mesh == "-1,1,1"
    for argv, message in [(["--variant", "--seq_len 64"], "not the shapes or the mode; --seq_len"),
                          (["--variant", "rbg"], "no flag"),
                          (["--variant", "--compare hf-torch"], "--compare"),
                          (["--variant", "--noscan", "--memory_only"], "do not go with"),
                          (["--compare", "hf-jax"], "expected a comma list"),
                          (["--compare", "hf-flax", "--find_max_batch"], "do not go with"),
                          (["--compare", "hf-flax", "--dtype", "bfloat16"], "float32"),
                          (["--compare", "hf-flax", "--variant", "--dtype bfloat16"], "float32"),
                          (["--compare", "hf-flax", "--mesh", "2,1,1"], "one device")]:
        with pytest.raises(SystemExit):
            step.parse_args(argv)
        assert message in capsys.readouterr().err, argv


# Our encoder at the paper's vocabulary / the paper's figure. ALBERT xlarge and xxlarge come out at
# 58.7M and 222.6M with the architecture the paper describes (as do Hugging Face's checkpoints).
RATIOS = {("bert", "base"): 0.995, ("bert", "large"): 0.986, ("roberta", "base"): 0.997,
          ("roberta", "large"): 1.001, ("albert", "base"): 0.974, ("albert", "large"): 0.982,
          ("albert", "xlarge"): 0.978, ("albert", "xxlarge"): 0.947, ("electra", "small"): 0.963,
          ("electra", "base"): 0.99, ("electra", "large"): 0.997}


FAST = {("bert", "base"), ("albert", "base")}  # BERT's encoder and a shared block; the rest are slow


@pytest.mark.parametrize("model,size", [x if x in FAST else pytest.param(*x, marks=pytest.mark.slow)
                                        for x in sorted(step.PAPER_PARAMS)])
def test_parameter_rows_against_the_papers(model, size):
    """The row the benchmark reports, from the state of the step it builds (nothing compiled): the
    trained parameters, the encoder's, and the encoder at the paper's vocabulary against the paper."""
    bench = step.Bench(step.parse_args(["--model", model, "--size", size, "--vocab_size", "512", "--mesh", "1,1,1",
                                        "--batch_size", "8", "--output", ""]))
    row, cfg = bench.describe(8)["params"], bench.cfg
    assert row["encoder"] == count_params(cfg) < row["total"]
    assert row["encoder_at_paper_vocab"] == count_params(dataclasses.replace(cfg, vocab_size=step.PAPER_VOCAB[model]))
    assert row["paper"] == step.PAPER_PARAMS[model, size]
    assert row["ours_over_paper"] == pytest.approx(RATIOS[model, size], abs=0.0015)

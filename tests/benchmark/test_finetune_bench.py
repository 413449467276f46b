"""``python -m bert_jax.benchmark.finetune`` at tiny size: modes taking turns, the result's fields,
the synthetic SQuAD-style lengths, one-line errors."""

import json

import numpy as np
import pytest

from bert_jax.benchmark import finetune


@pytest.mark.slow  # ~20-40 s (every mode compiles); the CLI and its errors stay in the fast set
def test_tiny_run_reports_every_mode(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    r = finetune.main(["--lengths", "squad", "--size", "tiny", "--batch_size", "8", "--eval_batch_size", "8",
                       "--max_seq_length", "64", "--train_steps", "1", "--eval_rows", "8", "--rounds", "1",
                       "--vocab_size", "200", "--unpad_multiple", "16", "--modes", "padded,unpadded",
                       "--mesh", "1,1,1", "--json", "--output", str(out)])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == r == json.loads(out.read_text())
    assert "SYNTHETIC" in r["source"] and r["kind"] == "span" and set(r["modes"]) == {"padded", "unpadded"}
    padded, unpadded = r["modes"]["padded"], r["modes"]["unpadded"]
    assert padded["train_ratio"] == 1.0 and unpadded["train_ratio"] > 0 and unpadded["eval_ratio"] > 0
    assert len(padded["train_s"]) == len(padded["eval_s"]) == 1
    assert unpadded["train_real_fraction"] > padded["train_real_fraction"]  # fewer slots on padding
    assert "padded" in finetune.table(r) and "real/slots" in finetune.table(r)


def test_synthetic_squad_lengths_fit_and_split_long_paragraphs():
    real = finetune.squad_lengths(2000, 384, np.random.default_rng(0))
    assert real.shape == (2000,) and real.min() >= 4 + 20 + 3 and real.max() <= 384
    assert 0.01 < np.mean(real == 384) < 0.2  # a few long paragraphs fill whole windows, their ends do not
    assert 120 < np.median(real) < 260


@pytest.mark.parametrize("argv,expected", [(["--modes", "padded,fast"], "--modes padded,fast"),
                                           (["--train_steps", "0"], "--train_steps must be >= 1")])
def test_bad_arguments_are_one_line(argv, expected, capsys):
    with pytest.raises(SystemExit) as e:
        finetune.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "Traceback" not in err and len(err.splitlines()) == 1

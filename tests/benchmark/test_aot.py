"""Ahead-of-time compilation for TPU topologies (bert_jax/benchmark/aot.py). The compile tests need
libtpu (`pip install -e '.[tpu]'`) and are skipped without it; the argument checks run everywhere."""

import importlib.util

import numpy as np
import pytest

from bert_jax.benchmark import aot
from bert_jax.finetuning.trainer import train_batch
from input_pipeline.tasks.base import feature_shapes

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="needs libtpu: pip install -e '.[tpu]'")


@pytest.mark.parametrize("spec, name, chips", [
    ("v4-8", "v4:2x2x1", 4), ("v4-32", "v4:2x2x4", 16), ("v4-1024", "v4:8x8x8", 512),
    ("v5e-1", "v5e:1x1", 1), ("v5e-8", "v5e:2x4", 8), ("v5e-256", "v5e:16x16", 256),
    ("v3-8", "v3:2x2", 4), ("v3-2048", "v3:32x32", 1024),
    ("v5p-8", "v5p:2x2x1", 4), ("v5p-128", "v5p:4x4x4", 64), ("v6e-8", "v6e:2x4", 8), ("v5e:4x8", "v5e:4x8", 32),
])
def test_accelerator_types_name_their_topology(spec, name, chips):
    chip, got, n = aot.topology_name(spec)
    assert (got, n) == (name, chips) and chip is aot.CHIPS[name.partition(":")[0]]


@pytest.mark.parametrize("spec, match", [
    ("v2-8", r"generation one of v3, v4, v5e, v5p, v6e"), ("v5e", "expected <generation>-<size>"),
    ("v4-6", "not a power of two"), ("v4-7", "multiple of 2"), ("v5e:4x4x4", "2 dimensions"),
])
def test_bad_topologies_are_named(spec, match):
    with pytest.raises(ValueError, match=match):
        aot.topology_name(spec)


def test_config_overrides(tmp_path):
    c = aot.load_config("configs/pretrain.py:size=tiny,phase=2", ["--config.batch_size=64",
                                                                   "--config.mesh_shape=(1,-1,1)",
                                                                   "--config.model.dtype=bfloat16"])
    assert (c.batch_size, tuple(c.mesh_shape), c.model.dtype) == (64, (1, -1, 1), "bfloat16")
    assert c.data.max_seq_length == 512
    with pytest.raises(ValueError, match=r"--config.model.dtyp: the config has no key 'dtyp'"):
        aot.load_config("configs/pretrain.py:size=tiny", ["--config.model.dtyp=bfloat16"])
    with pytest.raises(FileNotFoundError, match="no such config file"):
        aot.load_config(str(tmp_path / "nope.py"), [])


def test_no_libtpu_is_one_line_with_the_install_command(monkeypatch, capsys):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else object())
    with pytest.raises(aot.cli.UserError, match=r"pip install -e '.\[tpu\]'"):
        aot.tpu_devices("v5e-4")


@pytest.mark.parametrize("kind, labels", [("classification", ("label",)), ("regression", ("label",)),
                                          ("tagging", ("label_ids", "label_mask")),
                                          ("span", ("start_positions", "end_positions"))])
def test_feature_shapes_are_what_the_fine_tuning_step_gets(kind, labels):
    """The AOT tool compiles fine-tuning for `feature_shapes`; the trainer's batches have them."""
    shapes = feature_shapes(kind, 6, 16)
    features = {k: np.zeros(s, d) for k, (s, d) in shapes.items()}
    features["input_mask"][:, :16] = 1  # full rows: the batch keeps the whole length
    batch = train_batch(features, 0, 4, 0, 8)
    assert set(batch) == {*shapes, "weight"} and set(labels) <= set(batch)
    for k, (s, d) in shapes.items():
        assert batch[k].shape == (4, *s[1:]) and batch[k].dtype == d, k


@needs_libtpu
def test_tiny_pretraining_step_compiles_for_a_v5e_slice():
    config = aot.load_config("configs/pretrain.py:size=tiny", [])
    chip, name, devices = aot.tpu_devices("v5e-4")
    r = aot.report(aot.compile_step(config, devices, 32), chip, len(devices))
    m = r["memory_bytes"]
    assert name == "v5e:2x2" and r["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
    assert all(v > 0 for v in m.values())
    assert r["total_bytes"] == m["arguments"] + m["outputs"] - m["aliased"] + m["temporaries"] + m["generated_code"]
    assert r["fits"] and r["total_bytes"] < 2**30 and r["model_flops_per_step"] > 0
    # The state is donated: the outputs alias the arguments (parameters and optimizer moments).
    assert m["aliased"] > 0.9 * m["outputs"]


@needs_libtpu
def test_tiny_fine_tuning_step_compiles_for_one_v5e_chip():
    config = aot.load_config("configs/glue.py:task=rte", ["--config.model.size=tiny", "--config.max_seq_length=64"])
    chip, _, devices = aot.tpu_devices("v5e-1")
    r = aot.report(aot.compile_step(config, devices, 8), chip, len(devices))
    assert r["fits"] and r["length"] == 64 and r["memory_bytes"]["temporaries"] > 0


@needs_libtpu
def test_a_step_that_does_not_fit_is_reported_not_raised():
    config = aot.load_config("configs/pretrain.py:size=tiny,phase=2", [])
    chip, _, devices = aot.tpu_devices("v5e-1")
    r = aot.report(aot.compile_step(config, devices, 8192), chip, len(devices))
    assert not r["fits"] and r["total_bytes"] is None and "HBM" in r["compiler_error"]
    assert "DOES NOT FIT" in aot.summary(r)


def test_find_max_batch_doubles_then_bisects(monkeypatch):
    """With a step whose memory is 10 MiB per row and 1 GiB of HBM, the largest multiple of 8 that fits
    is 96 rows (960 MiB; 104 rows need 1040): found by 8 → 16 → ... → 128, then bisection."""
    tried = []

    def fake_compile(config, devices, batch_size):
        tried.append(batch_size)
        return {"batch_size": batch_size, "total_bytes": None if batch_size >= 256 else batch_size * 10 * 2**20}

    monkeypatch.setattr(aot, "compile_step", fake_compile)
    best = aot.find_max_batch(None, None, 8, 8, 2**30)
    assert best["batch_size"] == 96
    assert tried[:5] == [8, 16, 32, 64, 128] and 96 in tried and 104 in tried
    assert aot.find_max_batch(None, None, 8, 8, 2**20) is None  # not even one multiple fits


def test_auto_dtype_means_the_tpus_not_the_hosts():
    """Compiled on a CPU host for a TPU, the configs' "auto" settings are the TPU's (bfloat16, scanned
    layers, jax.random's dropout bits); an explicit setting stays as given."""
    model = aot.load_config("configs/pretrain.py:size=tiny", []).model
    assert (model.dtype, model.scan_layers, model.dropout_impl) == ("bfloat16", "true", "jax")
    assert aot.load_config("configs/pretrain.py:size=tiny", ["--config.model.scan_layers=false"]).model.scan_layers \
        == "false"
    assert aot.load_config("configs/pretrain.py:size=tiny", ["--config.model.dtype=float32"]).model.dtype == "float32"

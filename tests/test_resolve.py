"""bert_jax/resolve.py: what "auto" means per platform (dtype, scan, attention, dropout, norm,
micro-batch rows), tested for every platform on a CPU; a job config resolved once; a saved model
record read as saved; and `BertConfig`, which takes concrete values only."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from bert_jax.model.config import BertConfig
from bert_jax.model.layers import attention_call
from bert_jax.resolve import (
    MESH_AXES,
    auto_keys,
    described_model,
    params_whole,
    resolve,
    resolve_attention,
    resolve_dropout,
    resolve_dtype,
    resolve_gelu,
    resolve_global_norm,
    resolve_norm,
    resolve_per_device_batch,
    resolve_recompute,
    resolve_scan,
    resolve_stacked_params,
    saved_model,
)


@pytest.mark.parametrize("platform,expected", [("cpu", "float32"), ("gpu", "bfloat16"), ("cuda", "bfloat16"),
                                               ("rocm", "bfloat16"), ("tpu", "bfloat16")])
def test_auto_dtype_per_platform(platform, expected):
    assert resolve_dtype("auto", platform) == expected
    assert resolve_dtype("float32", platform) == "float32"  # an explicit choice is kept
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"


@pytest.mark.parametrize("platform,kind,dtype,head_dim,expected", [
    ("gpu", "padding", "bfloat16", 64, "cudnn"),
    ("cuda", "padding", "float16", 128, "cudnn"),
    ("gpu", "packed", "bfloat16", 64, "xla"),  # block-diagonal mask: no key lengths express it
    ("gpu", "padding", "float32", 64, "xla"),  # cuDNN flash attention has no float32
    ("gpu", "padding", "bfloat16", 12, "xla"),  # head width not a multiple of 8
    ("gpu", "padding", "bfloat16", 256, "xla"),
    ("rocm", "padding", "bfloat16", 64, "xla"),  # no cuDNN on AMD
    ("tpu", "padding", "bfloat16", 64, "splash"),  # Pallas splash attention: segment ids, local windows
    ("tpu", "packed", "bfloat16", 128, "splash"),
    ("tpu", "padding", "bfloat16", 12, "xla"),  # a head width the kernel's tests do not cover
    ("cpu", "padding", "float32", 64, "xla"),
    ("cpu", "packed", "bfloat16", 64, "xla"),
])
def test_auto_attention_per_platform_and_mask(platform, kind, dtype, head_dim, expected):
    shape = (2, 256, 4, head_dim)  # [batch, length, heads, kv]: a length the splash kernel takes
    assert attention_call(resolve_attention("auto", platform, dtype=dtype, head_dim=head_dim), kind, shape,
                          dtype) == expected


def test_splash_per_platform_and_length():
    """An explicit "splash": the kernel on a TPU, Pallas' interpreter on the CPU (the tests' way to run
    it), an error on a GPU; at a length that is not a multiple of 128 the model runs XLA instead."""
    assert resolve_attention("splash", "tpu") == "splash"
    assert resolve_attention("splash", "cpu", dtype="float32") == "splash_interpret"
    with pytest.raises(ValueError, match="'splash' is the TPU's kernel: on 'gpu' use xla or cudnn"):
        resolve_attention("splash", "gpu")
    assert attention_call("splash", "padding", (2, 100, 4, 64), "bfloat16") == "xla"
    assert attention_call("splash_interpret", "packed", (2, 384, 4, 64), "float32") == "splash_interpret"


def test_flash_per_platform_and_length():
    """An explicit "flash" (the GPU's Pallas kernel with dropout inside): the kernel on an NVIDIA GPU,
    Pallas' interpreter on the CPU, an error on a TPU or ROCm; "auto" never picks it; at a length
    that is not a multiple of 64 (or a head width that is not a power of two) the model runs XLA."""
    assert resolve_attention("flash", "cuda") == "flash"
    assert resolve_attention("flash", "cpu", dtype="float32") == "flash_interpret"
    with pytest.raises(ValueError, match="'flash' is the GPU's kernel: on 'tpu' use xla or splash"):
        resolve_attention("flash", "tpu")
    with pytest.raises(ValueError, match="'flash' is the GPU's kernel: on 'rocm' use xla"):
        resolve_attention("flash", "rocm")
    assert resolve_attention("auto", "gpu") == "cudnn"
    assert attention_call("flash", "padding", (2, 100, 4, 64), "bfloat16") == "xla"
    assert attention_call("flash", "padding", (2, 128, 4, 48), "bfloat16") == "xla"
    assert attention_call("flash_interpret", "packed", (2, 384, 4, 64), "float32") == "flash_interpret"


def test_explicit_attention_choice_is_kept_and_unknown_rejected():
    for impl in ("xla", "cudnn", "explicit"):
        assert resolve_attention(impl, "cpu", dtype="float32") == impl
    with pytest.raises(ValueError, match="attention_impl 'flashy'"):
        resolve_attention("flashy", "gpu")


def test_auto_dropout_per_platform():
    assert resolve_dropout("auto", "cpu") == "fused"
    assert [resolve_dropout("auto", p) for p in ("gpu", "cuda", "rocm", "tpu")] == ["jax"] * 4
    assert resolve_dropout("jax", "cpu") == "jax" and resolve_dropout("fused", "tpu") == "fused"
    with pytest.raises(ValueError, match="dropout_impl 'bernoulli'"):
        resolve_dropout("bernoulli", "cpu")


def test_norm_per_platform():
    """"auto" is XLA's norm everywhere; an explicit "fused" (the GPU's residual-dropout-LayerNorm
    kernel) is the kernel on an NVIDIA GPU, interpreted on the CPU, an error on a TPU or ROCm."""
    assert [resolve_norm("auto", p) for p in ("cpu", "gpu", "cuda", "rocm", "tpu")] == ["xla"] * 5
    assert resolve_norm("fused", "cuda") == "fused" and resolve_norm("fused", "cpu") == "fused_interpret"
    assert resolve_norm("xla", "gpu") == "xla"
    for platform in ("tpu", "rocm"):
        with pytest.raises(ValueError, match=f"norm_impl 'fused' is the NVIDIA GPU's kernel: on '{platform}' use xla"):
            resolve_norm("fused", platform)
    with pytest.raises(ValueError, match="norm_impl 'apex'"):
        resolve_norm("apex", "gpu")


def test_auto_scan_per_platform():
    assert resolve_scan("auto", "cpu") is False
    assert [resolve_scan("auto", p) for p in ("gpu", "cuda", "rocm", "tpu")] == [False, False, True, True]
    assert resolve_scan(True, "cpu") is True and resolve_scan(False, "tpu") is False
    assert resolve_scan("auto", "cpu", shared=True) is True  # ALBERT: one block, nothing per layer
    assert resolve_scan("False", "tpu") is False and resolve_scan("true", "cpu") is True  # ml_collections' strings
    with pytest.raises(ValueError, match="scan_layers 'sometimes'"):
        resolve_scan("sometimes", "cpu")


@pytest.mark.parametrize("value, platform, scanned, want", [
    ("auto", "gpu", False, True), ("auto", "cuda", False, True), ("auto", "cpu", False, False),
    ("auto", "gpu", True, False), ("auto", "tpu", True, False), ("auto", "rocm", False, False),
    ("true", "cpu", False, True), ("False", "gpu", False, False), (True, "tpu", False, True)])
def test_unrolled_blocks_over_the_stack_on_nvidia_gpus(value, platform, scanned, want):
    assert resolve_stacked_params(value, platform, scanned=scanned) is want


def test_stacked_params_rejects_what_is_not_a_switch():
    with pytest.raises(ValueError, match="stacked_params 'sometimes': expected True, False or 'auto'"):
        resolve_stacked_params("sometimes", "gpu", scanned=False)


@pytest.mark.parametrize("value,platform,rows,expected", [
    ("auto", "cpu", 32, 8), ("auto", "cpu", 16, 8), ("auto", "cpu", 8, 0), ("auto", "cpu", 12, 0),
    ("auto", "gpu", 32, 0), ("auto", "tpu", 256, 0), ("auto", "cuda", 64, 0),
    ("16", "cpu", 32, 16), ("0", "cpu", 32, 0), (4, "tpu", 32, 4), (0, "cpu", 32, 0)])
def test_per_device_batch_per_platform(value, platform, rows, expected):
    assert resolve_per_device_batch(value, platform, rows=rows) == expected


@pytest.mark.parametrize("bad", ["eight", "-1", -2, 1.5, True])
def test_per_device_batch_rejects_what_is_not_a_row_count(bad):
    with pytest.raises(ValueError, match="per_device_batch .*expected 'auto' or rows per device"):
        resolve_per_device_batch(bad, "cpu", rows=32)


@pytest.mark.parametrize("value, platform, want", [
    ("auto", "cpu", True), ("auto", "cuda", True), ("auto", "gpu", True), ("auto", "tpu", False),
    ("auto", "rocm", False), ("false", "gpu", False), ("true", "tpu", True), (False, "cpu", False), (True, "tpu", True),
])
def test_recompute_activation_per_platform(value, platform, want):
    assert resolve_recompute(value, platform) is want


def test_recompute_activation_rejects_what_is_not_a_switch():
    with pytest.raises(ValueError, match="recompute_activation 'sometimes': expected True, False or 'auto'"):
        resolve_recompute("sometimes", "gpu")


@pytest.mark.parametrize("value, platform, want", [
    ("auto", "gpu", "erf"), ("auto", "cuda", "erf"), ("auto", "cpu", "erfc"), ("auto", "tpu", "erfc"),
    ("auto", "rocm", "erfc"), ("erfc", "gpu", "erfc"), ("erf", "tpu", "erf"),
])
def test_gelu_through_erf_on_nvidia_gpus(value, platform, want):
    assert resolve_gelu(value, platform) == want


def test_gelu_impl_rejects_an_unknown_form():
    with pytest.raises(ValueError, match=r"gelu_impl 'tanh': expected one of \('auto', 'erfc', 'erf'\)"):
        resolve_gelu("tanh", "gpu")


@pytest.mark.parametrize("value, platform, whole, want", [
    ("auto", "gpu", True, "grouped"), ("auto", "cuda", True, "grouped"), ("auto", "gpu", False, "per_leaf"),
    ("auto", "cpu", True, "per_leaf"), ("auto", "tpu", True, "per_leaf"), ("auto", "rocm", True, "per_leaf"),
    ("grouped", "tpu", False, "grouped"), ("per_leaf", "gpu", True, "per_leaf"),
])
def test_grouped_global_norms_on_nvidia_gpus_with_whole_parameters(value, platform, whole, want):
    assert resolve_global_norm(value, platform, params_whole=whole) == want
    with pytest.raises(ValueError, match=r"global_norm 'fast': expected one of \('auto', 'per_leaf', 'grouped'\)"):
        resolve_global_norm("fast", platform, params_whole=whole)


@pytest.mark.parametrize("mesh, rules, whole", [
    ((-1, 1, 1), None, True),  # data parallel: every device holds every parameter
    ((1, 1, 1), None, True),
    ((-1, 8, 1), None, False),  # FSDP: "embed" over fsdp
    ((2, -1, 1), None, False),  # fsdp takes the devices left: more than one
    ((4, 1, 2), None, False),  # tensor parallel: heads, mlp, vocab
    ((-1, 8, 1), (("batch", ("data", "fsdp")), ("embed", None), ("activation_embed", "fsdp")), True),
])
def test_whole_parameters_are_read_from_the_mesh_and_the_rules(load_config, mesh, rules, whole):
    """What "auto" asks of a job config: whether any parameter's axis lands on a mesh axis of more than
    one device (activations' and the batch's rules do not count)."""
    c = load_config("pretrain", "size=tiny,runlocal")
    with c.unlocked():
        c.mesh_shape = mesh
        if rules is not None:
            c.sharding_rules = rules
    assert params_whole(c) is whole
    assert resolve(c, "gpu").global_norm == ("grouped" if whole else "per_leaf")


def test_the_mesh_axes_are_the_shardings():
    from bert_jax.training.sharding_rules import MESH_AXES as SHARDING_MESH_AXES

    assert MESH_AXES == SHARDING_MESH_AXES


def test_a_job_config_resolves_once(load_config):
    """No "auto" left in what config.json records; micro-batches from the rows per batch shard on
    the CPU, none on an accelerator; the given config is left as it was."""
    c = load_config("pretrain", "size=tiny,runlocal")
    assert set(auto_keys(c)) >= {"model.dtype", "model.scan_layers", "per_device_batch"}
    cpu = resolve(c, "cpu", batch_shards=1)
    assert auto_keys(cpu) == [] and auto_keys(c)  # a copy: the given config keeps its "auto"
    assert (cpu.model.dtype, cpu.model.scan_layers, cpu.model.attention_impl, cpu.model.dropout_impl) == \
        ("float32", "false", "xla", "fused")
    assert cpu.per_device_batch == (8 if c.batch_size > 8 and c.batch_size % 8 == 0 else 0)
    tpu = resolve(c, "tpu")
    assert (tpu.model.dtype, tpu.model.scan_layers, tpu.model.dropout_impl, tpu.per_device_batch) == \
        ("bfloat16", "true", "jax", 0)
    assert resolve(c, "gpu").model.attention_impl == "cudnn"  # bfloat16, head width 64
    assert [resolve(c, p, batch_shards=1).model.norm_impl for p in ("cpu", "gpu", "tpu")] == ["xla"] * 3
    # GELU recomputed in the backward: on the CPU and NVIDIA GPUs, not on TPUs
    assert [resolve(c, p, batch_shards=1).model.recompute_activation for p in ("cpu", "gpu", "tpu")] == \
        ["true", "true", "false"]
    assert [resolve(c, p, batch_shards=1).model.gelu_impl for p in ("cpu", "gpu", "tpu")] == ["erfc", "erf", "erfc"]
    assert [resolve(c, p, batch_shards=1).model.stacked_params for p in ("cpu", "gpu", "tpu")] == \
        ["false", "true", "false"]
    assert [resolve(c, p, batch_shards=1).global_norm for p in ("cpu", "gpu", "tpu")] == \
        ["per_leaf", "grouped", "per_leaf"]
    assert "auto" not in cpu.to_json()
    assert described_model(cpu.model).scanned is False  # what the trainers build from it
    with pytest.raises(ValueError, match="needs the batch's data-parallel shards"):
        resolve(c, "cpu")


def test_model_section_resolves_against_the_model_it_describes(load_config):
    """The size's table counts: ALBERT's shared block scans on a CPU too, a head width cuDNN does not
    take stays on XLA, an explicit float32 keeps a GPU off cuDNN."""
    albert = resolve(load_config("pretrain", "model=albert,runlocal"), "cpu", batch_shards=1)
    assert albert.model.scan_layers == "true"
    c = load_config("pretrain", "size=tiny,runlocal")
    with c.unlocked():
        c.model.num_heads = 1  # head width 128: cuDNN still applies
    assert resolve(c, "gpu").model.attention_impl == "cudnn"
    with c.unlocked():
        c.model.hidden_size, c.model.num_heads = 130, 10  # head width 13: not a multiple of 8
    assert resolve(c, "gpu").model.attention_impl == "xla"
    c = load_config("pretrain", "size=tiny,runlocal")
    with c.unlocked():
        c.model.dtype = "float32"
    assert (resolve(c, "gpu").model.dtype, resolve(c, "gpu").model.attention_impl) == ("float32", "xla")
    with c.unlocked():
        c.model.dtype = "float33"
    with pytest.raises(ValueError, match=r"\['dtype'\] = \['float33'\]"):
        resolve(c, "cpu", batch_shards=1)


def test_bert_config_takes_concrete_values_only(load_config):
    """The model never resolves "auto" itself: BertConfig refuses it, naming the fields and
    pointing at bert_jax.resolve; so does `described_model` of an unresolved job config."""
    with pytest.raises(ValueError, match=r"BertConfig field\(s\) \['dtype', 'scan_layers', 'attention_impl', "
                       r"'dropout_impl'\] = \['auto', 'auto', 'auto', 'auto'\].*bert_jax\.resolve"):
        BertConfig(dtype="auto", scan_layers="auto", attention_impl="auto", dropout_impl="auto")
    cfg = BertConfig.from_size("tiny", vocab_size=97)
    with pytest.raises(ValueError, match=r"\['attention_impl'\] = \['auto'\]"):
        dataclasses.replace(cfg, attention_impl="auto")
    assert BertConfig(scan_layers="False").scan_layers is False  # ml_collections hands strings over
    with pytest.raises(ValueError, match=r"\['scan_layers'\]"):
        BertConfig(scan_layers="sometimes")
    c = load_config("pretrain", "size=tiny,runlocal")
    with pytest.raises(ValueError, match="resolved for its platform first"):
        described_model(c.model)


def test_a_saved_model_is_read_as_saved(caplog):
    """A record saved by a job on another platform keeps its values (fine-tuning puts its own
    execution fields on top); an old record's "auto" reads as BertConfig's own values."""
    gpu = dataclasses.replace(BertConfig.from_size("tiny", vocab_size=97), dtype="bfloat16", attention_impl="cudnn")
    assert saved_model(gpu.to_dict(), "meta.json") == gpu
    old = {**gpu.to_dict(), "dtype": "auto", "scan_layers": "auto", "dropout_impl": "auto"}
    with caplog.at_level(logging.WARNING, logger="bert_jax.resolve"):
        cfg = saved_model(old, "/w/bert_config.json")
    assert (cfg.dtype, cfg.scan_layers, cfg.attention_impl, cfg.dropout_impl) == ("float32", True, "cudnn", "jax")
    assert "/w/bert_config.json" in caplog.text and "'dtype', 'scan_layers', 'dropout_impl'" in caplog.text

"""Compiler-estimated step time and MFU (bert_jax/benchmark/aot_estimate.py): the arithmetic on fake
cost dicts everywhere; the compile needs libtpu and is skipped without it."""

import importlib.util

import jax
import pytest

from bert_jax.benchmark import aot, aot_estimate

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="needs libtpu: pip install -e '.[tpu]'")


def test_layers_extrapolate_linearly():
    one, two = {"flops": 10.0, "bytes accessed": 100.0}, {"flops": 13.0, "bytes accessed": 107.0}
    assert aot_estimate.extrapolate(one, two, 1) == one
    assert aot_estimate.extrapolate(one, two, 24) == {"flops": 10.0 + 23 * 3, "bytes accessed": 100.0 + 23 * 7}


def test_the_compilers_seconds_extrapolate_only_when_both_are_positive():
    one, two = {"compiler_seconds": 1.0}, {"compiler_seconds": 1.5}
    assert aot_estimate.optimal_seconds(one, two, 24) == pytest.approx(12.5)
    assert aot_estimate.optimal_seconds(one, {"compiler_seconds": -2.0}, 24) is None
    assert aot_estimate.optimal_seconds({}, two, 24) is None


def test_accumulation_repeats_the_micro_step_but_not_the_update():
    micro, update = {"flops": 50.0, "bytes accessed": 40.0}, {"flops": 2.0, "bytes accessed": 30.0}
    assert aot_estimate.accumulated(micro, update, 1) == micro
    assert aot_estimate.accumulated(micro, update, 4) == {"flops": 4 * 48 + 2, "bytes accessed": 4 * 10 + 30}


def test_roofline_takes_the_slower_of_compute_and_memory_per_device():
    v5e, v3 = aot.CHIPS["v5e"], aot.CHIPS["v3"]
    cost = {"flops": 197e12, "bytes accessed": 819e9 / 4}
    compute = aot_estimate.roofline(cost, v5e)
    assert compute["step_s"] == pytest.approx(1.0) and compute["bound"] == "compute"
    assert compute["memory_s"] == pytest.approx(0.25) and "roofline" in compute["source"]
    memory = aot_estimate.roofline({"flops": 1e12, "bytes accessed": 819e9 * 2}, v5e)
    assert memory["step_s"] == pytest.approx(2.0) and memory["bound"] == "memory"
    # A v3 device is one of the chip's two TensorCores: half the chip's peak and bandwidth.
    assert aot_estimate.roofline({"flops": 123e12 / 2, "bytes accessed": 0.0}, v3)["step_s"] == pytest.approx(1.0)
    # The compiler's own figure wins when it gives one; a negative one (libtpu 0.0.42.1) does not, nor
    # one faster than the FLOPs at peak.
    assert aot_estimate.roofline(cost, v5e, 1.5)["step_s"] == 1.5
    assert aot_estimate.roofline(cost, v5e, 0.5)["step_s"] == pytest.approx(1.0)
    assert aot_estimate.roofline({"flops": 197e12, "bytes accessed": 0.0}, v5e, -3.0)["step_s"] == pytest.approx(1.0)


def test_mfu_is_model_flops_over_time_chips_and_peak():
    t = aot_estimate.throughput(0.5, 256, 128, 0.5 * 8 * 197e12 * 0.4, aot.CHIPS["v5e"], 8)
    assert t["mfu"] == pytest.approx(0.4)
    assert t["sequences_per_s"] == 512 and t["tokens_per_s"] == 512 * 128


def test_v3_chips_are_two_devices():
    chip, name, chips = aot.topology_name("v3-2048")
    assert (name, chips, chip.devices_per_chip) == ("v3:32x32", 1024, 2)
    r = aot.report({"total_bytes": 15 * 2**30, "model_flops_per_step": 123e12, "batch_size": 8}, chip, 2048)
    assert r["fits"] and r["chips"] == 1024 and r["hbm_bytes"] == 16 * 2**30
    assert r["step_s_at_100_mfu"] == pytest.approx(1 / 1024)


def test_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        aot_estimate.main(["--config", "configs/pretrain.py:size=tiny", "--topology", "v5e-4", "--steps", "-1"])
    assert e.value.code == 2 and "--steps -1" in capsys.readouterr().err


@needs_libtpu
@pytest.mark.slow  # four compiles: minutes on a 2-core machine
def test_tiny_estimate_on_a_v5e_slice():
    # 256 rows on 4 chips at 32 per chip: 2 micro-batches.
    config = aot.load_config("configs/pretrain.py:size=tiny", ["--config.per_device_batch=32"])
    chip, _, devices = aot.tpu_devices("v5e-4")
    r = aot_estimate.estimate(config, devices, chip, steps=10)
    e = r["estimate"]
    assert r["fits"] and e["layers"] == 2 and e["accumulation_steps"] == 2
    assert 0 < e["mfu"] < 1 and e["step_s"] == max(e["compute_s"], e["memory_s"])
    assert e["total_s"] == pytest.approx(10 * e["step_s"])
    # More than the FLOPs the model needs (the compiler counts every op), but not absurdly more.
    assert r["model_flops_per_step"] / 4 < e["flops_per_device"] < 10 * r["model_flops_per_step"] / 4


def _fake_compiles(monkeypatch, fits=True):
    """compile_step stand-in: the step's cost is 5 + 3 per layer (FLOPs) per row of the batch; its
    memory fits or not; the optimizer update costs 7 FLOPs and 11 bytes."""
    calls = []

    def compile_step(config, devices, batch_size):
        layers = config.model.get("num_layers")
        calls.append((layers, config.model.scan_layers, batch_size))
        cost = {"flops": (5.0 + 3.0 * (layers or 0)) * batch_size + 7.0, "bytes accessed": 100.0 * (layers or 0) + 11}
        return {"batch_size": batch_size, "length": 128, "compile_s": 1.0, "mesh": {"data": 4},
                "model_flops_per_step": 1e12, "total_bytes": 2**30 if fits else None,
                "memory_bytes": {} if fits else None, "model": {}, "cost": cost}

    monkeypatch.setattr(aot, "compile_step", compile_step)
    monkeypatch.setattr(aot_estimate, "update_cost", lambda config, devices: {"flops": 7.0, "bytes accessed": 11.0})
    return calls


def test_estimate_compiles_one_and_two_layers_at_the_micro_batch(monkeypatch):
    calls = _fake_compiles(monkeypatch)
    config = aot.load_config("configs/pretrain.py:size=large", ["--config.batch_size=64",
                                                                "--config.per_device_batch=4"])
    r = aot_estimate.estimate(config, jax.devices()[:4], aot.CHIPS["v5e"], steps=100)
    assert calls == [(None, "true", 64), (1, "false", 16), (2, "false", 16)]  # "auto" resolved for the TPU
    e = r["estimate"]
    # 24 layers at 16 rows: (5 + 3 * 24) * 16 + 7 FLOPs; 4 micro-batches without the update, then one update.
    assert e["flops_per_device"] == 4 * (77 * 16) + 7 and e["bytes_per_device"] == 4 * 2400 + 11
    assert e["accumulation_steps"] == 4 and e["layers"] == 24 and e["total_s"] == pytest.approx(100 * e["step_s"])


def test_a_step_that_does_not_fit_gets_no_estimate(monkeypatch):
    calls = _fake_compiles(monkeypatch, fits=False)
    config = aot.load_config("configs/pretrain.py:size=large", [])
    r = aot_estimate.estimate(config, jax.devices()[:4], aot.CHIPS["v5e"])
    assert r["estimate"] is None and len(calls) == 1 and "no time estimate" in aot_estimate.summary(
        dict(r, compiler_error="RESOURCE_EXHAUSTED", chip="TPU v5e", chips=4, mesh={}, model={"size": "large",
             "dtype": "float32", "remat": "none"}))


def test_compiler_seconds_add_back_one_second_per_concat_bitcast():
    """libtpu 0.0.42.1's optimal_seconds charges -1 s per ConcatBitcast custom call (aot.compiler_seconds)."""
    call = '%c = bf16[8]{0} custom-call(bf16[8]{0} %a), custom_call_target="ConcatBitcast"\n'
    assert aot.compiler_seconds(-2.99, "ENTRY main {\n" + 3 * call + "}") == pytest.approx(0.01)
    assert aot.compiler_seconds(0.25, 'custom_call_target="AllocateBuffer"') == 0.25

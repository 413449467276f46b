"""A quiet start on a CPU: without a GPU or TPU the command-line runner starts JAX on the CPU (no TPU
or CUDA probing) and TensorFlow's C++ log below fatal; a machine with one, or settings of the user's,
are left alone."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from input_pipeline import accelerators

ROOT = Path(__file__).parents[2]


def fake_machine(monkeypatch, files=(), pci_vendors=()):
    """A machine whose device files are ``files`` and whose PCI devices have ``pci_vendors``."""
    vendors = {f"/sys/bus/pci/devices/0000:00:0{i}.0/vendor": v for i, v in enumerate(pci_vendors)}

    def glob(pattern):
        if pattern == "/sys/bus/pci/devices/*/vendor":
            return list(vendors)
        return [f for f in files if f.startswith(pattern.split("*")[0].split("[")[0])]

    real_open = open

    def fake_open(path, *args, **kw):
        if path in vendors:
            import io

            return io.StringIO(vendors[path] + "\n")
        return real_open(path, *args, **kw)

    monkeypatch.setattr(accelerators.os.path, "exists", lambda f: f in files)
    monkeypatch.setattr(accelerators.glob, "glob", glob)
    monkeypatch.setattr("builtins.open", fake_open)


@pytest.mark.parametrize("files, vendors, expected", [
    ((), (), False),
    ((), ("0x8086", "0x1af4"), False),  # Intel, virtio: a CPU VM
    (("/dev/nvidia0",), (), True),
    (("/dev/nvidiactl",), (), True),  # a container with an NVIDIA GPU
    (("/dev/kfd",), (), True),  # AMD ROCm
    (("/dev/accel0",), (), True),  # TPU v2-v4
    (("/dev/vfio/0",), (), True),  # TPU v5 on
    ((), ("0x8086", "0x1ae0"), True),  # a Google PCI device: maybe a TPU
])
def test_accelerators_are_found_from_device_files(monkeypatch, files, vendors, expected):
    fake_machine(monkeypatch, files, vendors)
    assert accelerators.has_accelerator() is expected


def test_quiet_start_sets_cpu_only_without_accelerators(monkeypatch):
    fake_machine(monkeypatch)
    env = {}
    assert accelerators.quiet_cpu_start(env) == {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"} == env
    env = {"JAX_PLATFORMS": "cuda", "TF_CPP_MIN_LOG_LEVEL": "0"}  # the user's own settings win
    assert accelerators.quiet_cpu_start(env) == {} and env == {"JAX_PLATFORMS": "cuda", "TF_CPP_MIN_LOG_LEVEL": "0"}
    fake_machine(monkeypatch, files=("/dev/nvidia0",))
    env = {}
    assert accelerators.quiet_cpu_start(env) == {} == env  # a GPU machine: JAX and TF pick as usual


@pytest.mark.slow  # ~15 s: a training step in a process of its own
def test_a_cpu_run_prints_no_probing_lines(tmp_path):
    if accelerators.has_accelerator():
        pytest.skip("this machine has an accelerator: the probing is JAX's and TensorFlow's business")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS",
                                                            "CUDA_VISIBLE_DEVICES")}
    done = subprocess.run(
        [sys.executable, "train.py", "--config", "configs/pretrain.py:size=tiny,runlocal,synthetic", "--workdir",
         str(tmp_path / "w"), "--config.num_train_steps=1", "--config.eval_every=0", "--config.batch_size=8",
         "--config.data.max_seq_length=16", "--config.data.max_predictions_per_seq=2", "--config.log_every=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert "step 1/1" in log
    for probe in ("Unable to initialize backend", "cuInit", "libtpu"):
        assert probe not in log, log[-3000:]

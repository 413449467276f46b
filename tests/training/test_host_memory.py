"""Freed host memory kept for reuse (bert_jax/training/host_memory.py): no page faults on the second use."""

import subprocess
import sys

import pytest

from bert_jax.training import host_memory

# A fresh process (the settings are process-wide and must come before other threads allocate):
# allocate, touch and free 256 MiB twice; print the page faults of the second time.
PROBE = """
import resource, sys
import numpy as np
from bert_jax.training import host_memory
print(host_memory.reuse_freed_memory(sys.argv[1]))
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(64 << 20, np.float32)  # 256 MiB, every page written
    del a
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(faults())
"""


def probe(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    applied, faults = out.split()
    return applied, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_second_allocation_reuses_the_freed_pages():
    applied, mapped_again = probe("default")
    # 65,536 faults with 4 KiB pages; 128 or more with transparent huge pages (2 MiB).
    assert applied == "False" and mapped_again >= 128
    applied, faults = probe("reuse")
    assert applied == "True" and faults * 4 < mapped_again


def test_modes(monkeypatch):
    with pytest.raises(ValueError, match="expected one of"):
        host_memory.reuse_freed_memory("always")
    assert host_memory.reuse_freed_memory("default") is False
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    assert not host_memory.cpu_backend_expected()
    assert host_memory.reuse_freed_memory("auto") is False  # accelerator hosts keep malloc's defaults
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_memory.cpu_backend_expected()

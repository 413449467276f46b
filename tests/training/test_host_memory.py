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


# Huge pages: the command re-executes itself with glibc's tunable, then a 256 MiB malloc'd buffer
# takes a few hundred page faults instead of 65,536.
HUGE_PROBE = """
import os, resource, sys
from bert_jax.training import host_memory
host_memory.use_huge_pages(sys.argv[1])
import ctypes  # glibc's malloc itself (numpy asks for huge pages on its own)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(libc.malloc(256 << 20), 1, 256 << 20)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(repr(os.environ.get("GLIBC_TUNABLES", "")), faults)
"""


def huge_probe(mode: str, **env) -> tuple[str, int]:
    import os

    out = subprocess.run([sys.executable, "-c", HUGE_PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu", **env}).stdout
    tunables, faults = out.rsplit(" ", 1)
    return eval(tunables), int(faults)  # noqa: S307  (our own repr)


def test_huge_pages_environment():
    env = {"PATH": "/bin"}
    kw = dict(glibc=(2, 36), thp="always [madvise] never\n", cpu=True)
    assert host_memory.huge_pages_environment("auto", env, **kw) == {"PATH": "/bin",
                                                                     "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    kept = host_memory.huge_pages_environment("auto", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, **kw)
    assert kept["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    for mode, environ, changes in [
            ("off", env, {}), ("auto", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {}),  # the user's own
            ("auto", env, {"cpu": False}), ("auto", env, {"glibc": (2, 34)}), ("auto", env, {"glibc": None}),
            ("auto", env, {"thp": "always madvise [never]\n"}), ("auto", env, {"thp": None})]:
        assert host_memory.huge_pages_environment(mode, environ, **{**kw, **changes}) is None, (mode, changes)
    with pytest.raises(ValueError, match="host_huge_pages='on'"):
        host_memory.huge_pages_environment("on", env, **kw)


def test_huge_pages_reexecute_and_cut_page_faults():
    try:
        thp = open(host_memory.THP_SETTING).read()
    except OSError:
        pytest.skip("no transparent huge pages on this kernel")
    if "[never]" in thp or (host_memory._glibc_version() or (0, 0)) < (2, 35):
        pytest.skip(f"transparent huge pages {thp.strip()!r}, glibc {host_memory._glibc_version()}")
    tunables, faults = huge_probe("auto")
    assert tunables == "glibc.malloc.hugetlb=1"  # re-executed once, with the tunable
    off_tunables, off_faults = huge_probe("off")
    assert off_tunables == "" and off_faults > 60_000  # 4 KiB pages: 65,536 for 256 MiB
    assert faults < off_faults / 4, (faults, off_faults)
    assert huge_probe("auto", GLIBC_TUNABLES="glibc.malloc.hugetlb=0")[0] == "glibc.malloc.hugetlb=0"  # left alone

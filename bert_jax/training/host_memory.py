"""Host memory that stays mapped between steps: XLA:CPU's per-step buffers without page faults.

On a CPU backend every run of the jitted step allocates its temporary buffers anew and frees them
at the end; glibc gives allocations that large their own ``mmap``, so each step the kernel maps and
zero-fills them again. `reuse_freed_memory("reuse")` asks glibc (``mallopt``) for one arena, no
``mmap`` and no trimming, so freed buffers are reused as they are (measurements: docs/benchmarks.md,
"Host memory").

The cost: the process never returns memory and its one heap fragments (several models in one
process can run out of host memory). Hence off by default
(``config.reuse_host_memory = "default"``); "auto" applies it only when the JAX backend will be the
CPU (JAX_PLATFORMS starts with cpu, or no GPU/TPU plugin is installed). It has to run before JAX
starts its backend (threads keep the arena they first used), so entry points call it
(``train.py``, ``python -m bert_jax.benchmark --reuse_host_memory``), never the library.

`use_huge_pages` (``config.host_huge_pages = "auto"``, the default) is the cheaper half of the same
cure: the buffers are still mapped anew each step, but in 2 MiB transparent huge pages instead of
4 KiB pages, so the kernel takes ~100x fewer page faults (640 against 65,537 for 256 MiB), and the
process's memory is unchanged
(BERT-base, batch 8: 1.09x the step's speed, the same peak memory; docs/benchmarks.md). glibc (2.35+)
reads that choice, its ``glibc.malloc.hugetlb=1`` tunable, only from the environment it starts
with, so the entry point re-executes its own command line once with ``GLIBC_TUNABLES`` extended,
before anything else happens; "auto" does so when JAX will run on the CPU, the C library is glibc
2.35 or newer, the kernel's transparent huge pages are not ``never``, and the tunable is not set
already (a user's own setting wins). ``"off"`` leaves the process alone.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameters
MODES = ("auto", "reuse", "default")
ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu")


def cpu_backend_expected() -> bool:
    """Whether JAX will run on the CPU, judged without starting it."""
    platforms = os.environ.get("JAX_PLATFORMS", "") or os.environ.get("JAX_PLATFORM_NAME", "")
    if platforms:
        return platforms.split(",")[0].strip().lower() == "cpu"
    return not any(importlib.util.find_spec(name) for name in ACCELERATOR_PLUGINS)


def reuse_freed_memory(mode: str = "auto") -> bool:
    """Applies the settings above per ``mode``; returns whether they are now in force."""
    if mode not in MODES:
        raise ValueError(f"reuse_host_memory={mode!r}: expected one of {MODES}")
    if mode == "default" or (mode == "auto" and not cpu_backend_expected()):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (glibc only; musl has no mallopt parameters to set)
    except (OSError, AttributeError):
        log.info("not glibc: host memory allocation left as it is")
        return False
    # -1 as the trim threshold is SIZE_MAX to glibc: freed memory is never handed back.
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))
    return all(libc.mallopt(param, value) == 1 for param, value in settings)


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
HUGE_PAGE_MODES = ("auto", "off")
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_environment(mode: str, environ: dict[str, str], *, glibc: tuple[int, int] | None,
                           thp: str | None, cpu: bool) -> dict[str, str] | None:
    """The environment to re-execute with for `use_huge_pages`, or None when there is nothing to do.
    ``glibc``: the C library's version (None: not glibc); ``thp``: the contents of `THP_SETTING`
    (None: no such file); ``cpu``: whether JAX will run on the CPU."""
    if mode not in HUGE_PAGE_MODES:
        raise ValueError(f"host_huge_pages={mode!r}: expected one of {HUGE_PAGE_MODES}")
    tunables = environ.get("GLIBC_TUNABLES", "")
    if (mode == "off" or not cpu or "glibc.malloc.hugetlb" in tunables or glibc is None or glibc < (2, 35)
            or thp is None or "[never]" in thp):
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(t for t in (tunables, HUGE_PAGES_TUNABLE) if t)}


def _glibc_version() -> tuple[int, int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        version = ctypes.CDLL("libc.so.6").gnu_get_libc_version
        version.restype = ctypes.c_char_p
        major, minor = version().decode().split(".")[:2]
        return int(major), int(minor)
    except (OSError, AttributeError, ValueError):
        return None


def use_huge_pages(mode: str = "auto") -> None:
    """Re-executes this process's command line (``sys.orig_argv``) with `huge_pages_environment`
    when there is one (it does not return then); returns without doing anything otherwise. Call it
    first thing in an entry point: everything before it runs twice."""
    try:
        thp = Path(THP_SETTING).read_text()
    except OSError:
        thp = None
    env = huge_pages_environment(mode, dict(os.environ), glibc=_glibc_version(), thp=thp,
                                 cpu=mode != "off" and cpu_backend_expected())
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

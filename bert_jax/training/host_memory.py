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
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import sys

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

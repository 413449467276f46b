"""Whether this machine has a GPU or a TPU, read from its device files (nothing is initialised), and
what the command-line runner sets before JAX and TensorFlow start on a machine with neither
(`quiet_cpu_start`).

Without it, every tool on a CPU-only machine starts with JAX's ``Unable to initialize backend 'tpu'``
(libtpu is installed for ahead-of-time compilation) and TensorFlow's ``failed call to cuInit``: each
library probes for hardware that is not there. A machine with an accelerator, or a user who set
``JAX_PLATFORMS`` or ``TF_CPP_MIN_LOG_LEVEL``, is left as it is.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import MutableMapping

# NVIDIA's device nodes (a Docker/Kubernetes container has nvidiactl; WSL2 has dxg), AMD's (ROCm).
GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")
# TPU chips: /dev/accel* (v2-v4), /dev/vfio/<n> (v5 on), and any PCI device of Google's vendor id
# (what JAX looks for; a Google NIC counts too: such a machine keeps the probing, never loses a TPU).
TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")
GOOGLE_PCI_VENDOR = "0x1ae0"


def has_accelerator() -> bool:
    """Whether a GPU or a TPU may be attached (device files and PCI vendor ids only)."""
    if any(os.path.exists(f) for f in GPU_DEVICE_FILES):
        return True
    if any(glob.glob(pattern) for pattern in TPU_DEVICE_GLOBS):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor, encoding="ascii") as f:
                if f.read().strip() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


def quiet_cpu_start(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """On a machine without a GPU or TPU (`has_accelerator`): ``JAX_PLATFORMS=cpu`` (JAX uses the CPU
    without probing for a TPU or CUDA) and ``TF_CPP_MIN_LOG_LEVEL=3`` (TensorFlow's C++ log lines off
    but fatal ones: its failed ``cuInit`` among them; TF's failures still reach Python as exceptions),
    each only where unset. For entry points, before JAX's backends start (JAX already imported: its
    config too). Returns what it set.

    Two INFO lines of TensorFlow's remain (``oneDNN custom operations are on``, ``Could not find cuda
    drivers``): its C++ libraries print them while they load, before any setting can reach them."""
    if has_accelerator():
        return {}
    wanted = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    applied = {k: v for k, v in wanted.items() if k not in environ}
    environ.update(applied)
    jax = sys.modules.get("jax")  # imported by the tool's own imports: set its option as the variable would
    if jax is not None and "JAX_PLATFORMS" in applied and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")
    return applied

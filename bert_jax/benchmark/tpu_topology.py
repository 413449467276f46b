"""TPU generations and topologies for ahead-of-time compilation without a TPU: each chip's memory,
peak and bandwidth (`CHIPS`), ``v5e-256`` / ``v4:8x8x16`` names (`topology_name`) and the devices the
real TPU compiler targets (`tpu_devices`, needs ``libtpu``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

from input_pipeline import command_line as cli


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    hbm_gib: float  # per chip (Cloud TPU system architecture pages, below)
    peak_bf16: float  # dense bf16 FLOP/s per chip (same pages)
    cores_per_chip: int  # the N of "v4-N" counts TensorCores on v3/v4/v5p, chips on v5e/v6e
    dims: int  # torus dimensions of the topology name
    hbm_bandwidth: float  # bytes/s per chip (same pages)
    megacore: bool = True  # the chip's TensorCores are one JAX device (v4, v5p); v3's are one device each

    @property
    def devices_per_chip(self) -> int:
        return 1 if self.megacore else self.cores_per_chip


# cloud.google.com/tpu/docs/{v3,v4,v5e,v5p,v6e} ("key specifications"): v3 123 TFLOP/s, 32 GiB (16 per
# TensorCore), 900 GB/s; v4 275 TFLOP/s, 32 GiB, 1200 GB/s; v5e 197 TFLOP/s, 16 GB, 819 GB/s; v5p 459
# TFLOP/s, 95 GB, 2765 GB/s; v6e 918 TFLOP/s, 32 GB, 1638 GB/s.
CHIPS = {
    "v3": Chip("TPU v3", 32, 123e12, 2, 2, 900e9, megacore=False),
    "v4": Chip("TPU v4", 32, 275e12, 2, 3, 1200e9),
    "v5e": Chip("TPU v5e", 16, 197e12, 1, 2, 819e9),
    "v5p": Chip("TPU v5p", 95, 459e12, 2, 3, 2765e9),
    "v6e": Chip("TPU v6e", 32, 918e12, 1, 2, 1638e9),
}


def topology_name(spec: str) -> tuple[Chip, str, int]:
    """``v5e-256`` (Cloud TPU accelerator type) or ``v5e:16x16`` (topology) → (chip, the compiler's
    topology name, chips)."""
    gen, sep, rest = spec.replace(":", "-", 1).partition("-")
    if gen not in CHIPS or not sep or not rest:
        raise ValueError(f"--topology {spec!r}: expected <generation>-<size> or <generation>:<AxB[xC]> with "
                         f"generation one of {', '.join(CHIPS)} (e.g. v5e-256, v4-32, v5p:2x2x1)")
    chip = CHIPS[gen]
    if "x" in rest:
        dims = [int(d) for d in rest.split("x") if d.isdigit()]
        if len(dims) != chip.dims or len(rest.split("x")) != chip.dims:
            raise ValueError(f"--topology {spec!r}: {gen} topologies have {chip.dims} dimensions")
        return chip, f"{gen}:{rest}", math.prod(dims)
    if not rest.isdigit() or int(rest) % chip.cores_per_chip:
        raise ValueError(f"--topology {spec!r}: the size must be a multiple of {chip.cores_per_chip}")
    chips = int(rest) // chip.cores_per_chip
    if chips & (chips - 1):
        raise ValueError(f"--topology {spec!r}: {chips} chips is not a power of two")
    if chip.dims == 2:
        a = 2 ** (int(math.log2(chips)) // 2)
        return chip, f"{gen}:{a}x{chips // a}", chips
    dims = {1: [1, 1, 1], 2: [1, 2, 1]}.get(chips, [2, 2, 1])
    while math.prod(dims) < chips:
        smallest = min(dims)
        dims[max(i for i, d in enumerate(dims) if d == smallest)] *= 2
    return chip, f"{gen}:{'x'.join(map(str, dims))}", chips


def tpu_devices(spec: str):
    """The topology's devices, for the real TPU compiler (no TPU needed)."""
    chip, name, _ = topology_name(spec)
    if importlib.util.find_spec("libtpu") is None:
        raise cli.UserError("libtpu is not installed: pip install -e '.[tpu]' (jax[tpu] of the installed jax)")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server: this is not a TPU VM
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling only: several tools may run at once
    from jax.experimental import topologies

    try:
        dims = [int(d) for d in name.partition(":")[2].split("x")]
        hosts = (min(dims[0], 2), min(dims[1], 2), 1)  # a host holds up to 2x2 chips; fewer on a small slice
        devices = topologies.get_topology_desc(platform="tpu", topology_name=name, chips_per_host_bounds=hosts,
                                               chip_config_name="megacore" if chip.megacore and chip.cores_per_chip > 1
                                               else "default",
                                               ).devices  # megacore: one device per chip
    except Exception as e:  # libtpu rejects the shape
        raise ValueError(f"--topology {spec!r} ({name}): libtpu does not accept it: {cli.message(e)}") from e
    return chip, name, devices

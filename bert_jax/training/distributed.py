"""Several JAX processes as one job: ``config.multihost`` and ``config.distributed``.

On a TPU pod slice (and under Slurm or Open MPI) every field of ``config.distributed`` may stay
empty: ``jax.distributed.initialize()`` finds the coordinator, the process count and this process's
id by itself. Elsewhere (several processes on one machine, GPU hosts without a scheduler) they are
given: ``coordinator_address`` (host:port of process 0), ``num_processes``, ``process_id``. CPU
processes also need cross-process collectives (``cpu_collectives="gloo"``), or their collectives
stay inside each process.
"""

from __future__ import annotations

import ipaddress

import ml_collections

LOOPBACK_NAMES = ("localhost",)


def default_config() -> ml_collections.ConfigDict:
    """The ``config.distributed`` section of every job config (read only when ``multihost``)."""
    return ml_collections.ConfigDict(dict(
        coordinator_address="",  # host:port of process 0; "" = auto-detected (Cloud TPU, Slurm, Open MPI)
        num_processes=0,  # 0 = auto-detected
        process_id=-1,  # -1 = auto-detected
        cpu_collectives="",  # "gloo" for several CPU processes ("" = JAX's default: none across processes)
        initialization_timeout=300,  # seconds to wait for every process to join
        heartbeat_timeout=100,  # seconds without a heartbeat after which a process counts as dead
        shutdown_timeout=300,  # seconds a finishing process waits for the others at exit
    ))


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def initialize(config) -> None:
    """``jax.distributed.initialize`` from ``config.distributed`` when ``config.multihost``; must
    run before anything starts JAX's backend. A second job in the same processes (fine-tuning after
    pre-training, a resumed run in a test) keeps the first initialisation."""
    import jax  # here, not at the top: the job configs import this module's `default_config`, JAX-free

    if not config.multihost or jax.distributed.is_initialized():
        return
    d = config.distributed
    given = {"coordinator_address": d.coordinator_address or None,
             "num_processes": d.num_processes or None,
             "process_id": None if d.process_id < 0 else d.process_id}
    if given["num_processes"] is not None and given["process_id"] is not None \
            and not 0 <= given["process_id"] < given["num_processes"]:
        raise ValueError(f"config.distributed.process_id={given['process_id']} is not in "
                         f"[0, num_processes={given['num_processes']})")
    if d.cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", d.cpu_collectives)
    kwargs = {k: v for k, v in given.items() if v is not None}
    if given["coordinator_address"] and _is_loopback(given["coordinator_address"]):
        # One machine: process 0's coordinator listens on the loopback address only (JAX's default
        # is every interface).
        kwargs["coordinator_bind_address"] = given["coordinator_address"]
    jax.distributed.initialize(
        **kwargs, initialization_timeout=int(d.initialization_timeout),
        heartbeat_timeout_seconds=int(d.heartbeat_timeout),
        shutdown_timeout_seconds=int(d.shutdown_timeout))

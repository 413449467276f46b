"""XLA compiler options for a job's compiled steps: ``config.xla_options``.

Written as ``XLA_FLAGS`` writes them, space-separated ``name=value`` (the leading ``--`` optional):

    --config.xla_options='--xla_gpu_dot_merger_threshold_mb=0 --xla_gpu_enable_triton_gemm=false'

Unlike ``XLA_FLAGS`` they are part of the job's config, so ``config.json`` records them, and they reach
the train and eval steps' compiles only (`bert_jax.training.steps.jit_steps`); the benchmark's
``--xla_option`` and ahead-of-time compilation take the same. `check` compiles a one-line program with
them on the job's backend, so an unknown name or a value of the wrong type stops the job (and its dry
run) before anything is built, naming the option. XLA's CPU and GPU compilers know one set of options
(a GPU's is accepted, and does nothing, on a CPU); a TPU's own (``xla_tpu_*``) are checked on a TPU only,
and by the AOT tool's TPU compiles (`refused` turns the compile's error into the same line).
"""

from __future__ import annotations

import re

KEY = "xla_options"  # the config's key
CONFIG_KEY = f"--config.{KEY}"
REFUSALS = ("No such compile option", "While setting option")  # how XLA's compile says it refuses an option
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
TPU_PREFIX = "xla_tpu_"  # options only a TPU's compiler (libtpu) knows


def value(text: str) -> bool | int | float | str:
    """An option's value as XLA takes it: true/false a bool, a number an int or float, else the text."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse(text: str, key: str = CONFIG_KEY) -> dict[str, bool | int | float | str]:
    """``"--name=value --name=value"`` (``key``: the config key or flag named in errors) as a dict."""
    options = {}
    for item in (text or "").split():
        name, eq, raw = item.removeprefix("--").partition("=")
        if not eq or not NAME.match(name) or not raw:
            raise ValueError(f"{key}: {item!r} is not an XLA option; expected name=value (e.g. "
                             "xla_gpu_enable_triton_gemm=false)")
        options[name] = value(raw)
    return options


def text(options: dict) -> str:
    """``options`` written as `parse` reads them."""
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items())


def of_config(config) -> dict[str, bool | int | float | str] | None:
    """``config.xla_options`` parsed (None: none set, or a config without the key)."""
    return parse(config.get(KEY, ""), CONFIG_KEY) or None


def refused(error: Exception, options: dict | None, key: str = CONFIG_KEY) -> ValueError | None:
    """A compile's ``error`` as the one-line ``ValueError`` naming ``key`` when it is XLA refusing
    ``options``; None when it is anything else."""
    first = (str(error).splitlines() or [""])[0]
    if not options or not any(r in first for r in REFUSALS):
        return None
    return ValueError(f"{key}: XLA refused {options}: {first.removeprefix('INVALID_ARGUMENT: ')}")


def check(options: dict | None, key: str = CONFIG_KEY) -> None:
    """Compiles a one-line program with ``options`` on JAX's default backend: XLA's refusal (an
    unknown option, a value of the wrong type) as a one-line ``ValueError`` naming ``key``. Off a
    TPU, the TPU's own options (``xla_tpu_*``) are left out (that compiler alone knows them)."""
    import jax
    import jax.numpy as jnp

    if jax.default_backend() != "tpu":
        options = {k: v for k, v in (options or {}).items() if not k.startswith(TPU_PREFIX)}
    if not options:
        return
    try:
        jax.jit(lambda: jnp.zeros((), jnp.int32) + 1, compiler_options=options).lower().compile()
    except jax.errors.JaxRuntimeError as e:
        raise refused(e, options, key) or e from None

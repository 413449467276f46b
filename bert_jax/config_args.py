"""Named arguments for config files: ``configs/pretrain.py:size=base,runlocal`` (big_vision style)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_collections

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"


def load_config_file(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """``configs/<name>.py``'s ``get_config(arg)``, for code that runs a config without train.py's
    ``--config`` flag (the benchmarks, the demo, one config built on another)."""
    return config_module(name).get_config(arg)


def config_module(name: str):
    """The module ``configs/<name>.py`` (its ``get_config`` and the tables it defines)."""
    path = CONFIGS_DIR / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such config (run from a checkout of the repository)")
    spec = importlib.util.spec_from_file_location(f"bert_jax_configs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
    """``"size=base,runlocal"`` → ConfigDict(size="base", runlocal=True, <other defaults>).

    Values take the type of their default (bool, int, float, str); a bare name sets a bool to True.
    Unknown names are an error listing the accepted ones.
    """
    out = dict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if key not in defaults:
            raise ValueError(f"unknown config argument {key!r}; expected some of {sorted(defaults)}")
        default = defaults[key]
        if not sep:
            if not isinstance(default, bool):
                raise ValueError(f"config argument {key!r} needs a value ({key}=...)")
            out[key] = True
        elif isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"config argument {key}={value!r}: expected true or false")
            out[key] = value.lower() in ("true", "1")
        else:
            try:
                out[key] = type(default)(value)
            except ValueError as e:
                raise ValueError(f"config argument {key}={value!r}: expected {type(default).__name__}") from e
    return ml_collections.ConfigDict(out)

"""Named arguments for config files: ``configs/pretrain.py:size=tiny,runlocal`` (big_vision style)."""

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
    """``"size=tiny,runlocal"`` → ConfigDict(size="tiny", runlocal=True, <other defaults>).

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


def load_config_spec(spec: str) -> ml_collections.ConfigDict:
    """``PATH[:ARG]`` as ``--config`` loads it (ml_collections: ``get_config(ARG)``, or
    ``get_config()`` without one), with its errors as one line naming the flag."""
    path, *arg = spec.split(":", 1)
    if not Path(path).is_file():
        raise FileNotFoundError(f"--config {path}: no such config file (expected configs/<job>.py[:<args>])")
    spec_ = importlib.util.spec_from_file_location("bert_jax_config_check", path)
    module = importlib.util.module_from_spec(spec_)
    try:
        spec_.loader.exec_module(module)
        return module.get_config(*arg)
    except Exception as e:  # noqa: BLE001  (any error of the file or its arguments is the user's to fix)
        raise ValueError(f"--config={spec}: {' '.join(str(e).split()) or type(e).__name__}") from e


def check_overrides(config: ml_collections.ConfigDict, argv: list[str]) -> None:
    """Raises ValueError for a ``--config.a.b[=v]`` (or ``--noconfig.a.b``) in ``argv`` that names no
    key of ``config``, naming the flag, the missing key and the nearest keys there are."""
    import difflib

    for arg in argv[1:]:
        if arg == "--":
            break
        name = arg.lstrip("-").split("=", 1)[0]
        if not arg.startswith("-") or not name.startswith(("config.", "noconfig.")):
            continue
        node = config
        for part in name.split(".", 1)[1].split("."):
            key = part.split("[", 1)[0]  # a[0]: the list a
            if not isinstance(node, ml_collections.ConfigDict | dict) or key not in node:
                keys = list(node.keys()) if isinstance(node, ml_collections.ConfigDict | dict) else []
                near = difflib.get_close_matches(key, keys, n=3)
                raise ValueError(f"--{name.removeprefix('no')}: the config has no key {key!r}"
                                 + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""))
            node = node[key]


def check_command_line(argv: list[str]) -> None:
    """The ``--config`` file of ``argv`` loads and each ``--config.<key>`` names one of its keys
    (before absl parses ``argv``, so that either mistake is one line, not a traceback)."""
    specs = [b if a == "--config" else a.partition("=")[2] for a, b in zip(argv, [*argv[1:], ""], strict=True)
             if a == "--config" or a.startswith("--config=")]
    if specs:
        check_overrides(load_config_spec(specs[-1]), argv)


def is_finetuning(config) -> bool:
    """Whether a job config (a ConfigDict, or the dict of a workdir's config.json) fine-tunes: it has a
    ``task`` section (configs/finetune.py and the task configs built on it); any other pre-trains."""
    return "task" in config

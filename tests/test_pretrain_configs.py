"""configs/pretrain.py resolves every argument combination to the values recorded in
tests/fixtures/pretrain_configs.txt (one line a valid combination: its argument string and a digest of
its config, with ``--config.num_train_steps`` overridden too, so values that follow it stay tied to
it); every other combination is refused. A change of a recipe's value regenerates the record:

    python -m tests.test_pretrain_configs
"""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from bert_jax.config_args import config_module

RECORD = Path(__file__).parent / "fixtures" / "pretrain_configs.txt"
# Each argument's default and its other values (sizes: every size name of every model, and tiny).
GRID = {
    "model": ("bert", "roberta", "albert", "electra", "modernbert"),
    "size": ("", "tiny", "mini", "small", "medium", "base", "large", "xlarge", "xxlarge"),
    "masking": ("", "static", "dynamic"),
    "objective": ("", "none", "sop"),
    "phase": (1, 2),
    "runlocal": (False, True),
    "scratch": (False, True),
    "synthetic": (False, True),
    "recipe": ("", "lamb"),
    "per_device": (0, 4),
}


def argument(values: dict) -> str:
    """``model=bert,phase=1,runlocal,...``: a bool as its bare name when true, defaults left out
    (``model`` and ``phase`` always written)."""
    parts = []
    for key, value in values.items():
        if value is True:
            parts.append(key)
        elif value not in (False, "", 0) or key in ("model", "phase"):
            parts.append(f"{key}={value}")
    return ",".join(parts)


def digest(config) -> str:
    """The config's values as JSON, then again with ``num_train_steps`` overridden (what follows it)."""
    text = config.to_json(sort_keys=True)
    config.num_train_steps = 1234
    text += config.to_json(sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolved(every: int = 1) -> dict[str, str | None]:
    """Argument string → digest (None where the config refuses it), for every ``every``-th combination
    of `GRID`."""
    get_config = config_module("pretrain").get_config
    out = {}
    for combination in itertools.islice(itertools.product(*GRID.values()), 0, None, every):
        arg = argument(dict(zip(GRID, combination, strict=True)))
        try:
            out[arg] = digest(get_config(arg))
        except ValueError:
            out[arg] = None
    return out


# The fast suite checks every SAMPLE-th combination (every recipe and model is among them); the slow
# one checks them all.
SAMPLE = 7


@pytest.mark.parametrize("every", [SAMPLE, pytest.param(1, marks=pytest.mark.slow)], ids=["sample", "all"])
def test_every_argument_combination_resolves_as_recorded(every):
    recorded = dict(line.split() for line in RECORD.read_text().splitlines())
    tried = resolved(every)
    now = {a: d for a, d in tried.items() if d is not None}
    recorded = {a: d for a, d in recorded.items() if a in tried}
    changed = sorted(a for a in recorded.keys() & now.keys() if recorded[a] != now[a])
    assert not changed, f"{len(changed)} combinations changed their values, e.g. {changed[:5]}"
    assert sorted(recorded.keys() - now.keys()) == [], "combinations now refused"
    assert sorted(now.keys() - recorded.keys()) == [], "combinations now accepted"


def test_size_names_are_the_model_tables():
    """The config names sizes without importing the model (JAX): its names are the size tables'."""
    from bert_jax.model.config import FAMILY_SIZES, SIZES

    names = config_module("pretrain").SIZE_NAMES
    assert names["bert"] == names["roberta"] == tuple(SIZES)
    family = {f"{model}-{size}" for model in ("albert", "electra", "modernbert") for size in names[model]}
    assert family <= set(FAMILY_SIZES), family - set(FAMILY_SIZES)


def test_configs_import_no_jax():
    """Every job config builds without importing JAX (big_vision's configs: plain data)."""
    code = ("import sys\nfrom bert_jax.config_args import load_config_file\n"
            "for name, arg in [('pretrain', 'model=electra,runlocal'), ('pretrain', 'recipe=lamb'),"
            " ('glue', 'task=mrpc'), ('squad', None), ('ner', None), ('sentiment', None), ('finetune', None)]:\n"
            "    load_config_file(name, arg)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "[]", out.stdout


if __name__ == "__main__":
    RECORD.write_text("".join(f"{a} {d}\n" for a, d in resolved().items() if d is not None))
    print(f"wrote {RECORD}")

"""Command-line modules: importable together, no flags defined at import time."""

import importlib
import pkgutil

import pytest
from absl import flags

import bert_jax
import input_pipeline
from bert_jax.interop import extract_features
from input_pipeline import create_pretraining_data


def _all_modules():
    for pkg in (bert_jax, input_pipeline):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if not info.name.endswith(".__main__"):  # `python -m` entry points run when imported
                yield info.name


def test_importing_every_module_defines_no_global_flags():
    for name in _all_modules():
        importlib.import_module(name)
    ours = {f for f in flags.FLAGS
            if flags.FLAGS.find_module_defining_flag(f, "").startswith(("bert_jax", "input_pipeline"))}
    assert not ours, f"flags defined at import time (they clash between CLIs in one process): {sorted(ours)}"


@pytest.mark.parametrize("module,argv,required", [
    (create_pretraining_data, ["--input=a.txt", "--output=o", "--vocab=v.txt"], "--output"),
    (extract_features, ["--init=hf:d", "--input=a.txt", "--output=o.npz"], "--init"),
])
def test_define_flags_on_a_fresh_set(module, argv, required):
    fv = flags.FlagValues()
    module.define_flags(fv)
    fv(["prog", *argv])
    assert fv["input"].value == "a.txt"
    missing = flags.FlagValues()
    module.define_flags(missing)
    with pytest.raises(flags.IllegalFlagValueError, match=required.lstrip("-")):
        missing(["prog", *[a for a in argv if not a.startswith(required)]])


"""README's demo table and figure come from one run of these programs (tests/golden/demo_programs.py)."""

import json

import jax
import pytest

from tests.golden.demo_programs import GOLDEN, programs, versions


def test_the_demo_steps_are_the_programs_that_made_readmes_table():
    record = json.loads(GOLDEN.read_text())
    if jax.default_backend() != "cpu":
        pytest.skip("the programs are lowered for a CPU: another platform resolves other choices")
    if record["versions"] != versions():
        pytest.skip(f"{GOLDEN.name} was made with {record['versions']}, not {versions()}: other versions lower "
                    "other text")
    now = programs()
    changed = sorted(k for k, v in record["programs"].items() if now.get(k) != v)
    assert not changed and set(now) == set(record["programs"]), (
        f"the demo's steps {changed or sorted(set(now) ^ set(record['programs']))} are no longer the programs that "
        "made README's demo table: re-run `make demo FRESH=1` and `python -m bert_jax.demo --curve`, update README's "
        "table, docs/images/demo_curve.png and the record, then `python tests/golden/demo_programs.py` "
        "(tests/golden/README.md, 'demo_programs.json')")

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


@pytest.mark.slow
def test_the_demos_held_out_batches_are_the_ones_that_made_readmes_table(tmp_path):
    """The demo's data (the packages' text, the vocabulary it learns, tokens, masks, row order) for
    each pre-training seed, fingerprinted as README's table was made (~1 minute: pip's cached text
    and a vocabulary)."""
    from tests.golden.demo_programs import DATA_PACKAGES, held_out

    record = json.loads(GOLDEN.read_text())
    if record["data_versions"] != versions(DATA_PACKAGES):
        pytest.skip(f"{GOLDEN.name}'s data was made with {record['data_versions']}, not {versions(DATA_PACKAGES)}")
    now = held_out(tmp_path / "demo")
    assert now == record["held_out"], (
        f"the demo's held-out batches {now} are no longer those that made README's demo table "
        f"{record['held_out']}: re-run the demo as for a changed program (tests/golden/README.md, "
        "'demo_programs.json')")

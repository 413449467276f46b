"""The real-data policy of tests/conftest.py: missing real data (pip package data, tests/golden/) skips a
test, but fails it under CI=true/1/yes, with the reason; and test modules reach real data only through
the conftest fixtures, so every such test follows the policy."""

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
NOT_CI = [None, "", "false", "0", "no", "off"]
CI = ["true", "1", "yes", "TRUE", " Yes "]


def set_ci(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)


def outcome(fn, *args) -> tuple[type | None, str]:
    """(Skipped or Failed, message) that ``fn(*args)`` raised. Caught here, not with pytest.raises: a
    skip escaping pytest.raises(Failed) would skip this test instead of failing it."""
    try:
        fn(*args)
    except (pytest.skip.Exception, pytest.fail.Exception) as e:
        return type(e), str(e)
    return None, ""


@pytest.mark.parametrize("value", NOT_CI)
def test_skips_outside_ci(monkeypatch, missing_real_data, value):
    set_ci(monkeypatch, value)
    assert outcome(missing_real_data, "the wheel is gone") == (pytest.skip.Exception, "the wheel is gone")


@pytest.mark.parametrize("value", CI)
def test_fails_under_ci(monkeypatch, missing_real_data, value):
    set_ci(monkeypatch, value)
    kind, message = outcome(missing_real_data, "the wheel is gone")
    assert kind is pytest.fail.Exception
    assert message == f"the wheel is gone (CI={value}: a test on real data fails instead of skipping)"


@pytest.mark.parametrize("value, expected", [(None, pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_package_data_and_golden_fixtures_follow_it(monkeypatch, fetch_package_data, golden_file, value, expected):
    from input_pipeline import package_data

    def unavailable():
        raise package_data.PackageDataError("could not download gensim==4.4.0 with pip: no network")

    monkeypatch.setattr(package_data, "wikipedia_excerpt", unavailable)
    set_ci(monkeypatch, value)
    kind, message = outcome(fetch_package_data, "wikipedia_excerpt")
    assert kind is expected and "wikipedia_excerpt() unavailable" in message and "no network" in message
    kind, message = outcome(golden_file, "no_such_file.npz")
    assert kind is expected and "no_such_file.npz missing: run `make golden`" in message
    assert golden_file("minilm_golden.npz") == TESTS / "golden" / "minilm_golden.npz"  # present: its path


def test_test_modules_reach_real_data_only_through_fixtures():
    """No test module fetches package data or opens tests/golden/ itself (and so skips on its own terms)."""
    # The doc-command test resolves the pkg: names that documented commands pass, as the tools do; its
    # tests take the minilm_dir and wikipedia_dump fixtures first, so the policy above applies.
    exempt = {TESTS / "test_doc_commands.py"}
    offenders = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.parent.name == "golden" or path == Path(__file__) or path in exempt:
            continue
        text = path.read_text(encoding="utf-8")
        if "package_data" in text or "PackageDataError" in text or re.search(r"""["']golden["']""", text):
            offenders.append(str(path.relative_to(TESTS)))
    assert not offenders, f"use the conftest fixtures (minilm_dir, wikipedia_dump, golden_file, ...): {offenders}"

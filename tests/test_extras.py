"""The core install is what training needs: the server and plotting stack sit in the `apps` extra,
and the commands that need it say which extra to install."""

import tomllib
from pathlib import Path

import pytest

from bert_jax.serve.__main__ import APPS_MODULES
from input_pipeline import command_line as cli

ROOT = Path(__file__).resolve().parents[1]
APPS = {"matplotlib", "starlette", "uvicorn", "prometheus-client", "httpx"}


def _names(requirements):
    return {r.split(">")[0].split("=")[0].split("[")[0].strip().lower() for r in requirements}


def test_core_install_has_no_server_or_plotting_library():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not _names(project["dependencies"]) & APPS
    assert _names(project["optional-dependencies"]["apps"]) == APPS
    # the server checks for the same packages it imports
    assert {m.replace("_", "-") for m in APPS_MODULES} == APPS - {"matplotlib"}


def test_missing_extra_names_the_pip_line():
    with pytest.raises(cli.UserError, match=r"the server needs no_such_pkg_xyz.*pip install 'bert-jax\[apps\]'"):
        cli.require_extra("apps", "json", "no_such_pkg_xyz", purpose="the server")
    cli.require_extra("apps", "json", purpose="anything")  # present: no error


def test_png_without_matplotlib_is_a_one_line_error(monkeypatch, tmp_path):
    import importlib.util

    from bert_jax.visualize import command

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(cli.UserError, match=r"--png needs matplotlib.*\[apps\]"):
        command.run("hf:pkg:minilm", "a text", tmp_path / "a.html", png=tmp_path / "a.png")
    assert not (tmp_path / "a.html").exists()

"""What the golden scripts (run as scripts in the golden venv: no bert_jax, no jax) share."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def load_package_data():
    """input_pipeline/package_data.py loaded by path (stdlib only), so neither bert_jax nor jax is imported."""
    path = REPO / "input_pipeline" / "package_data.py"
    spec = importlib.util.spec_from_file_location("_bert_jax_package_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

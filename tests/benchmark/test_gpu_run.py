"""`python tests/gpu/run.py`: the GPU's measurements in one run, dry-run on the CPU with
``--quick`` (tiny shapes), stage by stage; its arguments; a stage that fails leaves the others."""

import json
import re

import pytest

from tests.gpu import run as gpu_run


@pytest.fixture(autouse=True)
def worker_compilation_cache():
    """The worker's compilation cache back after each test. `gpu_run.main` points JAX at the run's own
    cache, and JAX puts that directory into every later program's cache key (its XLA cache options):
    without this, every later compile in the worker misses the tests' shared cache."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    kept = {name: getattr(jax.config, name) for name in names}
    yield
    for name, value in kept.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()  # opened again, in the worker's directory, by the next compile


@pytest.mark.slow  # ~20 s: the default step compiled and traced on the CPU
def test_quick_run_writes_its_tables(tmp_path):
    out = tmp_path / "gpu"
    gpu_run.main(["--out", str(out), "--quick", "--stages", "profile_before", "--cache", str(tmp_path / "cache")])
    summary = (out / "summary.md").read_text()
    assert "## Where the time goes: profile_before (the defaults)" in summary and "| matrix products |" in summary
    stages = [json.loads(line)["stage"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert stages == ["profile_before"]
    assert (out / "profile_before.tar.gz").stat().st_size > 0 and not (out / "profile_before").exists()


@pytest.mark.slow  # ~50 s: four compiles and Hugging Face's model
def test_quick_variants_and_sizes_take_turns_with_hugging_face(tmp_path):
    pytest.importorskip("torch", reason="the variants stage compares with Hugging Face's PyTorch BERT ('bench' extra)")
    out = tmp_path / "gpu"
    gpu_run.main(["--out", str(out), "--quick", "--stages", "variants,sizes,profile_after", "--variant=--scan",
                  "--cache", str(tmp_path / "cache")])
    summary = (out / "summary.md").read_text()
    assert "| ours --scan |" in summary and "| hf-torch |" in summary and "## Sizes" in summary
    stages = [json.loads(line)["stage"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert stages == ["variants", "sizes", "profile_after"]


@pytest.mark.parametrize("stage,heading,column,names", [
    ("attention_kernels", "## Attention alone", "attention",
     ["XLA explicit + dropout", "flash 64/4 + dropout", "flash 64/8 + dropout", "flash 128/4 + dropout",
      "flash 128/8 + dropout", "flash 64/4, no dropout"]),
    ("norm_kernels", "## Residual, dropout and LayerNorm alone", "norm",
     ["XLA (reference_add_norm)", "fused 8/8, bwd 2x1024", "fused 4/4, bwd 2x1024", "fused 16/8, bwd 2x1024",
      "fused 8/8, bwd 4x1024", "fused 8/8, bwd 2x256", "fused 8/4, bwd 1x2048",
      "fused 8/8, bwd 2x1024, no dropout"])])
def test_quick_kernel_stages_time_every_tiling(tmp_path, stage, heading, column, names):
    """The attention_kernels and norm_kernels stages on the CPU (~10 s each): XLA's computation and the
    Pallas kernel's tilings (interpreted; each with and without dropout), one row each; no
    roofline off a GPU."""
    out = tmp_path / "gpu"
    gpu_run.main(["--out", str(out), "--quick", "--stages", stage, "--cache", str(tmp_path / "cache")])
    summary = (out / "summary.md").read_text()
    assert heading in summary and "failed" not in summary
    (line,) = (out / "results.jsonl").read_text().splitlines()
    rows = json.loads(line)["result"]
    assert [r[column] for r in rows] == names
    assert all(r["ms"] > 0 and r["least_ms"] is None for r in rows)


@pytest.mark.parametrize("probe,failed", [("import sys; print('crashed'); sys.exit(3)", {"flash", "norm"}),
                                          ("print('flash finite: True'); import os; os.abort()", {"norm"})],
                         ids=["both", "the second"])
def test_a_kernel_that_fails_its_probe_leaves_its_variants_out(tmp_path, monkeypatch, probe, failed):
    """On a GPU the Pallas kernels first run in a child process; a kernel that fails there (the child
    exits 3 before either has run; or crashes after the flash kernel has) leaves out the variants that
    ask for it, and the variants stage times the others instead of dying with the kernel."""
    import types

    import jax

    run = gpu_run.Run(tmp_path / "gpu", 100, quick=True, args=types.SimpleNamespace(variant=[]))
    monkeypatch.setattr(jax, "devices", lambda *a: [types.SimpleNamespace(platform="gpu")])
    monkeypatch.setattr(gpu_run, "KERNEL_PROBE", probe)
    assert gpu_run.kernels_run(run) == {"flash", "norm"} - failed
    assert f"{sorted(failed)} failed" in (tmp_path / "gpu" / "summary.md").read_text()
    seen = []
    monkeypatch.setattr(gpu_run, "bench", lambda argv: seen.append(argv) or [{"implementations": [
        {"name": "ours", "step_time_median_s": 0.1, "tokens_per_s": 1.0, "mfu": None, "ours_over_theirs": 1.0}]}])
    gpu_run.variants(run)
    (argv,) = seen
    chosen = [argv[i + 1] for i, a in enumerate(argv) if a == "--variant"]
    flags = [gpu_run.KERNELS[k] for k in failed]
    assert chosen == [v for v in gpu_run.VARIANTS if not any(f in v for f in flags)]
    assert 0 < len(chosen) < len(gpu_run.VARIANTS)  # the kernels' variant left out, the others timed


def test_a_failing_stage_is_logged_and_the_run_goes_on(tmp_path, monkeypatch):
    def broken(run):
        raise RuntimeError("no GPU here")

    monkeypatch.setattr(gpu_run, "variants", broken)
    out = tmp_path / "gpu"
    assert gpu_run.main(["--out", str(out), "--quick", "--stages", "variants,combined", "--cache",
                         str(tmp_path / "cache")]) == 0
    summary = (out / "summary.md").read_text()
    assert "## variants: failed (log.txt has the traceback)" in summary
    assert "## Combined: 0 variant(s) beat the default" in summary


@pytest.mark.parametrize("stage", ["numerics", "trainer"])
def test_a_child_process_that_fails_reads_as_a_failed_stage(tmp_path, monkeypatch, stage):
    """The numerics and trainer stages run a child process; one that exits non-zero (pytest that could
    not start, a trainer that crashed) heads the summary as a failed stage does, not as a table."""
    import subprocess
    import types

    def crashed(cmds, env, timeout):
        return [subprocess.CompletedProcess(cmd, 3, stdout="", stderr="ImportError: no module named x\n")
                for cmd in cmds]

    monkeypatch.setattr(gpu_run, "children", crashed)
    run = gpu_run.Run(tmp_path / "gpu", 100, quick=True,
                      args=types.SimpleNamespace(pytest_k="", costs={}, numerics_workers=4))
    assert run.stage(stage, getattr(gpu_run, stage), run)["returncode"] == 3
    summary = (tmp_path / "gpu" / "summary.md").read_text()
    assert re.search(rf"^## {stage}: failed \(exit status 3\)", summary, re.M), summary
    assert "ImportError" in (tmp_path / "gpu" / f"{stage}.txt").read_text()


def test_a_child_process_out_of_time_is_killed_and_its_output_kept():
    """A stage's child (the numerics' pytest) that outlives its share of the budget is killed; what it
    printed before is kept for its log (an H200 run lost the numerics' output this way)."""
    import os
    import sys

    p = gpu_run.child([sys.executable, "-c", "print('3 passed so far', flush=True); import time; time.sleep(60)"],
                      dict(os.environ), timeout=3)
    assert p.returncode == 124 and p.stdout.startswith("3 passed so far") and "timed out after 3 s" in p.stdout


def test_children_run_at_once():
    """Each child waits for the other's file: one after the other, the first would wait out the timeout."""
    import os
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        wait = ("import pathlib, sys, time; d = pathlib.Path(sys.argv[1]); (d / sys.argv[2]).touch()\n"
                "while not (d / sys.argv[3]).exists(): time.sleep(0.05)\nprint('met', sys.argv[2])")
        cmds = [[sys.executable, "-c", wait, tmp, "a", "b"], [sys.executable, "-c", wait, tmp, "b", "a"]]
        a, b = gpu_run.children(cmds, dict(os.environ), timeout=60)
    assert (a.returncode, a.stdout, b.returncode, b.stdout) == (0, "met a\n", 0, "met b\n")


def test_the_numerics_tests_are_dealt_to_processes_at_once(tmp_path, monkeypatch):
    """The numerics stage lists the GPU tests, deals them in turn to ``--numerics_workers`` pytest
    processes started together, and heads its table with every process's last line, the tests' own
    error lines, failures and the slowest tests."""
    import subprocess
    import types

    ids = [f"tests/gpu/test_gpu_numerics.py::test_{i}" for i in range(5)]
    calls = []

    def tests_of(cmd):
        return [x for x in cmd if x.startswith("tests/gpu/")]

    def fake(cmds, env, timeout):
        calls.append(cmds)
        if "--collect-only" in cmds[0]:
            return [subprocess.CompletedProcess(cmds[0], 0, stdout="\n".join(ids) + "\n\n5 tests collected", stderr="")]
        # the first process passes its first test and ends; the second fails its first, then is killed
        return [subprocess.CompletedProcess(
            cmd, 124 * i, stdout=f"x: 0.0{i} relative\n{i + 1}.50s call {tests_of(cmd)[0]}\n"
            + (f"FAILED {tests_of(cmd)[0]} - AssertionError\n" if i else f"PASSED {tests_of(cmd)[0]}\n")
            + f"{i} failed", stderr="") for i, cmd in enumerate(cmds)]

    monkeypatch.setattr(gpu_run, "children", fake)
    run = gpu_run.Run(tmp_path / "gpu", 100, quick=True,
                      args=types.SimpleNamespace(pytest_k="", costs={}, numerics_workers=2))
    r = gpu_run.numerics(run)
    assert [tests_of(cmd) for cmd in calls[1]] == [ids[0::2], ids[1::2]]
    assert r["returncode"] == 124 and r["tail"] == "0 failed | 1 failed"
    assert r["lines"] == ["x: 0.00 relative", "x: 0.01 relative", f"FAILED {ids[1]} - AssertionError"]
    assert r["slowest"] == [f"2.50s call {ids[1]}", f"1.50s call {ids[0]}"]
    # the first process ended: its tests not named passed or failed were skipped; the second was killed
    assert r["tests"] == {ids[0]: "passed", ids[1]: "failed", ids[2]: "skipped", ids[3]: "not finished",
                          ids[4]: "skipped"}
    summary = (tmp_path / "gpu" / "summary.md").read_text()
    assert "5 tests in 2 processes at once; exit status 124" in summary
    assert "===== worker 1: 2 tests =====" in (tmp_path / "gpu" / "numerics.txt").read_text()


@pytest.mark.parametrize("flags,accepted", [("--xla_gpu_autotune_level=0", True), ("--xla_no_such_option=1", False)])
def test_the_numerics_children_get_the_xla_options_jax_starts_with(tmp_path, monkeypatch, flags, accepted):
    """The numerics' pytest children run with ``--numerics_xla_flags`` added to XLA_FLAGS when a JAX
    started with them (a real child process) does; an option XLA does not know, which would abort every
    child, is left out and said."""
    import os
    import subprocess
    import types

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert gpu_run.xla_flags_accepted(flags, dict(os.environ)) is accepted
    envs = []

    def fake(cmds, env, timeout):
        envs.append(env["XLA_FLAGS"])
        return [subprocess.CompletedProcess(cmd, 0, stdout="tests/gpu/t.py::test_a\n1 passed", stderr="")
                for cmd in cmds]

    monkeypatch.setattr(gpu_run, "xla_flags_accepted", lambda f, env: accepted)
    monkeypatch.setattr(gpu_run, "children", fake)
    run = gpu_run.Run(tmp_path / "gpu", 100, quick=True, args=types.SimpleNamespace(
        pytest_k="", costs={}, numerics_workers=1, numerics_xla_flags=flags))
    gpu_run.numerics(run)
    expected = "--xla_force_host_platform_device_count=8" + (f" {flags}" if accepted else "")
    assert envs == [expected, expected]  # the listing and the tests
    assert (f"XLA options `{flags}` left out" in (tmp_path / "gpu" / "summary.md").read_text()) is not accepted


def test_the_outcome_gathers_each_test_function_and_each_variant(tmp_path):
    """The summary's last section: the GPU tests' outcomes by test function (a test a killed process
    never finished counts as such) and each variant's step against the default's."""
    import types

    run = gpu_run.Run(tmp_path / "gpu", 100, quick=True, args=types.SimpleNamespace())
    run.results["numerics"] = {"tests": {"tests/gpu/t.py::test_step[bert]": "passed",
                                         "tests/gpu/t.py::test_step[modernbert]": "failed",
                                         "tests/gpu/t.py::test_twice": "not finished"}}
    run.results["variants"] = {"implementations": [{"name": n, "step_time_median_s": t} for n, t in
                                                   [("ours", 0.100), ("ours --a", 0.090), ("ours --b", 0.101),
                                                    ("ours --c", 0.110), ("hf-torch", 0.150)]]}
    assert gpu_run.outcome(run).splitlines() == [
        "## What this run decides", "- test_step: 1 failed, 1 passed", "- test_twice: 1 not finished",
        "- `--a`: -10.0% a step against the default (faster)",
        "- `--b`: +1.0% a step against the default (within 3%)",
        "- `--c`: +10.0% a step against the default (slower)"]


def test_the_fastest_flags_come_from_this_runs_variants_or_from_the_command_line(tmp_path):
    """The sizes, torch_compile and profile_after stages run the fastest flags: the recipe-keeping
    variant that beat the default by over 3%, or, when the variants ran in an earlier call,
    ``--fastest`` ('' for the default)."""
    import types

    def timed(ms):
        return [{"name": n, "step_time_median_s": t / 1e3} for n, t in ms.items()]

    run = gpu_run.Run(tmp_path / "gpu", 100, quick=True, args=types.SimpleNamespace(fastest=None))
    run.results["variants"] = {"implementations": timed({"ours": 60, "ours --rng_impl rbg": 59,
                                                         "ours --attention_dropout 0": 50, "ours --x y": 55})}
    assert gpu_run.fastest_flags(run) == ["--x", "y"]  # rbg within the margin; the recipe change never
    run.args.fastest = "--attention_impl flash --norm_impl fused"
    assert gpu_run.fastest_flags(run) == ["--attention_impl", "flash", "--norm_impl", "fused"]
    run.args.fastest = ""
    assert gpu_run.fastest_flags(run) == []


def test_a_stage_the_budget_cannot_cover_is_skipped(tmp_path):
    out = tmp_path / "gpu"
    gpu_run.main(["--out", str(out), "--stages", "sizes", "--budget_s", "10", "--cache", str(tmp_path / "c")])
    assert "## sizes: skipped" in (out / "summary.md").read_text()


@pytest.mark.parametrize("argv,message", [
    (["--stages", "profile,variants"],
     "--stages profile: expected a comma list of numerics, variants, profile_before, sizes"),
    (["--sizes", "bert-huge"], "--sizes bert-huge: expected a comma list of bert-base-512"),
    (["--cost", "sizes"], "--cost sizes: expected STAGE=SECONDS"),
    (["--numerics_workers", "0"], "--numerics_workers 0: expected 1 or more")])
def test_bad_arguments_are_one_line(tmp_path, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_run.main(["--out", str(tmp_path / "gpu"), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "gpu").exists()


@pytest.mark.slow  # ~30 s: every stage on tiny shapes, in a child process
def test_every_stage_runs_where_tensorflow_is_absent(tmp_path):
    """The bare GPU machine has no TensorFlow (tests/fixtures/no_tensorflow hides it here): no stage may
    need it, the numerics stage's pytest child included. PyTorch's stages run where torch is installed."""
    import importlib.util
    import subprocess
    import sys

    from tests.fixtures.no_tensorflow import environment

    stages = [s for s in gpu_run.COST if importlib.util.find_spec("torch") or s not in ("variants", "torch_compile")]
    r = subprocess.run([sys.executable, "tests/gpu/run.py", "--out", str(tmp_path / "gpu"), "--quick", "--stages",
                        ",".join(stages), "--budget_s", "600", "--cache", str(tmp_path / "cache")],
                       cwd=gpu_run.ROOT, env=environment(), capture_output=True, text=True, timeout=900)
    summary = (tmp_path / "gpu" / "summary.md").read_text()
    assert r.returncode == 0 and not re.search(r"^## .*: (failed|skipped)", summary, re.M), (summary, r.stderr[-3000:])
    results = {(row := json.loads(line))["stage"]: row["result"]
               for line in (tmp_path / "gpu" / "results.jsonl").read_text().splitlines()}
    assert list(results) == stages
    assert results["numerics"]["returncode"] == 0, (tmp_path / "gpu" / "numerics.txt").read_text()[-3000:]
    assert results["trainer"]["returncode"] == 0 and results["trainer"]["checkpoints"] == [10, 20], \
        (tmp_path / "gpu" / "trainer.txt").read_text()[-3000:]
    assert results["trainer"]["eval"]["step"] == 20 and results["trainer"]["train"]["step"] == 20

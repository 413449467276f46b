r"""``python tests/gpu/run.py --out DIR``: one GPU's measurements in one run, its tables in DIR.

Made for a bare GPU machine with JAX (CUDA), Flax, Optax, Orbax, PyTorch and transformers but no
TensorFlow: everything here runs the training step on synthetic batches. In order of what a run must
show first, each stage skipped when what is left of ``--budget_s`` would not cover it, each failure
logged and passed over:

1. ``numerics``: ``pytest tests/gpu`` in child processes at once (``--numerics_workers``, the tests
   dealt out in turn) that neither preallocate nor autotune the matrix products
   (``--numerics_xla_flags``): the GPU against the CPU's float32 step; cuDNN and the flash kernel
   against XLA. Killed, their output kept, when the budget runs out; a test running over 90 s prints
   its stacks.
2. ``variants``: the default step of BERT-base at 128 tokens, batch 256, bfloat16, beside its variants
   (``--variant``: GELU through erfc, as before it went through erf; the global norms one reduction a
   parameter, as before they were grouped; XLA's RngBitGenerator for dropout's bits; the Pallas flash
   attention with the fused residual-dropout-LayerNorm kernel) and Hugging Face's PyTorch BERT in
   bfloat16, taking turns (`bert_jax.benchmark.peers`); the Pallas kernels run once in a child process
   first, and a kernel that fails leaves out the variants that ask for it.
3. ``profile_before``: the default step (compiled by the variants stage: cached) traced and reduced to
   a table (`bert_jax.benchmark.profile`), beside the same program's kernels at the card's roofline
   (`bert_jax.benchmark.roofline`: what the AOT tool predicts without a GPU) and the kernels furthest
   over it.
4. ``sizes``: BERT-base at 512 (batch 32), BERT-large at 512 (batch 16), ModernBERT-base at 1,024
   (batch 16), each once: with the fastest flags (a variant that beat the default by over 3%), else
   the default; the next size only while 45 s of the budget are left.
5. ``trainer``: ``train.py`` itself on synthetic batches (the tiny model, 20 steps, evaluated and
   checkpointed) in a child process: the trainer runs on this GPU without TensorFlow.
6. ``attention_kernels``: attention alone, forward and backward, at BERT-base's and ModernBERT's shapes:
   the flash kernel's tilings, with and without its dropout, against XLA's explicit path and cuDNN,
   each beside its roofline (tests/gpu/attention_kernels.py).
7. ``norm_kernels``: the residual add, dropout and LayerNorm alone, forward and backward, at BERT-base's
   and BERT-large's shapes: the fused kernel's tilings, and its default without dropout, against XLA,
   each beside its roofline
   (tests/gpu/norm_kernels.py).
8. ``torch_compile``: the fastest step against Hugging Face's under ``torch.compile``.
9. ``combined``: the variants that beat the default by more than 3% together, against the default.
10. ``profile_after``: the fastest step traced and reduced like the default.

DIR gets ``summary.md`` (the tables, then what the run decides: the GPU tests' outcomes by test
function, each variant against the default), ``results.jsonl`` (every result), ``log.txt``,
``numerics.txt``, ``trainer.txt`` and ``profile_before.tar.gz`` / ``profile_after.tar.gz`` (trace, HLO
and metadata: ``tar xzf`` and ``python -m bert_jax.benchmark.profile`` reduce them again). ``--quick``
runs the same stages on tiny shapes (a dry run on a CPU).

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.55 python tests/gpu/run.py --out /tmp/gpu --budget_s 480

(the fraction leaves the numerics stage's child process and PyTorch the rest of the GPU's memory)

(from the checkout's root, with bert_jax importable: installed, or the root on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout's root: bert_jax, input_pipeline, tests/gpu

# The variants timed beside the default step: each a change a GPU default could make, or the before of
# one the GPU has not timed (docs/records.md): the default's GELU before it went through erf ("GELU
# through erf on a GPU"); the global norms one reduction a parameter, before they were grouped ("The
# global norms in grouped reductions"); each unrolled block with its own parameters, before they were
# sliced from the stack ("Unrolled blocks over stacked parameters"); the Pallas flash attention
# with the fused residual-dropout-LayerNorm kernel ("Flash attention with dropout for GPUs", "Residual,
# dropout and LayerNorm in one kernel"). Each unrolled variant compiles for ~35 s.
# Timed on an H200 and not again: the flash attention alone (9% faster), cuDNN's layer norm (7%: a
# compiler option, `--config.xla_options`, not a default), docs/records.md "BERT-base's step on one H200 after the
# embedding fix"; --dropout_impl fused (4% slower), --xla_option xla_gpu_enable_triton_gemm=false (nothing
# on top of unrolled layers), --scan (9% slower: why the default is unrolled), --attention_dropout 0 (10%
# faster, but a change of the recipe), "The GPU's defaults". Not yet, for time: --recompute_activation
# false (the default chosen from the compiler's program: "GELU recomputed in the backward"); --rng_impl rbg
# (XLA's RngBitGenerator for the XLA path's dropout bits: 2% slower on an H100, "A training step on one
# H100", and --rng_impl unsafe_rbg within the noise on the H200).
# The last: the same with XLA's dot merger off; JAX 0.11's compiler merges the key's and value's products
# into one and copies both halves out for the flash kernel ("The GPU's programs under JAX 0.11.2").
VARIANTS = ("--gelu_impl erfc", "--global_norm per_leaf", "--stacked_params false",
            "--attention_impl flash --norm_impl fused",
            "--attention_impl flash --norm_impl fused --xla_option xla_gpu_dot_merger_threshold_mb=0")
# Variants that change what is computed (the recipe), not how: timed for the record, never combined.
RECIPE_CHANGES = ("--attention_dropout",)
ONE = ["--mesh", "1,1,1"]  # one device: the run measures one GPU
BASE = ["--size", "base", "--seq_len", "128", "--batch_size", "256", "--dtype", "bfloat16", *ONE]
SIZES = {  # the sizes stage: (name, flags)
    "bert-base-512": ["--size", "base", "--seq_len", "512", "--batch_size", "32", "--dtype", "bfloat16", *ONE],
    "bert-large-512": ["--size", "large", "--seq_len", "512", "--batch_size", "16", "--dtype", "bfloat16", *ONE],
    "modernbert-base-1024": ["--model", "modernbert", "--size", "base", "--seq_len", "1024", "--batch_size", "16",
                             "--dtype", "bfloat16", *ONE],
}
QUICK = ["--size", "tiny", "--seq_len", "32", "--batch_size", "4", "--vocab_size", "512", "--dtype", "bfloat16", *ONE]
# Seconds each stage is expected to take on one H100/H200 (compiles dominate); a stage starts only if
# what is left of the budget covers it.
# The sizes stage starts with one size's worth and measures each next size while 45 s are left.
# The numerics, never passed on a GPU yet, come first: in one process they ran past 253 s on an H200
# (docs/records.md, "BERT-base's step on one H200 after the embedding fix"), and they are given 180 s in
# four (what is left of them then is killed, what they printed kept: which tests passed, the slowest).
COST = {"numerics": 180, "variants": 330, "profile_before": 25, "sizes": 60, "trainer": 45, "attention_kernels": 70,
        "norm_kernels": 50, "torch_compile": 100, "combined": 60, "profile_after": 40}
MARGIN = 0.03  # a variant counts as faster beyond this share of the default's step (turns differ by ~1-2%)


class Run:
    """The output folder, the log, the budget and the results of one run."""

    def __init__(self, out: Path, budget_s: float, quick: bool, args=None):
        self.out, self.budget_s, self.quick, self.start = out, budget_s, quick, time.monotonic()
        self.args = args
        out.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, object] = {}
        self.summary: list[str] = []

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def cost(self, name: str) -> float:
        """The seconds stage ``name`` is expected to take (``--cost``, else `COST`; 5 for ``--quick``)."""
        return 5 if self.quick else self.args.costs.get(name, COST[name])

    def stage(self, name: str, fn, *args):
        """Runs ``fn(*args)`` if the budget allows; a failure is logged, not raised."""
        cost = self.cost(name)
        if self.left() < cost:
            self.note(f"## {name}: skipped ({self.left():.0f} s left of the budget, ~{cost} s needed)")
            return None
        print(f"\n===== {name} ({self.left():.0f} s left) =====", flush=True)
        t = time.monotonic()
        try:
            result = fn(*args)
        except Exception:  # noqa: BLE001 - one stage's failure must not cost the others
            traceback.print_exc()
            self.note(f"## {name}: failed (log.txt has the traceback)")
            return None
        print(f"===== {name} done in {time.monotonic() - t:.0f} s =====", flush=True)
        self.results[name] = result
        with open(self.out / "results.jsonl", "a") as f:
            f.write(json.dumps({"stage": name, "seconds": round(time.monotonic() - t, 1), "result": result},
                               default=str) + "\n")
        return result

    @staticmethod
    def title(name: str, heading: str, returncode: int) -> str:
        """A child process's heading: a failed child's reads like a failed stage's."""
        return f"## {heading}" if returncode == 0 else f"## {name}: failed (exit status {returncode}): {heading}"

    def note(self, text: str) -> None:
        print(text, flush=True)
        self.summary.append(text)
        (self.out / "summary.md").write_text("\n\n".join(self.summary) + "\n")


def shapes(run: Run, flags: list[str]) -> list[str]:
    return QUICK if run.quick else flags


def timing(run: Run) -> list[str]:
    return ["--steps", "4", "--warmup", "1", "--compare_block", "2"] if run.quick else \
        ["--steps", "20", "--warmup", "3", "--compare_block", "5"]


def children(cmds: list[list[str]], env: dict, timeout: float) -> list[subprocess.CompletedProcess]:
    """Each of ``cmds`` run at once, to its end or until ``timeout``; one that ran out of time is killed
    and returns 124 (as timeout(1) does) with what it had printed, so its log is kept."""
    import tempfile

    deadline, done = time.monotonic() + timeout, []
    with tempfile.TemporaryDirectory(prefix="bert_jax_gpu_child_") as tmp:
        logs = [(Path(tmp) / f"{i}.out", Path(tmp) / f"{i}.err") for i in range(len(cmds))]
        procs = []
        for cmd, (out, err) in zip(cmds, logs, strict=True):
            with open(out, "w") as o, open(err, "w") as e:  # the child holds its own copies
                procs.append(subprocess.Popen(cmd, env=env, stdout=o, stderr=e, cwd=ROOT))
        for cmd, proc, (out, err) in zip(cmds, procs, logs, strict=True):
            try:
                status, killed = proc.wait(timeout=max(deadline - time.monotonic(), 0.1)), ""
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status, killed = 124, f"\n(killed: timed out after {timeout:.0f} s)"
            done.append(subprocess.CompletedProcess(cmd, status, stdout=out.read_text(errors="replace") + killed,
                                                    stderr=err.read_text(errors="replace")))
    return done


def child(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` run to its end or ``timeout`` (`children`)."""
    return children([cmd], env, timeout)[0]


# pytest children at once in the numerics stage: it is some 45 small programs compiled for the GPU (the
# host's CPUs, not the GPU, are its time), which one process compiles one after another.
NUMERICS_WORKERS = 4
# A test running longer than this has its threads' stacks printed (pytest's faulthandler): where a
# stage that ran out of time stood.
NUMERICS_STACKS_AFTER_S = 90
PYTEST = ["-m", "pytest", "-p", "no:cacheprovider"]
# XLA options of the numerics' children: no autotuning of the matrix products. The tests compile ~45 small
# programs, and XLA's GEMM autotuner compiles and times dozens of Triton tilings of each product (minutes for
# a program of a dozen fusions: openxla/xla#13108) where only the arithmetic is under test; the kernels
# under test (cuDNN's attention, the Pallas ones) are not autotuned either way. An option this XLA does not
# know would abort every child: each is tried in a child first and left out if it fails.
NUMERICS_XLA_FLAGS = "--xla_gpu_autotune_level=0"


def xla_flags_accepted(flags: str, env: dict) -> bool:
    """Whether JAX starts with ``flags`` added to ``XLA_FLAGS`` (an unknown one aborts the process)."""
    probe = child([sys.executable, "-c", "import jax; jax.devices()"], with_xla_flags(env, flags), 120)
    return probe.returncode == 0


def with_xla_flags(env: dict, flags: str) -> dict:
    return {**env, "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {flags}".strip()}


def numerics(run: Run) -> dict:
    """pytest tests/gpu in ``--numerics_workers`` child processes at once (the tests dealt out in turn),
    each allocating as it goes: the GPU's memory this process's JAX has not taken
    (``XLA_PYTHON_CLIENT_MEM_FRACTION``), once PyTorch has let its cache go."""
    if "torch" in sys.modules:  # the variants stage's Hugging Face model ran here
        sys.modules["torch"].cuda.empty_cache()
    env = {**os.environ, "BERT_JAX_GPU_TESTS": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "BERT_JAX_TEST_CACHE": ""}
    flags = getattr(run.args, "numerics_xla_flags", "")
    if flags and not xla_flags_accepted(flags, env):
        run.note(f"## numerics: XLA options `{flags}` left out (JAX would not start with them)")
    elif flags:
        env = with_xla_flags(env, flags)
    select = ["-k", run.args.pytest_k] if run.args.pytest_k else []
    listed = child([sys.executable, *PYTEST, "tests/gpu", "--collect-only", "-q", *select], env, 120)
    ids = [x for x in listed.stdout.splitlines() if x.startswith("tests/gpu/") and "::" in x]
    if not ids:
        (run.out / "numerics.txt").write_text(listed.stdout + listed.stderr)
        status = listed.returncode or 5  # pytest's "no tests collected"
        run.note(f"{run.title('numerics', 'The GPU against the CPU (pytest tests/gpu)', status)}\n\n"
                 f"no tests collected: {(listed.stdout + listed.stderr).strip().splitlines()[-1:]}")
        return {"returncode": status, "tail": "no tests collected", "lines": [], "slowest": []}
    groups = [ids[i::run.args.numerics_workers] for i in range(min(run.args.numerics_workers, len(ids)))]
    options = ["-q", "-s", "-rA", "--durations=0", "-o", f"faulthandler_timeout={NUMERICS_STACKS_AFTER_S}"]
    timeout = max(min(run.left() - 60, run.cost("numerics")), 60)  # the stages after it keep their share
    done = children([[sys.executable, *PYTEST, *group, *options] for group in groups], env, timeout)
    (run.out / "numerics.txt").write_text("".join(f"===== worker {i}: {len(g)} tests =====\n{p.stdout}{p.stderr}\n"
                                                  for i, (g, p) in enumerate(zip(groups, done, strict=True))))
    status = next((p.returncode for p in done if p.returncode), 0)
    tails = [(p.stdout.strip().splitlines() or [""])[-1] for p in done]
    out = [x for p in done for x in p.stdout.splitlines()]
    lines = [x for x in out if "relative" in x or x.startswith(("FAILED ", "ERROR "))]
    slowest = sorted((x for x in out if re.match(r"^\d+\.\d+s (call|setup|teardown) ", x)),
                     key=lambda x: -float(x.split("s ", 1)[0]))[:8]
    run.note(f"{run.title('numerics', 'The GPU against the CPU (pytest tests/gpu)', status)}\n\n"
             f"{len(ids)} tests in {len(groups)} processes at once; exit status {status}: {' | '.join(tails)}\n\n"
             + "\n".join(f"    {x}" for x in lines) + "\n\nslowest:\n\n" + "\n".join(f"    {x}" for x in slowest))
    said = {m[2]: m[1].lower() for m in (re.match(r"^(PASSED|FAILED|ERROR) (\S+)", x) for x in out) if m}
    ended = {i for g, p in zip(groups, done, strict=True) if p.returncode in (0, 1) for i in g}  # pytest's end
    # -rA names each passed, failed and erred test at the end; skipped ones it counts by reason
    return {"returncode": status, "tail": " | ".join(tails), "lines": lines, "slowest": slowest,
            "tests": {i: said.get(i, "skipped" if i in ended else "not finished") for i in ids}}


def outcome(run: Run) -> str:
    """What the run decides, in one place: each GPU test's outcome by test function, and each variant's
    step against the default's (faster beyond ``MARGIN``: a candidate default)."""
    lines = ["## What this run decides"]
    tests = (run.results.get("numerics") or {}).get("tests", {})
    by_function = collections.defaultdict(collections.Counter)
    for test_id, result in tests.items():
        by_function[test_id.split("::")[-1].split("[")[0]][result] += 1
    lines += [f"- {name}: " + ", ".join(f"{n} {result}" for result, n in sorted(counts.items()))
              for name, counts in by_function.items()] or ["- the GPU tests: not run"]
    times = {x["name"]: x["step_time_median_s"] for x in (run.results.get("variants") or {}).get("implementations", [])}
    for name, t in times.items():
        if name.startswith("ours ") and "ours" in times:
            change = t / times["ours"] - 1
            verdict = "faster" if change < -MARGIN else "slower" if change > MARGIN else f"within {MARGIN:.0%}"
            flags = name.removeprefix("ours ")
            lines.append(f"- `{flags}`: {100 * change:+.1f}% a step against the default ({verdict})")
    return "\n".join(lines)


def attention_kernels(run: Run) -> list[dict]:
    """Attention alone, forward and backward: the flash kernel's tilings and dropout against XLA's
    explicit path and cuDNN, each beside its roofline (tests/gpu/attention_kernels.py)."""
    from tests.gpu.attention_kernels import table

    if not flash_runs(run):  # most of the stage is the flash kernel, which would take the process down
        run.note("## Attention alone: skipped (the flash kernel's probe failed)")
        return []
    text, rows = table(run.quick)
    run.note("## Attention alone (forward + backward; flash block/warps)\n\n" + text)
    return rows


def norm_kernels(run: Run) -> list[dict]:
    """The residual add, dropout and LayerNorm alone, forward and backward: the fused kernel's tilings
    against XLA, each beside its roofline (tests/gpu/norm_kernels.py)."""
    from tests.gpu.norm_kernels import table

    if "norm" not in kernels_run(run):  # the kernel would take the process down
        run.note("## Residual, dropout and LayerNorm alone: skipped (the fused norm's probe failed)")
        return []
    text, rows = table(run.quick)
    run.note("## Residual, dropout and LayerNorm alone (forward + backward; fused rows/warps)\n\n" + text)
    return rows


def environment(run: Run) -> dict:
    import jax

    info = {"devices": [str(d) for d in jax.devices()], "device_kind": jax.devices()[0].device_kind,
            "jax": jax.__version__, "python": sys.version.split()[0]}
    for name in ("jaxlib", "flax", "optax", "orbax.checkpoint", "torch", "transformers"):
        with contextlib.suppress(Exception):
            info[name] = __import__(name, fromlist=["_"]).__version__
    with contextlib.suppress(Exception):
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm,driver_version",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=20).stdout.strip()
    run.note("## Machine\n\n" + "\n".join(f"- {k}: {v}" for k, v in info.items()))
    return info


def bench(argv: list[str]) -> list[dict]:
    from bert_jax.benchmark import step

    return step.main(argv)


def profiled(run: Run, name: str, extra: list[str]) -> dict:
    """The step (with ``extra`` flags) traced and reduced; the trace, HLO and metadata tarred."""
    from bert_jax.benchmark import profile

    where = run.out / name
    steps = ["--steps", "3", "--warmup", "1"] if run.quick else ["--steps", "10", "--warmup", "3"]
    (r,) = bench([*shapes(run, BASE), *steps, *extra, "--profile", str(where), "--profile_steps", "3"])
    table = profile.reduce_profile(where)
    per_kernel = table.pop("per_kernel")  # results.jsonl keeps the rows
    waited = r["step_time_waited_median_s"] * 1e3
    run.note(f"## Where the time goes: {name} ({' '.join(extra) or 'the defaults'})\n\n"
             f"step {r['step_time_median_s'] * 1e3:.1f} ms as the trainer runs it, MFU {100 * r['mfu']:.1f}% "
             f"(each step waited for before the next: {waited:.1f} ms)\n\n" + profile.markdown(table)
             + "\n\n" + least_time(where / profile.HLO_FILE, per_kernel))
    with tarfile.open(run.out / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(where, arcname=name)
    import shutil

    shutil.rmtree(where)
    return {"step": {k: r[k] for k in ("step_time_median_s", "step_time_waited_median_s", "mfu", "tokens_per_s")},
            "table": table}


def least_time(hlo: Path, per_kernel: dict) -> str:
    """The same program's kernels at this card's roofline (bert_jax/benchmark/roofline.py), the rows
    of the measured table: what `python -m bert_jax.benchmark.aot estimate` predicts without a GPU;
    then the measured kernels furthest over theirs (``per_kernel``: the profile's {name: (ms, runs)})."""
    import jax

    from bert_jax.benchmark import aot, roofline

    kind = jax.devices()[0].device_kind
    chip = aot.gpu_chip(kind)
    if chip is None or not hlo.is_file():
        return f"(no roofline: {kind} is not in bert_jax.benchmark.aot.CHIPS, or no HLO was written)"
    try:
        ks = roofline.kernels(hlo.read_text())
    except ValueError as e:  # a loop in the program
        return f"(no roofline: {e})"
    t = roofline.table(ks, chip.peak_bf16, chip.hbm_bandwidth)
    over = roofline.furthest(per_kernel, ks, chip.peak_bf16, chip.hbm_bandwidth)
    return (f"The same program at the {chip.name}'s roofline (the least time of each kernel):\n\n"
            + roofline.markdown(t) + "\n\nThe kernels furthest over their least time (arithmetic, layout or "
            "launches: the roofline counts bytes and matrix products only):\n\n" + roofline.furthest_markdown(over))


def compare_table(r: dict) -> str:
    rows = ["| step | median ms | tokens/s | MFU | ours / this |", "|---|---|---|---|---|"]
    for x in r["implementations"]:
        mfu = "-" if x["mfu"] is None else f"{100 * x['mfu']:.1f}%"
        rows.append(f"| {x['name']} | {x['step_time_median_s'] * 1e3:.1f} | {x['tokens_per_s']:,.0f} | {mfu} | "
                    f"{x['ours_over_theirs']:.2f} |")
    rows += [f"| ours {name} | failed: {why} | | | |" for name, why in r.get("failed", {}).items()]
    return "\n".join(rows)


# The Pallas kernels forward and backward once, in a child process: a kernel that crashed the process
# would end the variants stage, and with it the default's timing and Hugging Face's. Each prints its
# line when it has run, so a crash in the second leaves the first's line.
KERNEL_PROBE = """import jax, jax.numpy as jnp
from bert_jax.model import flash, fused_norm
q, ids = jnp.ones((2, 128, 2, 64), jnp.bfloat16), jnp.ones((2, 128), jnp.int32)
f = lambda q: flash.flash_attention(q, q, q, ids, key=jax.random.key(0), rate=0.1).astype(jnp.float32).sum()
print("flash finite:", bool(jnp.isfinite(jax.grad(f)(q).astype(jnp.float32)).all()), flush=True)
x, s = jnp.ones((2, 128, 768), jnp.bfloat16), jnp.ones((768,))
g = lambda x: fused_norm.add_dropout_norm(x, x, s, s, a_bias=s, eps=1e-12, key=jax.random.key(0),
                                          rate=0.1).sum(dtype=jnp.float32)
print("norm finite:", bool(jnp.isfinite(jax.grad(g)(x).astype(jnp.float32)).all()), flush=True)
"""
KERNELS = {"flash": "--attention_impl flash", "norm": "--norm_impl fused"}  # a probed kernel: the flag that asks for it


def kernels_run(run: Run) -> set[str]:
    """Which Pallas kernels (`KERNELS`) run on this GPU (all of them off a GPU: there they are
    interpreted); probed once a run."""
    import jax

    if "kernels_run" in run.results:
        return run.results["kernels_run"]
    if jax.devices()[0].platform != "gpu":
        run.results["kernels_run"] = set(KERNELS)
        return run.results["kernels_run"]
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    p = child([sys.executable, "-c", KERNEL_PROBE], env, 180)
    out, status = p.stdout + p.stderr, p.returncode
    ok = {name for name in KERNELS if f"{name} finite: True" in out}
    if ok != set(KERNELS):
        run.note(f"## The Pallas kernels' probe (exit status {status}): {sorted(set(KERNELS) - ok)} failed, their "
                 "variants are left out\n\n" + "\n".join(f"    {x}" for x in out.strip().splitlines()[-8:]))
    run.results["kernels_run"] = ok
    return ok


def flash_runs(run: Run) -> bool:
    return "flash" in kernels_run(run)


def variants(run: Run) -> dict:
    argv = [*shapes(run, BASE), *timing(run), "--compare", "hf-torch"]
    chosen = run.args.variant or VARIANTS
    if any(flag in v for v in chosen for flag in KERNELS.values()):
        ok = kernels_run(run)
        chosen = [v for v in chosen if not any(KERNELS[k] in v for k in set(KERNELS) - ok)]
    for v in chosen:
        argv += ["--variant", v]
    (r,) = bench(argv)
    run.note(f"## The default step, its variants and Hugging Face's (one run, taking turns)\n\n{compare_table(r)}")
    return r


def fastest_flags(run: Run) -> list[str]:
    """``--fastest`` where given (the variants timed by an earlier run); else the flags of the combined
    step if it was measured faster, else of the fastest variant that keeps the recipe and beats the
    default by more than ``MARGIN``, else none."""
    if getattr(run.args, "fastest", None) is not None:
        return run.args.fastest.split()
    combined = run.results.get("combined")
    if combined:
        ours = {x["name"]: x["step_time_median_s"] for x in combined["implementations"] if x["name"].startswith("ours")}
        best = min(ours, key=ours.get)
        return best.removeprefix("ours").split()
    flags = keeper_variants(run, margin=MARGIN)[:1]
    return flags[0].split() if flags else []


def keeper_variants(run: Run, margin: float) -> list[str]:
    """The recipe-keeping variants faster than the default by more than ``margin``, fastest first."""
    r = run.results.get("variants")
    if not r:
        return []
    times = {x["name"]: x["step_time_median_s"] for x in r["implementations"]}
    base = times["ours"]
    faster = [(t, name.removeprefix("ours ")) for name, t in times.items()
              if name.startswith("ours ") and t < (1 - margin) * base]
    return [v for _, v in sorted(faster) if not v.startswith(RECIPE_CHANGES)]


def combined(run: Run) -> dict | None:
    keep = keeper_variants(run, margin=MARGIN)
    if len(keep) < 2:
        run.note(f"## Combined: {len(keep)} variant(s) beat the default by more than {MARGIN:.0%}; nothing to combine")
        return None
    (r,) = bench([*shapes(run, BASE), *timing(run), "--variant", " ".join(keep)])
    run.note(f"## The faster variants together, against the default\n\n{compare_table(r)}")
    return r


def sizes(run: Run) -> dict:
    flags, out = fastest_flags(run), {}
    items = {"quick": QUICK}.items() if run.quick else [(n, SIZES[n]) for n in run.args.sizes.split(",") if n]
    rows = ["| model | step | median ms | tokens/s | MFU | memory GiB |", "|---|---|---|---|---|---|"]
    for name, shape in items:
        if not run.quick and run.left() < 45:
            rows.append(f"| {name} | skipped: {run.left():.0f} s left of the budget | | | | |")
            continue
        argv = [*shape, *timing(run), *flags]
        try:
            (r,) = bench(argv)
        except Exception:  # noqa: BLE001 - the next size may still fit
            traceback.print_exc()
            rows.append(f"| {name} | failed | | | | |")
            continue
        out[name] = r
        impls = r["implementations"] if r["mode"] == "compare" else [{**r, "name": " ".join(["ours", *flags])}]
        for x in impls:
            mem = r.get("memory") or {}
            rows.append(f"| {name} | {x['name']} | {x['step_time_median_s'] * 1e3:.1f} | {x['tokens_per_s']:,.0f} | "
                        f"{100 * x['mfu']:.1f}% | {mem.get('total', 0) / 2**30:.1f} |")
        run.note("## Sizes (with the fastest flags: " + (" ".join(flags) or "none, the default") + ")\n\n"
                 + "\n".join(rows))
    return out


# The trainer itself on synthetic batches (what this machine can train without TensorFlow): the tiny model
# at its config's batch (256 x 128), evaluated, checkpointed and logged as any run.
TRAINER = ["train.py", "--config", "configs/pretrain.py:size=tiny,synthetic", "--config.num_train_steps=20",
           "--config.eval_every=10", "--config.eval_steps=2", "--config.checkpoint_every=10"]


def trainer(run: Run) -> dict:
    """``train.py`` on synthetic batches in a child process that allocates as it goes."""
    import tempfile

    from bert_jax.training.metric_writer import read_metrics

    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    small = ["--config.batch_size=4", "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5"]
    with tempfile.TemporaryDirectory(prefix="bert_jax_gpu_trainer_") as tmp:  # its checkpoints stay out of DIR
        workdir = Path(tmp)
        p = child([sys.executable, *TRAINER, *(small if run.quick else []), "--workdir", str(workdir)], env,
                  max(run.left() - 30, 60))
        rows = read_metrics(workdir) if (workdir / "metrics.jsonl").is_file() else []
        checkpoints = sorted(int(c.name) for c in (workdir / "checkpoints").glob("[0-9]*"))
    (run.out / "trainer.txt").write_text(p.stdout + p.stderr)
    last = {split: next((r for r in reversed(rows) if r["split"] == split), {}) for split in ("train", "eval")}
    command = " ".join(TRAINER)
    run.note(f"{run.title('trainer', f'The trainer (`python {command}`)', p.returncode)}\n\n"
             f"exit status {p.returncode}; checkpoints {checkpoints}; "
             f"last train row {json.dumps(last['train'])}; last eval row {json.dumps(last['eval'])}")
    return {"returncode": p.returncode, "checkpoints": checkpoints, **last}


def torch_compile(run: Run) -> dict:
    flags = fastest_flags(run)
    argv = [*shapes(run, BASE), *timing(run), "--compare", "hf-torch,hf-torch-compile"]
    (r,) = bench(argv + (["--variant", " ".join(flags)] if flags else []))
    run.note(f"## Against Hugging Face under torch.compile\n\n{compare_table(r)}")
    return r


def main(argv=None) -> int:
    from input_pipeline import command_line as cli

    p = cli.ArgumentParser(prog="python tests/gpu/run.py", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the tables (created)")
    p.add_argument("--budget_s", type=float, default=480, help="stop starting stages after this many seconds")
    p.add_argument("--quick", action="store_true", help="tiny shapes: a dry run of every stage (e.g. on a CPU)")
    p.add_argument("--stages", default=",".join(COST), help="comma list of the stages to run")
    p.add_argument("--cache", default="/tmp/bert_jax_gpu_run_cache", help="JAX's compilation cache for the run")
    p.add_argument("--variant", action="append", default=[], help="a variant for the variants stage (repeatable; "
                   f"default: {'; '.join(VARIANTS)})")
    p.add_argument("--sizes", default=",".join(SIZES), help="the sizes stage's models: a comma list of "
                   + ", ".join(SIZES))
    p.add_argument("--pytest_k", default="", help="the numerics stage's pytest -k expression")
    p.add_argument("--numerics_workers", type=int, default=NUMERICS_WORKERS,
                   help="the numerics stage's pytest processes at once")
    p.add_argument("--numerics_xla_flags", default=NUMERICS_XLA_FLAGS, help="XLA_FLAGS added for the numerics "
                   "stage's tests ('' to autotune as the trainer does)")
    p.add_argument("--cost", action="append", default=[], metavar="STAGE=S", help="a stage's expected seconds")
    p.add_argument("--fastest", default=None, metavar="FLAGS", help="the flags of the sizes, torch_compile and "
                   "profile_after stages (default: the fastest this run's variants stage measured; '' the default)")
    a = p.parse_args(argv)
    a.costs = {}
    for c in a.cost:
        name, _, seconds = c.partition("=")
        if name not in COST or not seconds.replace(".", "", 1).isdigit():
            p.error(f"--cost {c}: expected STAGE=SECONDS with STAGE one of {', '.join(COST)}")
        a.costs[name] = float(seconds)
    if a.numerics_workers < 1:
        p.error(f"--numerics_workers {a.numerics_workers}: expected 1 or more")
    if unknown := sorted(set(a.sizes.split(",")) - set(SIZES) - {""}):
        p.error(f"--sizes {','.join(unknown)}: expected a comma list of {', '.join(SIZES)}")
    chosen = [s for s in a.stages.split(",") if s]
    if unknown := sorted(set(chosen) - set(COST)):
        p.error(f"--stages {','.join(unknown)}: expected a comma list of {', '.join(COST)}")
    run = Run(Path(a.out), a.budget_s, a.quick, a)
    stages = {"numerics": lambda: numerics(run), "profile_before": lambda: profiled(run, "profile_before", []),
              "variants": lambda: variants(run),
              "combined": lambda: combined(run), "profile_after": lambda: profiled(run, "profile_after",
                                                                                     fastest_flags(run)),
              "sizes": lambda: sizes(run), "trainer": lambda: trainer(run), "torch_compile": lambda: torch_compile(run),
              "attention_kernels": lambda: attention_kernels(run), "norm_kernels": lambda: norm_kernels(run)}
    import jax

    # One compilation cache for the run: the default step is compiled by several stages.
    jax.config.update("jax_compilation_cache_dir", a.cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    environment(run)
    for name in chosen:
        run.stage(name, stages[name])
    run.note(outcome(run))
    run.note(f"total {time.monotonic() - run.start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from input_pipeline import command_line

    command_line.run(main)

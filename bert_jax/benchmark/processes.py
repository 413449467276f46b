r"""Our default step against Hugging Face's, each in a process of its own, as its user would run it.

    python -m bert_jax.benchmark.processes --rounds 3 --references hf-torch,hf-flax -- \
        --size base --seq_len 128 --batch_size 8 --steps 6 --warmup 1 --short_seq_prob 0

Each round runs one process after another (so a change in the machine's speed falls on all of them):

- ours: ``python -m bert_jax.benchmark ARGS --json``, the project's defaults;
- each reference: ``python -m bert_jax.benchmark ARGS --compare REF --references_only --json``:
  Hugging Face's step alone.

All in the environment this command was started with (glibc's huge pages, README's "CPU launch
line", reach every process alike or none).

Reported per implementation: the median over rounds of each process's median step time, and ours
over theirs in tokens/s (the same B·S tokens a step for all). ``--output PATH`` appends every
process's JSON line and the summary's. ``--compare`` in one process (bert_jax/benchmark/compare.py)
takes turns step by step instead, with every implementation sharing that process's settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from input_pipeline import command_line as cli


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark.processes", description=__doc__.split("\n\n")[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--references", default="hf-torch,hf-flax", help="comma list of --compare implementations")
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per process")
    p.add_argument("--output", default="", metavar="PATH", help="append the JSON lines to PATH")
    p.add_argument("benchmark_args", nargs=argparse.REMAINDER,
                   help="after --: the arguments of python -m bert_jax.benchmark (one batch size)")
    args = p.parse_args(argv)
    args.benchmark_args = [a for a in args.benchmark_args if a != "--"]
    args.references = [r for r in args.references.split(",") if r]
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: expected at least 1")
    if not args.benchmark_args:
        p.error("expected the benchmark's arguments after --, e.g. -- --size base --batch_size 8")
    clash = sorted({a.split("=")[0] for a in args.benchmark_args} & {"--compare", "--json", "--references_only",
                                                                      "--variant", "--output"})
    if clash:
        p.error(f"{', '.join(clash)}: set by this command, not in the benchmark's arguments")
    return args


def commands(args) -> list[tuple[str, list[str]]]:
    """[(implementation, command line)] of one round."""
    base = [sys.executable, "-m", "bert_jax.benchmark", *args.benchmark_args, "--json"]
    return [("ours", base)] + [(ref, [*base, "--compare", ref, "--references_only"]) for ref in args.references]


def run_process(name: str, cmd: list[str], timeout: float) -> dict:
    """One process's JSON result (its last line that is a JSON object)."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise cli.UserError(f"{name}: {' '.join(cmd[1:])} exited {done.returncode}: {tail[0]}")
    r = json.loads(lines[-1])
    return r["implementations"][0] | {"load_average": r["load_average"], "glibc_tunables": r["glibc_tunables"]} \
        if r["mode"] == "compare" else r


def main(argv=None) -> dict:
    args = parse_args(argv)
    per_impl: dict[str, list[dict]] = {}
    lines = []
    for i in range(args.rounds):
        for name, cmd in commands(args):
            t = time.perf_counter()
            r = run_process(name, cmd, args.timeout)
            per_impl.setdefault(name, []).append(r)
            lines.append(json.dumps({"round": i + 1, "implementation": name, **r}))
            print(f"round {i + 1}/{args.rounds} {name}: median {r['step_time_median_s'] * 1e3:.1f} ms a step "
                  f"({time.perf_counter() - t:.0f} s, load {r['load_average'][0]})", file=sys.stderr, flush=True)
    medians = {k: statistics.median(x["step_time_median_s"] for x in v) for k, v in per_impl.items()}
    summary = {"mode": "processes", "rounds": args.rounds, "benchmark_args": args.benchmark_args,
               "median_step_s": medians,
               "per_round_step_s": {k: [x["step_time_median_s"] for x in v] for k, v in per_impl.items()},
               "ours_over_theirs": {k: round(v / medians["ours"], 3) for k, v in medians.items() if k != "ours"}}
    for name, s in medians.items():
        rounds = ", ".join(f"{x['step_time_median_s'] * 1e3:.0f}" for x in per_impl[name])
        ratio = "" if name == "ours" else f"  ours/{name} {summary['ours_over_theirs'][name]:.2f}"
        print(f"{name:<9} median {s * 1e3:7.1f} ms a step (rounds: {rounds} ms){ratio}")
    if args.output:
        with open(args.output, "a") as f:
            f.write("\n".join([*lines, json.dumps(summary)]) + "\n")
    return summary


if __name__ == "__main__":
    cli.run(main)

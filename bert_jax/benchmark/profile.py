r"""``python -m bert_jax.benchmark.profile DIR``: where a training step's time goes, as a table.

DIR is what ``python -m bert_jax.benchmark ... --profile DIR`` writes: a ``jax.profiler`` trace of
``--profile_steps`` steps (``DIR/plugins/profile/*/*.trace.json.gz``), the compiled step's HLO
(``DIR/step.hlo.txt``) and ``DIR/profile.json`` (the steps traced, their wall time, the untraced
median step). Each kernel (on a GPU) or thunk (on a CPU) the trace holds is put in one row:

    matrix products     cuBLAS / Triton / CUTLASS GEMMs and dot fusions outside attention
    attention           everything under the model's ``attention`` scope but dropout's bits: the fused
                        kernel (cuDNN, splash), or the explicit path's two batched products and softmax
    dropout             what the ``dropout`` scope runs: the random bits, the mask and its select
    optimizer           the ``optimizer`` scope: the update of the parameters and moments
    copies/transposes   copy, transpose, (dynamic-)slice, concatenate, pad and memcpy/memset kernels
    other fusions       the rest: normalisation, softmax outside attention, GELU, residual adds,
                        the loss, reductions
    host gaps           the device idle between the traced steps' first kernel and their last (the
                        host late with the next kernel or step)

A kernel's row comes from its HLO instruction (the trace's ``hlo_op``, or its kernel name, which
XLA derives from the instruction's) and that instruction's ``op_name`` metadata, where the model's
``jax.named_scope`` names appear (bert_jax/model/layers.py, bert_jax/model/dropout.py,
bert_jax/training/steps.py). cuBLAS names its kernels after their tiling (``nvjet_...``), not the
instruction: its products are joined to the program's cuBLAS calls in the order both run (each
step's n-th product kernel is the n-th call; a split-K product's reduction kernel goes with its
product), where every traced step ran one kernel a call. Kernels no instruction explains are named
by pattern. Times are per step: a row's time is its kernels' share of the time when any kernel runs
(kernels that overlap, on CPU threads or GPU streams, split the time they share), its share one of
the time from the traced steps' first kernel to their last; the traced window's edges (the first
step's dispatch before its first kernel, the wait after the last: overlapped by the steps before and
after in a queued run) are reported apart. docs/benchmarks.md shows a table from one GPU.

    python -m bert_jax.benchmark --size base --batch_size 256 --dtype bfloat16 --steps 10 --profile /tmp/prof
    python -m bert_jax.benchmark.profile /tmp/prof [--json] [--top 8]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import re
from pathlib import Path

from input_pipeline import command_line as cli

ROWS = ("matrix products", "attention", "dropout", "optimizer", "copies/transposes", "other fusions", "host gaps")
HLO_FILE, META_FILE = "step.hlo.txt", "profile.json"
# Timeline lines that summarise others (xprof's derived lines): counting them would count kernels twice.
DERIVED_LINES = ("xla modules", "xla ops", "steps", "tensorflow ops", "framework name scope", "source code",
                 "tensorflow name scope", "xla traceme", "launch stats", "sparsecore")
GEMM_KERNEL = re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|wgmma|hgmma", re.I)
SPLIT_K_REDUCTION = re.compile(r"splitKreduce", re.I)  # cuBLAS's second kernel of a split-K product
LIBRARY_CALL = re.compile(r"cublas|gemm|matmul", re.I)  # a custom call's target that runs a library product
ATTENTION_KERNEL = re.compile(r"fmha|flash|sdpa|cudnn|splash|attention", re.I)
ATTENTION_CALL = re.compile(r"fmha|flash|sdpa|splash|attention", re.I)  # a custom call's target (not cuDNN's norm)
COPY_KERNEL = re.compile(r"memcpy|memset|copy|transpose", re.I)
COPY_OPS = {"copy", "transpose", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad",
            "copy-start", "copy-done", "bitcast", "reshape", "broadcast", "parameter", "constant", "tuple",
            "get-tuple-element", "iota"}
GEMM_OPS = {"dot", "convolution", "ragged-dot"}
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s+=\s+(?P<rest>.*)$")
OPCODE = re.compile(r"\s(?P<op>[a-z][a-z0-9\-]*)\(")
COMPUTATION = re.compile(r"^%?(?P<name>[^\s(]+)\s.*\{\s*$")


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    op_name: str = ""  # the metadata's op_name: JAX's name stack, scopes included
    target: str = ""  # custom_call_target
    calls: str = ""  # a fusion's computation
    gemm_fusion: bool = False  # a fusion XLA made around a matrix product (Triton, cuBLAS epilogues)
    computation: str = ""  # the computation it is in ("ENTRY": the program's own)
    line: str = ""  # its text


def parse_hlo(text: str) -> tuple[dict[str, Instruction], dict[str, set[str]]]:
    """{instruction name: Instruction} over every computation of an HLO module's text, and
    {computation name: the opcodes in it}."""
    instructions, computations, current = {}, collections.defaultdict(set), None
    for line in text.splitlines():
        m = INSTRUCTION.match(line)
        if m and " = " in line:
            rest = m["rest"]
            op = OPCODE.search(" " + rest.split(", metadata=")[0])
            if op is None:
                continue
            ins = Instruction(m["name"], op["op"], computation=current or "", line=line)
            if (x := re.search(r'op_name="([^"]*)"', rest)) is not None:
                ins.op_name = x[1]
            if (x := re.search(r'custom_call_target="([^"]*)"', rest)) is not None:
                ins.target = x[1]
            if (x := re.search(r"calls=%?([\w.\-]+)", rest)) is not None:
                ins.calls = x[1]
            ins.gemm_fusion = bool(re.search(r'"kind":"__(triton_gemm|cublas|cutlass|gemm)', rest))
            instructions[ins.name] = ins
            if current is not None:
                computations[current].add(ins.opcode)
        elif (c := COMPUTATION.match(line)) is not None and not line.startswith(" "):
            current = c["name"]
        elif line.startswith("}"):
            current = None
    return instructions, dict(computations)


def in_scope(op_name: str, scope: str) -> bool:
    """Whether JAX's name stack ``op_name`` runs inside ``jax.named_scope(scope)`` (also as the
    transposed or differentiated scope, ``transpose(jvp(scope))``)."""
    return re.search(rf"(^|[/(]){re.escape(scope)}([)/]|$)", op_name) is not None


def classify(kernel: str, ins: Instruction | None, computations: dict[str, set[str]]) -> str:
    """The row (`ROWS`) of a kernel named ``kernel`` that runs HLO instruction ``ins`` (None: unknown)."""
    if ins is None:
        if ATTENTION_KERNEL.search(kernel):
            return "attention"
        if GEMM_KERNEL.search(kernel):
            return "matrix products"
        return "copies/transposes" if COPY_KERNEL.search(kernel) else "other fusions"
    inner = computations.get(ins.calls, set())
    gemm = (ins.opcode in GEMM_OPS or ins.gemm_fusion or bool(inner & GEMM_OPS)
            or (ins.opcode == "custom-call" and re.search(r"gemm|matmul|cublas", ins.target, re.I) is not None))
    fused_attention = ins.opcode == "custom-call" and ATTENTION_CALL.search(ins.target) is not None
    if in_scope(ins.op_name, "dropout") and not gemm:
        return "dropout"
    if fused_attention or in_scope(ins.op_name, "attention"):
        return "attention"
    if in_scope(ins.op_name, "optimizer") and not gemm:
        return "optimizer"
    if gemm:
        return "matrix products"
    ops = inner or {ins.opcode}
    return "copies/transposes" if ops <= COPY_OPS else "other fusions"


def shared_time(spans: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Each row's part of the time when any kernel runs: where kernels of several rows overlap (CPU
    threads, GPU streams), the time is split among the running kernels, so the rows add up to the
    busy time."""
    edges = sorted({t for ivs in spans.values() for iv in ivs for t in iv})
    index = {t: i for i, t in enumerate(edges)}
    delta = collections.defaultdict(lambda: [0] * (len(edges) + 1))  # row -> running-kernel changes per edge
    for row, ivs in spans.items():
        for a, b in ivs:
            delta[row][index[a]] += 1
            delta[row][index[b]] -= 1
    running, out = dict.fromkeys(delta, 0), dict.fromkeys(spans, 0.0)
    for i in range(len(edges) - 1):
        for row in delta:
            running[row] += delta[row][i]
        total = sum(running.values())
        if total:
            for row, n in running.items():
                if n:
                    out[row] += (edges[i + 1] - edges[i]) * n / total
    return out


def union_length(intervals: list[tuple[float, float]]) -> float:
    """The total length covered by [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def kernel_events(trace: dict) -> tuple[list[dict], str]:
    """The events of the trace that are kernels on a device (GPU/TPU streams) or, on a CPU, the
    thunks XLA ran (events carrying an ``hlo_op``); and which of the two ("device" | "host")."""
    names, threads = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    # Not "/device:CUSTOM:..." (libtpu's Megascale trace, there wherever libtpu is installed, no kernels).
    devices = {p for p, n in names.items()
               if n.startswith("/device:") and not n.startswith("/device:CUSTOM:") and "cpu" not in n.lower()}
    xs = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    if devices:
        line = lambda e: threads.get((e["pid"], e.get("tid")), "").lower()  # noqa: E731
        kernels = [e for e in xs if e["pid"] in devices and not line(e).startswith(DERIVED_LINES)]
        return kernels, "device"
    return [e for e in xs if "hlo_op" in e.get("args", {}) and not e["name"].startswith("end: ")], "host"


def library_products(events: list[dict], instructions: dict[str, Instruction], unmatched: list[int]
                      ) -> dict[int, Instruction]:
    """{index in ``events``: the cuBLAS (or other library) call it ran} for the ``unmatched`` events
    (indices, in the order they ran) that are product kernels: the program's library calls run in
    the program's order every step, so with k steps traced the product kernels are k runs of that
    sequence; a split-K reduction goes with the product before it. Empty when the counts do not
    divide (a step that ran other kernels: no guess)."""
    calls = [i for i in instructions.values()
             if i.computation == "ENTRY" and i.opcode == "custom-call" and LIBRARY_CALL.search(i.target)]
    products = [j for j in unmatched if GEMM_KERNEL.search(events[j]["name"])  # cuDNN's attention: not a call
                and not SPLIT_K_REDUCTION.search(events[j]["name"]) and not ATTENTION_KERNEL.search(events[j]["name"])]
    if not calls or not products or len(products) % len(calls):
        return {}
    out = {j: calls[n % len(calls)] for n, j in enumerate(products)}
    last = None
    for j in unmatched:  # in the order they ran
        if j in out:
            last = out[j]
        elif last is not None and SPLIT_K_REDUCTION.search(events[j]["name"]):
            out[j] = last
    return out


def find_trace(directory: Path) -> Path:
    found = sorted(directory.glob("plugins/profile/*/*.trace.json.gz")) or sorted(directory.glob("**/*.trace.json.gz"))
    if not found:
        raise cli.UserError(f"{directory}: no plugins/profile/*/*.trace.json.gz (expected the directory that "
                            "python -m bert_jax.benchmark --profile DIR wrote)")
    return found[-1]


def reduce_profile(directory: str | Path, top: int = 5) -> dict:
    """The table for DIR (see the module's docstring): {"rows": [{row, ms_per_step, share, kernels,
    top: [(name, ms per step, runs per step)]}], "kernel_span_ms", "step_ms", "traced_step_ms",
    "edges_ms", "kernels", "matched", "per_kernel": {name: (ms per step, runs per step)}, ...}."""
    directory = Path(directory)
    meta_path, hlo_path = directory / META_FILE, directory / HLO_FILE
    if not meta_path.is_file():
        raise cli.UserError(f"{meta_path}: not found (expected the directory that python -m bert_jax.benchmark "
                            "--profile DIR wrote)")
    meta = json.loads(meta_path.read_text())
    instructions, computations = parse_hlo(hlo_path.read_text()) if hlo_path.is_file() else ({}, {})
    by_kernel_name = {n.replace(".", "_").replace("-", "_"): i for n, i in instructions.items()}
    trace_path = find_trace(directory)
    with gzip.open(trace_path, "rt") as f:
        events, where = kernel_events(json.load(f))
    if not events:
        raise cli.UserError(f"{trace_path}: no kernels or XLA thunks in the trace")
    steps, wall_us = meta["steps"], meta["wall_s"] * 1e6
    spans = collections.defaultdict(list)
    times, calls = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    events = sorted(events, key=lambda e: e["ts"])

    def named(e: dict) -> Instruction | None:  # by the trace's hlo_op, else by the kernel's name
        op = e.get("args", {}).get("hlo_op") or ""
        return instructions.get(op) or by_kernel_name.get(op.replace(".", "_").replace("-", "_")) \
            or by_kernel_name.get(re.sub(r"(_kernel)?(\(.*)?$", "", e["name"]))

    found = [named(e) for e in events]
    joined = library_products(events, instructions, [j for j, ins in enumerate(found) if ins is None])
    matched = 0
    for j, e in enumerate(events):
        ins = found[j] or joined.get(j)
        matched += ins is not None
        row = classify(e["name"], ins, computations)
        spans[row].append((e["ts"], e["ts"] + e["dur"]))
        name = ins.name if ins is not None else e["name"][:80]
        times[row][name] += e["dur"]
        # a fusion XLA shares between layers runs once for each; a split-K reduction is its product's run
        calls[row][name] += not (j in joined and SPLIT_K_REDUCTION.search(e["name"]))
    start = min(a for s in spans.values() for a, _ in s)
    end = max(b for s in spans.values() for _, b in s)
    busy = union_length([iv for s in spans.values() for iv in s])
    span = end - start  # from the traced steps' first kernel to their last: the device's time for them
    wall_us = max(wall_us, span)  # the traced window (never less than the kernels' span)
    rows, shared = [], shared_time({row: spans[row] for row in ROWS[:-1]})
    for row in ROWS[:-1]:
        us = shared[row]
        rows.append({"row": row, "ms_per_step": us / steps / 1e3, "share": us / span, "kernels": len(spans[row]),
                     "top": [(name, t / steps / 1e3, calls[row][name] / steps)
                             for name, t in times[row].most_common(top)]})
    gaps = max(span - busy, 0.0)  # the device idle between kernels, steps' boundaries included
    rows.append({"row": "host gaps", "ms_per_step": gaps / steps / 1e3, "share": gaps / span, "kernels": 0,
                 "top": []})
    return {"directory": str(directory), "trace": str(trace_path), "events": where, "steps": steps,
            "kernel_span_ms": span / steps / 1e3, "traced_step_ms": wall_us / steps / 1e3,
            "edges_ms": (wall_us - span) / steps / 1e3, "step_ms": meta.get("step_time_median_s", 0) * 1e3,
            "kernels": len(events), "matched": matched, "label": meta.get("label", ""), "rows": rows,
            "per_kernel": {name: (t / steps / 1e3, calls[row][name] / steps)  # {name: (ms, runs) a step}
                           for row in ROWS[:-1] for name, t in times[row].items()}}


def markdown(table: dict) -> str:
    """The table as Markdown: a row per category, its ms per step and share of the step; its largest
    kernels with their ms per step (and runs per step, for one shared by several layers)."""
    lines = [f"{table['label']}: {table['steps']} traced step(s), {table['kernel_span_ms']:.1f} ms each from "
             f"their first kernel to their last ({table['step_ms']:.1f} ms untraced median; the traced window "
             f"{table['traced_step_ms']:.1f} ms a step, {table['edges_ms']:.1f} of them before the first kernel or "
             f"after the last: the host's dispatch and wait, which queued steps overlap); {table['kernels']} "
             f"{table['events']} events, {table['matched']} matched to HLO instructions",
             "", "| where | ms / step | share of the step | kernels / step | largest |", "|---|---|---|---|---|"]
    for r in table["rows"]:
        largest = ", ".join(f"{n} {ms:.2f}" + (f" ({k:.0f} runs)" if k > 1 else "") for n, ms, k in r["top"][:3])
        lines.append(f"| {r['row']} | {r['ms_per_step']:.2f} | {100 * r['share']:.1f}% | "
                     f"{r['kernels'] / table['steps']:.0f} | {largest} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark.profile", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", help="what python -m bert_jax.benchmark --profile DIR wrote")
    p.add_argument("--top", type=int, default=5, help="instructions named per row")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    a = p.parse_args(argv)
    table = reduce_profile(a.directory, a.top)
    print(json.dumps(table) if a.json else markdown(table), flush=True)
    return table


if __name__ == "__main__":
    cli.run(main)

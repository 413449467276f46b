"""Memory of the compiled pre-training step (`python -m bert_jax.benchmark --memory_only`) and the
search for the largest batch that fits a memory budget (``--find_max_batch``), by compiling only."""

from __future__ import annotations

import jax

GIB = 2**30


def memory_report(compiled) -> dict | None:
    """XLA's memory analysis of a compiled program, per device; None where the backend has none."""
    try:
        m = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError, AttributeError):
        return None
    if m is None:
        return None
    fields = ("argument", "output", "alias", "temp", "generated_code")
    out = {f"{f}_bytes": int(getattr(m, f"{f}_size_in_bytes", 0) or 0) for f in fields}
    total = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    out["estimate_bytes"] = total
    out["estimate_gib"] = round(total / GIB, 3)
    if getattr(m, "peak_memory_in_bytes", 0):
        out["xla_peak_bytes"] = int(m.peak_memory_in_bytes)
    return out


def largest_fitting(mem, budget: float, limit: int = 1 << 16, known: dict | None = None) -> int:
    """Largest n in [0, limit] with ``mem(n) <= budget``, for increasing ``mem`` (cached by the caller;
    ``known`` holds values already computed). Memory is nearly affine in the batch, so each round
    probes the secant's prediction between the bracket's ends and its neighbour; bisection after
    a few rounds bounds the number of calls."""
    if mem(1) > budget:
        return 0
    known = {**(known or {}), 1: mem(1)}
    lo = max(n for n, m in known.items() if m <= budget)  # fits
    hi = min([n for n, m in known.items() if m > budget] + [limit + 1])  # does not fit (limit + 1: unknown)
    for rounds in range(64):
        if hi - lo <= 1 or lo >= limit:
            break
        if rounds >= 4:
            probes = [(lo + hi) // 2]
        else:
            ref = hi if hi <= limit else max([n for n in known if n < lo] or [lo + 1])
            slope = max((mem(ref) - mem(lo)) / (ref - lo), 1e-9)
            guess = lo + int((budget - mem(lo)) // slope)
            probes = [min(max(guess, lo + 1), hi - 1, limit)]
            probes.append(probes[0] + 1)
        for p in probes:
            if lo < p < hi and p <= limit:
                known[p] = mem(p)
                lo, hi = (p, hi) if known[p] <= budget else (lo, p)
    return lo


def find_max_batch(bench, budgets_gib: list[float]) -> dict:
    """Largest multiple of ``--batch_multiple`` whose compiled memory estimate fits each budget
    (``bench``: a `bert_jax.benchmark.timing.Bench`)."""
    k, cache = bench.args.batch_multiple, {}

    def mem(units: int) -> int:  # estimate bytes at batch units * k, compiled once
        if units not in cache:
            report = memory_report(bench.compile(units * k)[0])
            if report is None:
                raise RuntimeError(f"{jax.devices()[0].platform}: XLA gives no memory analysis here")
            cache[units] = report["estimate_bytes"]
        return cache[units]

    found = {str(g): largest_fitting(mem, g * GIB, known=cache) * k for g in sorted(budgets_gib)}
    return {"mode": "find_max_batch", **bench.describe(None), "batch_multiple": k, "max_batch": found,
            "estimates_gib": {u * k: round(b / GIB, 3) for u, b in sorted(cache.items())}}

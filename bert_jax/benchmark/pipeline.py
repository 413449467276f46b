r"""``python -m bert_jax.benchmark.pipeline``: input speed, raw text → example shards → masked batches.

    python -m bert_jax.benchmark.pipeline --source pkg:wikipedia --masking dynamic --seconds 30
    python -m bert_jax.benchmark.pipeline --shards /tmp/p128 --masking static --batches 200 --json

Stage 1 (unless ``--shards DIR``): `create_pretraining_data` turns ``--source`` into shards, unmasked
for ``--masking dynamic``, masked ``--dupe_factor`` times for ``static``: documents, examples and
tokens per second, reading and writing included. Stage 2: the trainer's reader (configs/pretrain.py's
data settings, ``--pack_examples``) after one untimed batch, for ``--seconds`` or ``--batches``:
examples and real tokens per second, and the fraction of the token slots that are real.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time

from input_pipeline import command_line as cli
from input_pipeline import hide_accelerators_from_tf
from input_pipeline.package_data import locate


def build_shards(a, output_dir: str, predictions: int) -> dict:
    """Stage 1: raw text → shards in ``output_dir``; the tool's counts and throughput."""
    from input_pipeline import create_pretraining_data as cpd  # imports TF: not for --help

    start = time.perf_counter()
    s = cpd.create_pretraining_data(locate(a.source), output_dir, locate(a.vocab), progress=False,
                                    max_seq_length=a.max_seq_length, max_predictions_per_seq=predictions,
                                    dupe_factor=a.dupe_factor, masking="static" if a.masking == "static" else "none")
    seconds = time.perf_counter() - start
    return {"documents": s["documents"], "examples": s["examples"], "tokens": s["tokens"], "dupe_factor": a.dupe_factor,
            "seconds": round(seconds, 3), **{f"{k}_per_second": round(s[k] / seconds, 1)
                                             for k in ("documents", "examples", "tokens")}}


def read_speed(config, batch_size: int, seconds: float, batches: int) -> dict:
    """Stage 2: the trainer's batches per second after one warm-up batch."""
    from input_pipeline.pretraining.dataset import make_pretraining_dataset

    start = time.perf_counter()
    data = make_pretraining_dataset(config, batch_size=batch_size)
    next(data)  # warm-up: tracing, iterator start, first shuffle-buffer fill
    warmup, start = time.perf_counter() - start, time.perf_counter()
    count = tokens = masked = examples = 0
    while (count < batches) if batches else (count == 0 or time.perf_counter() - start < seconds):
        batch = next(data)
        count += 1
        tokens += int(batch["input_mask"].sum())  # [B, L] → real tokens
        masked += int(batch["masked_lm_weights"].sum())  # [B, P] → predictions
        examples += int(batch["nsp_weights"].sum()) if "nsp_weights" in batch else batch_size  # packed: [B, K]
    elapsed, d = time.perf_counter() - start, config.data
    return {"masking": d.masking, "batch_size": batch_size, "pack_examples": d.pack_examples,
            "max_seq_length": d.max_seq_length, "max_predictions_per_seq": d.max_predictions_per_seq,
            "real_token_fraction": round(tokens / (count * batch_size * d.max_seq_length), 4),
            "warmup_seconds": round(warmup, 3), "batches": count, "examples": examples,
            "epochs_started": data.state()["epoch"] + 1, "seconds": round(elapsed, 3),
            "examples_per_second": round(examples / elapsed, 1), "tokens_per_second": round(tokens / elapsed, 1),
            "masked_fraction": round(masked / max(tokens, 1), 4)}


def format_result(r: dict) -> str:
    m, p = r["machine"], r["pipeline"]
    lines = [f"machine: {m['cpus']} CPUs, load average {m['load_average_before']} → {m['load_average_after']}"]
    if "shards" in r:
        s = r["shards"]
        lines.append(f"raw text → shards ({r['source']}, dupe_factor {s['dupe_factor']}): {s['documents']} documents, "
                     f"{s['examples']} examples, {s['tokens']} tokens in {s['seconds']:.1f}s = "
                     f"{s['documents_per_second']:,.0f} documents/s, {s['examples_per_second']:,.0f} examples/s, "
                     f"{s['tokens_per_second']:,.0f} tokens/s")
    packed = f", packed up to {p['pack_examples']} per row" if p["pack_examples"] else ""
    lines.append(f"shards → batches ({p['masking']} masking, L={p['max_seq_length']}, "
                 f"P={p['max_predictions_per_seq']}, batch {p['batch_size']}{packed}): {p['batches']} batches in "
                 f"{p['seconds']:.1f}s over {p['epochs_started']} epoch(s) = {p['examples_per_second']:,.0f} "
                 f"examples/s, {p['tokens_per_second']:,.0f} tokens/s (warm-up {p['warmup_seconds']:.1f}s, masked "
                 f"{p['masked_fraction']:.3f} of tokens, {p['real_token_fraction']:.3f} of token slots real)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark.pipeline", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = p.add_argument
    add("--source", default="pkg:wikipedia", help="raw text: files/globs, a Wikipedia dump, tfds:..., pkg:wikipedia")
    add("--vocab", default="pkg:minilm/vocab.txt", help="WordPiece vocab.txt")
    add("--masking", default="dynamic", choices=["dynamic", "static"],
        help="dynamic: unmasked shards masked while reading; static: pre-masked shards")
    add("--max_seq_length", type=int, default=128, help="example length L")
    add("--max_predictions_per_seq", type=int, default=None, help="P (default: 20 at L=128, 80 at 512)")
    add("--batch_size", type=int, default=256, help="rows a batch")
    add("--seconds", type=float, default=20.0, help="how long to read batches after the warm-up batch")
    add("--batches", type=int, default=0, help="read exactly this many batches instead of --seconds")
    add("--shards", default=None, help="reuse the shards in this directory (skip stage 1)")
    add("--dupe_factor", type=int, default=1, help="stage 1: passes over the corpus")
    add("--pack_examples", type=int, default=0, help="pack up to K examples per row (0: one per row)")
    add("--json", action="store_true", help="print the result as JSON")
    a = p.parse_args(argv)
    for flag, low in (("batch_size", 1), ("max_seq_length", 5), ("dupe_factor", 1), ("batches", 0),
                      ("pack_examples", 0), ("seconds", 0)):
        if getattr(a, flag) < low:
            p.error(f"--{flag} {getattr(a, flag)}: expected at least {low}")
    return a


def main(argv: list[str] | None = None) -> dict:
    """Both stages (stage 2 only with ``--shards``); prints and returns the result."""
    from bert_jax.config_args import load_config_file

    a = parse_args(argv)
    hide_accelerators_from_tf()
    logging.basicConfig(level=logging.WARNING)
    predictions = a.max_predictions_per_seq or max(1, round(a.max_seq_length * 5 / 32))  # 20 at 128, 80 at 512
    load = lambda: [round(x, 2) for x in os.getloadavg()]  # noqa: E731
    result = {"machine": {"cpus": os.cpu_count(), "load_average_before": load()}}
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        if a.shards is None:
            result.update(source=a.source, shards=build_shards(a, os.path.join(tmp, "shards"), predictions))
        config = load_config_file("pretrain", f"masking={a.masking}")
        config.data.update(input=a.shards or os.path.join(tmp, "shards"), vocab=a.vocab,
                           max_seq_length=a.max_seq_length, max_predictions_per_seq=predictions,
                           pack_examples=a.pack_examples)
        result["pipeline"] = read_speed(config, a.batch_size, a.seconds, a.batches)
    result["machine"]["load_average_after"] = load()
    print(json.dumps(result, indent=1) if a.json else format_result(result))
    return result


if __name__ == "__main__":
    cli.run(main)

r"""Input pipeline speed: raw text → example shards, then shards → masked training batches.

    python -m bert_jax.benchmark.pipeline --source pkg:wikipedia --masking dynamic --seconds 30
    python -m bert_jax.benchmark.pipeline --shards /tmp/p128 --masking static --batches 200 --json

1. Unless ``--shards DIR`` names shards built earlier, `create_pretraining_data` turns ``--source``
   (anything `sources.read_documents` reads, or ``pkg:wikipedia``, the gensim excerpt) into
   ``--num_shards`` TFRecord files in a temporary directory: unmasked for ``--masking dynamic``,
   masked (``--dupe_factor`` copies) for ``static``. Reported: documents/s, examples/s and tokens/s
   (real tokens of the examples written) over the whole tool run, reading and writing included.
2. `dataset.make_pretraining_dataset` reads them with ``configs/pretrain.py``'s data settings
   (shuffle buffer, masking probabilities) at ``--batch_size``: parse, and for ``dynamic`` mask
   every batch anew. One warm-up batch (graph tracing, first shuffle-buffer fill) is not timed;
   then batches for ``--seconds`` (or exactly ``--batches``), epochs repeating as needed.
   Reported: examples/s and tokens/s (real tokens, ``input_mask``) as the trainer would see them,
   and the fraction of the batches' token slots that hold real tokens. ``--pack_examples K`` packs
   up to K examples per row (``config.data.pack_examples``; batches of ``--batch_size`` rows).

The machine's load average is reported too: other processes on a small machine move the numbers.
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
from input_pipeline.package_data import resolve


def default_predictions(max_seq_length: int) -> int:
    """The paper's P for a length: 20 at 128, 80 at 512 (5/32 of L)."""
    return max(1, round(max_seq_length * 5 / 32))


def build_shards(source: str, vocab: str, output_dir: str, *, masking: str, max_seq_length: int,
                 max_predictions_per_seq: int, dupe_factor: int = 1, num_shards: int = 4,
                 num_workers: int = 1, whole_word_mask: bool = False) -> dict:
    """Stage 1: raw text → shards in ``output_dir``; the tool's counts and throughput."""
    from input_pipeline import create_pretraining_data as cpd  # imports TF: not for --help

    start = time.perf_counter()
    summary = cpd.create_pretraining_data(
        resolve(source), output_dir, resolve(vocab), num_workers=num_workers, progress=False,
        max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq,
        dupe_factor=dupe_factor, num_shards=num_shards, whole_word_mask=whole_word_mask,
        masking="static" if masking == "static" else "none")
    seconds = time.perf_counter() - start
    return {
        "documents": summary["documents"], "examples": summary["examples"], "tokens": summary["tokens"],
        "dupe_factor": dupe_factor, "num_shards": num_shards, "num_workers": summary["num_workers"],
        "seconds": round(seconds, 3),
        "documents_per_second": round(summary["documents"] / seconds, 1),
        "examples_per_second": round(summary["examples"] / seconds, 1),
        "tokens_per_second": round(summary["tokens"] / seconds, 1),
    }


def pipeline_config(shards: str, vocab: str, *, masking: str, max_seq_length: int,
                    max_predictions_per_seq: int, whole_word_mask: bool = False, pack_examples: int = 0):
    """configs/pretrain.py's config with ``data`` pointed at the shards."""
    from bert_jax.config_args import load_config_file

    config = load_config_file("pretrain", f"masking={masking}")
    config.data.update(input=shards, vocab=vocab, max_seq_length=max_seq_length,
                       max_predictions_per_seq=max_predictions_per_seq, whole_word_mask=whole_word_mask,
                       pack_examples=pack_examples)
    return config


def read_speed(config, *, batch_size: int, seconds: float = 20.0, batches: int = 0) -> dict:
    """Stage 2: batches/s of `make_pretraining_dataset` after one warm-up batch."""
    from input_pipeline.pretraining.dataset import make_pretraining_dataset

    start = time.perf_counter()
    data = make_pretraining_dataset(config, batch_size=batch_size)
    next(data)  # warm-up: tracing, iterator start, first shuffle-buffer fill
    warmup = time.perf_counter() - start
    count, tokens, masked, examples = 0, 0, 0, 0
    start = time.perf_counter()
    while (count < batches) if batches else (count == 0 or time.perf_counter() - start < seconds):
        batch = next(data)
        count += 1
        tokens += int(batch["input_mask"].sum())  # [B, L] → real tokens
        masked += int(batch["masked_lm_weights"].sum())  # [B, P] → predictions
        examples += int(batch["nsp_weights"].sum()) if "nsp_weights" in batch else batch_size  # packed: [B, K]
    elapsed = time.perf_counter() - start
    return {
        "masking": config.data.masking, "batch_size": batch_size,
        "pack_examples": config.data.pack_examples,
        "real_token_fraction": round(tokens / (count * batch_size * config.data.max_seq_length), 4),
        "max_seq_length": config.data.max_seq_length,
        "max_predictions_per_seq": config.data.max_predictions_per_seq,
        "warmup_seconds": round(warmup, 3), "batches": count, "examples": examples,
        "epochs_started": data.state()["epoch"] + 1, "seconds": round(elapsed, 3),
        "examples_per_second": round(examples / elapsed, 1),
        "tokens_per_second": round(tokens / elapsed, 1),
        "masked_fraction": round(masked / max(tokens, 1), 4),
    }


def run(*, source: str = "pkg:wikipedia", vocab: str = "pkg:minilm/vocab.txt", masking: str = "dynamic",
        max_seq_length: int = 128, max_predictions_per_seq: int | None = None, batch_size: int = 256,
        seconds: float = 20.0, batches: int = 0, shards: str | None = None, dupe_factor: int = 1,
        num_shards: int = 4, num_workers: int = 1, whole_word_mask: bool = False, pack_examples: int = 0) -> dict:
    """Both stages (stage 1 only without ``shards``); a JSON-ready dict."""
    if masking not in ("dynamic", "static"):
        raise ValueError(f"masking={masking!r}: expected 'dynamic' or 'static'")
    p = max_predictions_per_seq or default_predictions(max_seq_length)
    result = {"machine": {"cpus": os.cpu_count(), "load_average_before": _load()}}
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        if shards is None:
            shards = os.path.join(tmp, "shards")
            result["source"] = source
            result["shards"] = build_shards(source, vocab, shards, masking=masking,
                                            max_seq_length=max_seq_length, max_predictions_per_seq=p,
                                            dupe_factor=dupe_factor, num_shards=num_shards,
                                            num_workers=num_workers, whole_word_mask=whole_word_mask)
        else:
            result["shards_dir"] = shards
        config = pipeline_config(shards, vocab, masking=masking, max_seq_length=max_seq_length,
                                 max_predictions_per_seq=p, whole_word_mask=whole_word_mask,
                                 pack_examples=pack_examples)
        result["pipeline"] = read_speed(config, batch_size=batch_size, seconds=seconds, batches=batches)
    result["machine"]["load_average_after"] = _load()
    return result


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []


def format_result(result: dict) -> str:
    lines = [f"machine: {result['machine']['cpus']} CPUs, load average "
             f"{result['machine']['load_average_before']} → {result['machine']['load_average_after']}"]
    if "shards" in result:
        s = result["shards"]
        lines.append(f"raw text → shards ({result['source']}, dupe_factor {s['dupe_factor']}, "
                     f"{s['num_workers']} worker(s)): {s['documents']} documents, {s['examples']} examples, "
                     f"{s['tokens']} tokens in {s['seconds']:.1f}s = {s['documents_per_second']:,.0f} documents/s, "
                     f"{s['examples_per_second']:,.0f} examples/s, {s['tokens_per_second']:,.0f} tokens/s")
    p = result["pipeline"]
    packed = f", packed up to {p['pack_examples']} per row" if p["pack_examples"] else ""
    lines.append(f"shards → batches ({p['masking']} masking, L={p['max_seq_length']}, "
                 f"P={p['max_predictions_per_seq']}, batch {p['batch_size']}{packed}): "
                 f"{p['batches']} batches in {p['seconds']:.1f}s over "
                 f"{p['epochs_started']} epoch(s) = {p['examples_per_second']:,.0f} examples/s, "
                 f"{p['tokens_per_second']:,.0f} tokens/s (warm-up {p['warmup_seconds']:.1f}s, "
                 f"masked {p['masked_fraction']:.3f} of tokens, {p['real_token_fraction']:.3f} of token slots real)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None):
    parser = cli.ArgumentParser(prog="python -m bert_jax.benchmark.pipeline", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--source", default="pkg:wikipedia", help="raw text: files/globs, a Wikipedia dump, tfds:..., pkg:wikipedia")
    add("--vocab", default="pkg:minilm/vocab.txt", help="WordPiece vocab.txt")
    add("--masking", default="dynamic", choices=["dynamic", "static"],
        help="dynamic: unmasked shards masked while reading; static: pre-masked shards")
    add("--max_seq_length", type=int, default=128, help="example length L")
    add("--max_predictions_per_seq", type=int, default=None, help="P (default: 20 at L=128, 80 at 512)")
    add("--batch_size", type=int, default=256, help="batch size read from the pipeline (one process)")
    add("--seconds", type=float, default=20.0, help="how long to read batches after the warm-up batch")
    add("--batches", type=int, default=0, help="read exactly this many batches instead of --seconds")
    add("--shards", default=None, help="reuse the shards in this directory (skip stage 1)")
    add("--dupe_factor", type=int, default=1, help="stage 1: passes over the corpus")
    add("--num_shards", type=int, default=4, help="stage 1: output files")
    add("--num_workers", type=int, default=1, help="stage 1: worker processes")
    add("--whole_word_mask", action="store_true", help="whole-word masking")
    add("--pack_examples", type=int, default=0, help="pack up to K examples per row (0: one per row)")
    add("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    for flag, low in (("batch_size", 1), ("max_seq_length", 5), ("dupe_factor", 1), ("num_shards", 1),
                      ("num_workers", 1), ("batches", 0), ("pack_examples", 0), ("seconds", 0)):
        if getattr(args, flag) < low:
            parser.error(f"--{flag} {getattr(args, flag)}: expected at least {low}")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark with command-line arguments ``argv``; prints and returns the result."""
    args = vars(parse_args(argv))
    as_json = args.pop("json")
    hide_accelerators_from_tf()
    logging.basicConfig(level=logging.WARNING)
    result = run(**args)
    print(json.dumps(result, indent=1) if as_json else format_result(result))
    return result


if __name__ == "__main__":
    cli.run(main)

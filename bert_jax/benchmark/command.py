r"""``python -m bert_jax.benchmark``: speed and memory of one pre-training step of BERT (MLM + NSP) or
its family (``--model roberta|albert|electra``: configs/pretrain.py's recipes), the step the trainer runs.

    python -m bert_jax.benchmark --size base --seq_len 128 --batch_size 32 [--steps 20] [--warmup 3]
        [--model bert|roberta|albert|electra] [--dtype float32|bfloat16] [--remat none|full|dots_saveable|...]
        [--scan|--noscan] [--attention_impl auto|xla|cudnn|explicit] [--attention_dropout 0.1]
        [--max_predictions P] [--per_device_batch auto|N] [--mesh -1,1,1] [--json] [--output results.jsonl]
    python -m bert_jax.benchmark --size base --batch_size 8,32          # several batch sizes, one run
    python -m bert_jax.benchmark --model albert --size base --seq_len 128 --batch_size 8
    python -m bert_jax.benchmark --model electra --size small --seq_len 128 --batch_size 8
    python -m bert_jax.benchmark --size large --seq_len 512 --batch_size 16 --memory_only
    python -m bert_jax.benchmark --size large --seq_len 512 --find_max_batch --memory_gb 16,40,80
    python -m bert_jax.benchmark --compare hf-torch,hf-flax --size base --seq_len 128 --batch_size 8
    python -m bert_jax.benchmark --size base --batch_size 8 --variant "--rng_impl rbg" --variant "--noscan"

It jits the real `bert_jax.training.train_step.train_step` for the recipe's model (``BertForPreTraining``
with MLM + NSP, MLM alone for RoBERTa, MLM + SOP for ALBERT; ``ElectraForPreTraining``, generator and
discriminator, for ELECTRA) as `bert_jax.training.trainer` does (``configs/pretrain.py:model=M,size=S``:
its optimizer, dropout and sharding rules, a ('data', 'fsdp', 'tensor') mesh, donated state),
compiles it ahead of time for synthetic batches of the real shapes (P = ``--max_predictions``: 20
at length 128, 80 at 512; the vocabulary the paper used unless ``--vocab_size``), runs ``--warmup`` steps, then times
``--steps`` steps one by one (each waits for its outputs; the input is already on the device).
As in the trainer, ``--per_device_batch auto`` runs a batch of 16, 24, ... rows per device on a CPU
as accumulated micro-batches of 8 inside the step (``0``: the whole batch; the summary names them).

Reported: compile time (lower + compile), step time (median, min), rows/s, tokens/s (B·S per
step, padding included) and real tokens/s (the synthetic examples' lengths: uniform in [S/2, S],
or ``--short_seq_prob``'s recipe; ``--packing K`` puts up to K examples in a row, with
segment-aware attention), model FLOPs per step (bert_jax/benchmark/flops.py; BERT's, with E = H)

    6·B·[S·L·(4H² + 2H·I) + P·(H² + H·V)] + 12·L·B·S²·H

(ALBERT adds its embedding projection and decodes through E; ELECTRA counts generator and
discriminator), the parameters (trained, the encoder's, and the encoder at the paper's vocabulary
against the paper's figure: bert_jax/benchmark/params.py), achieved FLOP/s, MFU against the peak
(published dense peaks of known GPUs/TPUs times the devices; on a CPU a 2048³ float32 matmul
measured in the same run: a practical, not a hardware, peak), and XLA's memory analysis per device:
arguments + outputs + temp − aliased (the donated state counts once). ``--memory_only`` compiles and
reports memory, running nothing; ``--find_max_batch`` finds, by compiling only, the largest batch (a
multiple of ``--batch_multiple``) whose estimate fits each of ``--memory_gb`` GiB, so it works on a
CPU for any model size (a CPU compile approximates a GPU's or TPU's buffer assignment; it keeps
bfloat16 no smaller than float32).

``--output PATH`` appends each result to PATH as one JSON line (by default no file is written);
``--json`` prints that line instead of the summary. ``--profile DIR`` traces one more step with
``jax.profiler`` (TensorBoard/xprof files and a Perfetto ``*.trace.json.gz``) to see where the
step's time goes.

``--compare hf-torch,hf-flax`` times Hugging Face's BertForPreTraining (PyTorch) and
FlaxBertForPreTraining on the same shapes in the same run, taking turns with ours
(bert_jax/benchmark/compare.py, bert_jax/benchmark/hf.py; needs ``pip install -e '.[bench]'``).
``--variant "FLAGS"`` (repeatable) times our step again with FLAGS added to the command line, in
the same turns: the way to measure a lever's before/after on a machine whose speed drifts.
``--references_only`` times the ``--compare`` implementations without ours; with it
``python -m bert_jax.benchmark.processes`` runs each implementation in a process of its own, taking
turns, as their users run them. Host allocator settings (glibc's huge pages, README "CPU launch
line") come from the environment the command starts in, as for ``train.py``.
"""

from __future__ import annotations

import json
import time

from bert_jax.benchmark.args import parse_args
from bert_jax.benchmark.memory import find_max_batch
from bert_jax.benchmark.timing import Bench, run_one, summary
from input_pipeline.command_line import UserError


def main(argv=None) -> list[dict]:
    args = parse_args(argv, usage=__doc__)
    compare = None
    if args.compare or args.variants:
        from bert_jax.benchmark import compare

    if args.compare:  # the references need the optional 'bench' packages: check before compiling
        from bert_jax.benchmark.hf import MissingDependencies, load_libraries

        try:
            load_libraries(args.compare)
        except MissingDependencies as e:
            raise UserError(str(e)) from e
    bench = Bench(args)
    results = []
    for size in [None] if args.find_max_batch else args.batch_size:
        if size is None:
            r = find_max_batch(bench, [float(g) for g in args.memory_gb.split(",") if g])
        else:
            r = compare.compare(bench, size) if compare else run_one(bench, size)
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **r})
        print(line if args.json else compare.summary(r) if compare else summary(r), flush=True)
        if args.output:
            with open(args.output, "a") as f:
                f.write(line + "\n")
        results.append(r)
    return results


r"""Our pre-training step side by side with Hugging Face's, in one process on identical shapes.

    pip install -e '.[bench]'    # transformers==4.57.6 and torch==2.13.0
    python -m bert_jax.benchmark --compare hf-torch,hf-flax --size base --seq_len 128 --batch_size 8 [--steps 20]
        [--warmup 3] [--compare_block 5] [--torch_threads 2]

Three implementations of one BERT pre-training step (MLM + NSP, training mode, the paper's dropout
0.1, float32), all built from the same `bert_jax.model.config.BertConfig` (random initialisation: nothing
is downloaded) and fed the same synthetic batches (B, S, P, vocabulary 30522):

- ours: the jitted `bert_jax.training.train_step.train_step` that `python -m bert_jax.benchmark` times
  (configs/pretrain.py's optimizer: Adam without bias correction, weight decay 0.01, clipping; its
  learning-rate warm-up keeps the first updates tiny, which changes no step's work);
- ``hf-torch``: transformers' ``BertForPreTraining`` in PyTorch with ``labels`` (the original id
  at the P masked positions, -100 elsewhere) and ``next_sentence_label``: forward, ``loss.backward()``,
  ``torch.optim.AdamW(lr=1e-4, weight_decay=0.01)`` step, ``zero_grad()``; ``--torch_threads``
  threads (torch.set_num_threads; 2 by default);
- ``hf-flax``: transformers' ``FlaxBertForPreTraining``: one jitted step of ``jax.value_and_grad``
  of the same MLM + NSP loss computed from its logits, then an ``optax.adamw(1e-4,
  weight_decay=0.01)`` update; a new dropout key every step; ``--xla_option``s apply to it too.

Each runs ``--warmup`` untimed steps after compiling; then they take turns, ``--compare_block``
timed steps at a time (ours, torch, flax, ours, ...), until each has ``--steps``, so a change in
the machine's load falls on all of them. Reported per implementation: median and min step time,
tokens/s (B·S per step), model FLOPs and MFU (bert_jax/benchmark/flops.py), and ours/theirs = our tokens/s
over theirs. Hugging Face's MLM head projects all S positions onto the vocabulary (a dense head),
so its model FLOPs use ``flops.dense_mlm_flops`` (P = S); ours gathers the P masked positions first.

Time on an otherwise idle machine: the load average is recorded, and PyTorch's OpenMP threads
slow down many times over (not a little) when other processes take the cores they expect.
On a GPU, start the run with XLA_PYTHON_CLIENT_PREALLOCATE=false so that a CUDA PyTorch finds
memory beside JAX; there PyTorch is allowed TF32 matmuls, as JAX's default float32 precision is.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from bert_jax.benchmark.flops import device_peak
from bert_jax.benchmark.hf import Impl, hf_flax, hf_torch, load_libraries
from bert_jax.benchmark.timing import Bench, model_name


def ours(bench, batch_size: int, peak, variant: str = "") -> Impl:
    compiled, lower_s, compile_s = bench.compile(batch_size)
    step = bench.stepper(compiled, batch_size)
    a = bench.args
    name, label = ("ours", "bert_jax train_step")
    if variant:
        name, label = f"ours {variant}", f"bert_jax train_step with {variant}"
    tokens = bench.block_tokens(batch_size)
    if a.unpad_multiple:
        label += (f" (blocks on {tokens} of {batch_size * a.seq_len} token slots)" if tokens
                  else " (no padding to skip: the padded step)")
    return Impl(name, label, jax.devices()[0].platform, lambda: step()["loss"], lower_s + compile_s,
                bench.flops(batch_size),
                "gathered", peak, step.real_tokens)


def alternate(impls: list[Impl], warmup: int, steps: int, block: int) -> dict[str, tuple[list[float], list]]:
    """Warm-up steps for each, then turns of ``block`` timed steps each until every one has ``steps``;
    {name: (step seconds, losses)}."""
    out = {i.name: ([], []) for i in impls}
    for impl in impls:
        for _ in range(warmup):
            out[impl.name][1].append(impl.step())
    while any(len(out[i.name][0]) < steps for i in impls):
        for impl in impls:
            times, losses = out[impl.name]
            for _ in range(min(block, steps - len(times))):
                t = time.perf_counter()
                losses.append(impl.step())
                times.append(time.perf_counter() - t)
    return out


def compare(bench, batch_size: int) -> dict:
    """Times ours, our ``--variant``s and the ``--compare`` implementations on ``batch_size``; one
    "compare" result."""
    a = bench.args
    libs = load_libraries(a.compare) if a.compare else {}
    peak = device_peak(a.dtype, bench.mesh.devices.size)
    data = bench.data(batch_size, packed=False)
    batches = [next(data) for _ in range(4)]  # the four batches ours cycles through (unless it packs)
    impls = [] if a.references_only else [ours(bench, batch_size, peak)]
    impls += [ours(Bench(v), batch_size, peak if v.dtype == a.dtype else device_peak(v.dtype, bench.mesh.devices.size),
                   name) for name, v in a.variants]
    builders = {"hf-torch": hf_torch, "hf-flax": hf_flax}  # IMPLEMENTATIONS
    impls += [builders[n](bench, libs, batches, peak) for n in a.compare]
    timed = alternate(impls, max(a.warmup, 1), a.steps, max(a.compare_block, 1))
    rows = []
    for impl in impls:
        times, losses = timed[impl.name]
        median, losses = statistics.median(times), [float(x) for x in losses]
        if not np.isfinite(losses[-1]):
            raise FloatingPointError(f"{impl.name}: loss is {losses[-1]}: the comparison is not valid")
        flop_s, (peak_flops, source) = impl.flops / median, impl.peak
        rows.append({
            "name": impl.name, "label": impl.label, "device": impl.device,
            "compile_s": None if impl.compile_s is None else round(impl.compile_s, 3),
            "step_time_median_s": round(median, 5), "step_time_min_s": round(min(times), 5),
            "sequences_per_s": round(batch_size / median, 2), "tokens_per_s": round(batch_size * a.seq_len / median, 1),
            "real_tokens_per_step": impl.real_tokens, "real_tokens_per_s": round(impl.real_tokens / median, 1),
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
            "mlm_head": impl.mlm_head, "model_flops_per_step": impl.flops,
            "achieved_flops_per_s": round(flop_s), "peak_flops_per_s": peak_flops and round(peak_flops),
            "peak_source": source, "mfu": peak_flops and round(flop_s / peak_flops, 4)})
    for r in rows:  # > 1: ours is faster (real tokens: a packing variant does more examples a step)
        first = None if a.references_only else rows[0]
        r["ours_over_theirs"] = first and round(first["tokens_per_s"] / r["tokens_per_s"], 3)
        r["ours_over_theirs_real_tokens"] = first and round(first["real_tokens_per_s"] / r["real_tokens_per_s"], 3)
    versions = {k: v.__version__ for k, v in libs.items()}
    return {"mode": "compare", **bench.describe(batch_size), **{f"{k}_version": v for k, v in versions.items()},
            "steps": a.steps, "warmup": max(a.warmup, 1), "compare_block": max(a.compare_block, 1),
            "torch_threads": a.torch_threads if "hf-torch" in a.compare else None, "variants": a.variant,
            "flops_formula": bench.formula(), "dense_mlm_head": "P = S", "implementations": rows,
            "references_only": a.references_only,
            "ratio_tokens_per_s": {} if a.references_only else {r["name"]: r["ours_over_theirs"] for r in rows[1:]},
            "ratio_real_tokens_per_s": {} if a.references_only else {
                r["name"]: r["ours_over_theirs_real_tokens"] for r in rows[1:]}}


def summary(r: dict) -> str:
    w = max(14, *(len(x["name"]) for x in r["implementations"]))
    lines = [f"compare: {model_name(r)} ({r['num_params'] / 1e6:.1f}M params) seq_len {r['seq_len']} batch "
             f"{r['batch_size']} P {r['max_predictions']} {r['dtype']} on {r['device_kind']} (load "
             f"{r['load_average'][0]}); {r['steps']} timed steps each, in turns of {r['compare_block']} after "
             f"{r['warmup']} warm-up",
             f"  {'implementation':<{w}} {'device':<6} {'compile':>8} {'median':>10} {'min':>10} {'tokens/s':>10} "
             f"{'real tok/s':>10} {'MLM head':>9} {'GFLOP/step':>11} {'MFU':>6} {'ours/row':>9} {'(real)':>7}  "
             "loss first -> last"]
    for x in r["implementations"]:
        compile_s = "-" if x["compile_s"] is None else f"{x['compile_s']:.1f} s"
        mfu = "-" if x["mfu"] is None else f"{100 * x['mfu']:.1f}%"
        lines.append(f"  {x['name']:<{w}} {x['device']:<6} {compile_s:>8} {x['step_time_median_s'] * 1e3:>7.1f} ms "
                     f"{x['step_time_min_s'] * 1e3:>7.1f} ms {x['tokens_per_s']:>10.0f} "
                     f"{x['real_tokens_per_s']:>10.0f} {x['mlm_head']:>9} {x['model_flops_per_step'] / 1e9:>11.2f} "
                     f"{mfu:>6} {x['ours_over_theirs'] or 0:>9.2f} {x['ours_over_theirs_real_tokens'] or 0:>7.2f}  "
                     f"{x['loss_first']} -> {x['loss_last']}")
    lines += [f"  {x['name']}: {x['label']}; peak {x['peak_source']}" for x in r["implementations"]]
    lines.append(f"  model FLOPs: {r['flops_formula']}; a dense MLM head has {r['dense_mlm_head']}")
    return "\n".join(lines)

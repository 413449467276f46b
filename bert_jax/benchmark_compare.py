r"""Our pre-training step side by side with Hugging Face's, in one process on identical shapes.

    pip install -e '.[bench]'    # transformers==4.57.6 and torch==2.13.0
    python -m bert_jax.benchmark --compare hf-torch,hf-flax --size base --seq_len 128 --batch_size 8 [--steps 20]
        [--warmup 3] [--compare_block 5] [--torch_threads 2]

Three implementations of one BERT pre-training step (MLM + NSP, training mode, the paper's dropout
0.1, float32), all built from the same `bert_jax.config.BertConfig` (random initialisation: nothing
is downloaded) and fed the same synthetic batches (B, S, P, vocabulary 30522):

- ours: the jitted `bert_jax.train_step.train_step` that `python -m bert_jax.benchmark` times
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
tokens/s (B·S per step), model FLOPs and MFU (bert_jax/flops.py), and ours/theirs = our tokens/s
over theirs. Hugging Face's MLM head projects all S positions onto the vocabulary (a dense head),
so its model FLOPs use ``flops.dense_mlm_flops`` (P = S); ours gathers the P masked positions first.

Time on an otherwise idle machine: the load average is recorded, and PyTorch's OpenMP threads
slow down many times over (not a little) when other processes take the cores they expect.
On a GPU, start the run with XLA_PYTHON_CLIENT_PREALLOCATE=false so that a CUDA PyTorch finds
memory beside JAX; there PyTorch is allowed TF32 matmuls, as JAX's default float32 precision is.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.flops import FORMULA, dense_mlm_flops, device_peak, pretraining_flops, published_peak

IMPLEMENTATIONS = ("hf-torch", "hf-flax")


def check_args(parser, args) -> None:
    """``parser.error`` unless ``args`` (``--compare`` or ``--variant`` given) describe a comparison we can run."""
    unknown = sorted(set(args.compare) - set(IMPLEMENTATIONS))
    if unknown:
        parser.error(f"--compare {','.join(unknown)}: expected a comma list of {', '.join(IMPLEMENTATIONS)}")
    if args.memory_only or args.find_max_batch:
        parser.error("--compare and --variant time steps: they do not go with --memory_only or --find_max_batch")
    if not args.compare:
        return
    for a in [args, *(v for _, v in getattr(args, "variants", []))]:
        if a.dtype != "float32":
            parser.error("--compare runs every implementation in float32: leave --dtype at float32")
    if math.prod(int(x) for x in args.mesh.split(",")) != 1:
        parser.error(f"--compare runs on one device (the references know no mesh): --mesh {args.mesh} is not 1,1,1")


class MissingDependencies(ImportError):
    """transformers or torch is not installed, or is a version without what --compare needs."""


def load_libraries(names: list[str]) -> dict[str, Any]:
    """{"torch": module, "transformers": module} for the implementations ``names``, or a
    `MissingDependencies` that says how to install them."""
    os.environ.setdefault("USE_TF", "0")  # transformers need not import TensorFlow (4 s)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from a config: never the hub
    wanted = ["transformers", *(["torch"] if "hf-torch" in names else [])]
    libs, missing = {}, []
    for module in wanted:
        try:
            libs[module] = importlib.import_module(module)
        except ImportError:
            missing.append(module)
    hint = "pip install -e '.[bench]' (transformers==4.57.6, torch==2.13.0)"
    if missing:
        raise MissingDependencies(f"--compare {','.join(names)} needs {' and '.join(missing)}: {hint}")
    if "hf-flax" in names and not hasattr(libs["transformers"], "FlaxBertForPreTraining"):
        raise MissingDependencies(f"transformers {libs['transformers'].__version__} has no FlaxBertForPreTraining "
                                  f"(Flax models are gone from transformers 5): {hint}")
    return libs


@dataclasses.dataclass
class Impl:
    """One implementation under test: ``step()`` runs one training step, waits for it, returns the loss."""

    name: str
    label: str
    device: str
    step: Callable[[], Any]
    compile_s: float | None
    flops: int  # model FLOPs per step
    mlm_head: str  # "gathered" (P positions) | "dense" (all S positions)
    peak: tuple[float | None, str]  # (FLOP/s, source)
    real_tokens: float  # mean real (not padding) tokens per step


def hf_config(transformers, cfg):
    """Hugging Face's BertConfig for our ``cfg``: the same sizes, activation, dropout and initialiser."""
    return transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act=cfg.hidden_act,
        hidden_dropout_prob=cfg.hidden_dropout_prob, attention_probs_dropout_prob=cfg.attention_dropout_prob,
        max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.initializer_range)


def mean_real_tokens(batches: list[dict[str, np.ndarray]]) -> float:
    return float(np.mean([b["input_mask"].sum() for b in batches]))


def hf_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our synthetic batch as Hugging Face's pre-training arguments (numpy)."""
    labels = np.full(batch["input_ids"].shape, -100, np.int64)  # (B, S): -100 = no prediction
    rows, cols = np.nonzero(batch["masked_lm_weights"])  # the real ones of the (B, P) predictions
    labels[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
    return {"input_ids": batch["input_ids"], "attention_mask": batch["input_mask"],  # (B, S) each
            "token_type_ids": batch["segment_ids"], "labels": labels,
            "next_sentence_label": batch["next_sentence_labels"][:, 0]}  # (B,)


def ours(bench, batch_size: int, peak, variant: str = "") -> Impl:
    compiled, lower_s, compile_s = bench.compile(batch_size)
    step = bench.stepper(compiled, batch_size)
    a = bench.args
    name, label = ("ours", "bert_jax train_step")
    if variant:
        name, label = f"ours {variant}", f"bert_jax train_step with {variant}"
    return Impl(name, label, jax.devices()[0].platform, lambda: step()["loss"],
                lower_s + compile_s, pretraining_flops(bench.cfg, batch_size, a.seq_len, a.max_predictions),
                "gathered", peak, bench.real_tokens(batch_size))


def torch_cpu_peak(torch, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n×n @ n×n float32 torch matmul on the CPU (median of ``repeats``)."""
    x = torch.randn(n, n)
    x @ x
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        x @ x
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


def hf_torch(bench, libs, batches, peak) -> Impl:
    torch, transformers = libs["torch"], libs["transformers"]
    torch.set_num_threads(bench.args.torch_threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32, as JAX's default float32 matmuls on GPUs
        known = published_peak(torch.cuda.get_device_name(0), "float32")
        peak = known or (None, f"{torch.cuda.get_device_name(0)}: no published peak known")
    elif jax.devices()[0].platform != "cpu":  # JAX measured the accelerator: measure the CPU torch runs on
        flops = torch_cpu_peak(torch)
        peak = flops, (f"measured in this run: torch 2048x2048 float32 matmul on {torch.get_num_threads()} "
                       "CPU threads, median of 5")
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(hf_config(transformers, bench.cfg)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    data = [{k: torch.from_numpy(v.astype(np.int64)).to(device) for k, v in hf_batch(b).items()} for b in batches]
    count = itertools.count()

    def step():
        out = model(**data[next(count) % len(data)])  # prediction_logits (B, S, V): the dense head
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if device == "cuda":
            torch.cuda.synchronize()
        return out.loss.detach()

    b, s = batches[0]["input_ids"].shape
    attention = model.config._attn_implementation  # "sdpa": torch.nn.functional.scaled_dot_product_attention
    label = f"transformers BertForPreTraining (torch {torch.__version__}, {attention} attention)"
    return Impl("hf-torch", label, device, step, None, dense_mlm_flops(bench.cfg, b, s), "dense", peak,
                mean_real_tokens(batches))


def hf_flax(bench, libs, batches, peak) -> Impl:
    transformers = libs["transformers"]
    b, s = batches[0]["input_ids"].shape
    model = transformers.FlaxBertForPreTraining(hf_config(transformers, bench.cfg), input_shape=(1, s),
                                                dtype=jnp.float32, _do_init=False)
    options = bench.compiler_options or None
    init = jax.jit(model.init_weights, static_argnums=1).lower(jax.random.key(0), (1, s)).compile(options)
    params = init(jax.random.key(0))  # random, from the config: nothing is downloaded
    tx = optax.adamw(1e-4, weight_decay=0.01)

    def loss_fn(params, batch, rng):
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], params=params,
                    dropout_rng=rng, train=True)
        labels = batch["labels"]  # (B, S), -100 = no prediction
        weights = labels >= 0
        mlm = optax.softmax_cross_entropy_with_integer_labels(out.prediction_logits, jnp.maximum(labels, 0))
        mlm = jnp.sum(mlm * weights) / jnp.maximum(jnp.sum(weights), 1)  # (B, S) -> mean over predictions
        nsp = optax.softmax_cross_entropy_with_integer_labels(out.seq_relationship_logits,  # (B, 2)
                                                              batch["next_sentence_label"]).mean()
        return mlm + nsp

    def train_step(params, opt_state, batch, rng, index):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(rng, index))
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    data = [jax.device_put({k: v.astype(np.int32) for k, v in hf_batch(x).items()}) for x in batches]
    state = {"params": params, "opt": jax.jit(tx.init)(params), "index": 0}
    rng = jax.random.key(1)
    t = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(
        state["params"], state["opt"], data[0], rng, np.uint32(0)).compile(options)
    compile_s = time.perf_counter() - t

    def step():
        i = state["index"]
        state["params"], state["opt"], loss = compiled(state["params"], state["opt"], data[i % len(data)], rng,
                                                       np.uint32(i))
        state["index"] = i + 1
        return jax.block_until_ready(loss)

    label = f"transformers FlaxBertForPreTraining + optax (flax {flax.__version__})"
    return Impl("hf-flax", label, jax.devices()[0].platform, step, compile_s, dense_mlm_flops(bench.cfg, b, s),
                "dense", peak, mean_real_tokens(batches))


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
    from bert_jax.benchmark import Bench

    a = bench.args
    libs = load_libraries(a.compare) if a.compare else {}
    peak = device_peak(a.dtype, bench.mesh.devices.size)
    data = bench.data(batch_size, packed=False)
    batches = [next(data) for _ in range(4)]  # the four batches ours cycles through (unless it packs)
    impls = [ours(bench, batch_size, peak)]
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
        r["ours_over_theirs"] = round(rows[0]["tokens_per_s"] / r["tokens_per_s"], 3)
        r["ours_over_theirs_real_tokens"] = round(rows[0]["real_tokens_per_s"] / r["real_tokens_per_s"], 3)
    versions = {k: v.__version__ for k, v in libs.items()}
    return {"mode": "compare", **bench.describe(batch_size), **{f"{k}_version": v for k, v in versions.items()},
            "steps": a.steps, "warmup": max(a.warmup, 1), "compare_block": max(a.compare_block, 1),
            "torch_threads": a.torch_threads if "hf-torch" in a.compare else None, "variants": a.variant,
            "flops_formula": FORMULA, "dense_mlm_head": "P = S", "implementations": rows,
            "ratio_tokens_per_s": {r["name"]: r["ours_over_theirs"] for r in rows[1:]},
            "ratio_real_tokens_per_s": {r["name"]: r["ours_over_theirs_real_tokens"] for r in rows[1:]}}


def summary(r: dict) -> str:
    w = max(14, *(len(x["name"]) for x in r["implementations"]))
    lines = [f"compare: BERT-{r['size']} ({r['num_params'] / 1e6:.1f}M params) seq_len {r['seq_len']} batch "
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
                     f"{mfu:>6} {x['ours_over_theirs']:>9.2f} {x['ours_over_theirs_real_tokens']:>7.2f}  "
                     f"{x['loss_first']} -> {x['loss_last']}")
    lines += [f"  {x['name']}: {x['label']}; peak {x['peak_source']}" for x in r["implementations"]]
    lines.append(f"  model FLOPs: {r['flops_formula']}; a dense MLM head has {r['dense_mlm_head']}")
    return "\n".join(lines)

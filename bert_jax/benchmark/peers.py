r"""Our step beside its peers in one process, taking turns (``python -m bert_jax.benchmark --variant`` and
``--compare``): variants of our step (its command line with flags added) and Hugging Face's BERT.

    pip install -e '.[bench]'    # transformers==4.57.6 and torch==2.13.0
    python -m bert_jax.benchmark --compare hf-torch,hf-torch-compile,hf-flax --size base --seq_len 128 --batch_size 8 \
        [--compare_block 5] [--torch_threads 2] [--variant "--rng_impl rbg"]

After ``--warmup`` untimed steps each, they take turns, ``--compare_block`` timed steps at a time, each
step queued behind the running one as the trainer runs ours: a change in the machine's speed falls on
all of them. The references are built from our `BertConfig`
(random initialisation) and fed our batches on one device: PyTorch's in ``--dtype`` (bfloat16 under
autocast; ``hf-torch-compile`` under ``torch.compile``), Flax's in float32; their MLM head projects all
S positions onto the vocabulary (model FLOPs with P = S). On a GPU, start with
XLA_PYTHON_CLIENT_PREALLOCATE=false so that PyTorch finds memory beside JAX.
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

from bert_jax.benchmark import timing
from bert_jax.benchmark.flops import dense_mlm_flops, device_peak, published_peak
from input_pipeline import command_line as cli

IMPLEMENTATIONS = ("hf-torch", "hf-torch-compile", "hf-flax")


@dataclasses.dataclass
class Impl:
    """One implementation under test, a `bert_jax.benchmark.timing.Runner`: ``launch()`` queues one
    training step, ``wait(handle)`` waits for its loss and returns it as a float, ``finish(handle)``
    waits for the whole step; ``step()`` runs one and waits."""

    name: str
    label: str
    device: str
    launch: Callable[[], Any]
    wait: Callable[[Any], float]
    finish: Callable[[Any], float]
    compile_s: float | None
    flops: int  # model FLOPs per step
    mlm_head: str  # "gathered" (P positions) | "dense" (all S)
    peak: tuple[float | None, str]  # (FLOP/s, source)
    real_tokens: float  # mean real (not padding) tokens per step

    def step(self) -> float:
        return self.finish(self.launch())


def check_args(parser, args) -> None:
    """``parser.error`` unless ``--compare`` / ``--variant`` describe a comparison we can run."""
    unknown = sorted(set(args.compare) - set(IMPLEMENTATIONS))
    if unknown:
        parser.error(f"--compare {','.join(unknown)}: expected a comma list of {', '.join(IMPLEMENTATIONS)}")
    if args.compare and args.model != "bert":
        parser.error(f"--compare times Hugging Face's BertForPreTraining: it goes with --model bert, not "
                     f"--model {args.model}")
    if args.memory_only or args.find_max_batch:
        parser.error("--compare and --variant time steps: they do not go with --memory_only or --find_max_batch")
    if "hf-flax" in args.compare and any(a.dtype != "float32" for a in [args, *(v for _, v in args.variants)]):
        parser.error("--compare hf-flax runs in float32: leave --dtype at float32 (hf-torch follows --dtype)")
    if args.compare and math.prod(int(x) for x in args.mesh.split(",")) != 1:
        parser.error(f"--compare runs on one device (the references know no mesh): --mesh {args.mesh} is not 1,1,1")


def load_libraries(names: list[str]) -> dict:
    """{"transformers": module, "torch": module} for the implementations ``names``; a missing or
    unsuitable package is a `cli.UserError` saying how to install the 'bench' extra."""
    os.environ.setdefault("USE_TF", "0")  # transformers need not import TensorFlow (4 s)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from a config: never the hub
    libs, missing = {}, []
    torch_needed = any(n.startswith("hf-torch") for n in names)
    for module in ["transformers", "torch"] if torch_needed else ["transformers"] if names else []:
        try:
            libs[module] = importlib.import_module(module)
        except ImportError:
            missing.append(module)
    hint = "pip install -e '.[bench]' (transformers==4.57.6, torch==2.13.0)"
    if missing:
        raise cli.UserError(f"--compare {','.join(names)} needs {' and '.join(missing)}: {hint}")
    if "hf-flax" in names and not hasattr(libs["transformers"], "FlaxBertForPreTraining"):
        raise cli.UserError(f"transformers {libs['transformers'].__version__} has no FlaxBertForPreTraining "
                            f"(Flax models are gone from transformers 5): {hint}")
    return libs


def ours(bench, batch_size: int, peak, variant: str = "") -> Impl:
    compiled, compile_s = bench.compile(batch_size)
    step, tokens = bench.stepper(compiled, batch_size), bench.block_tokens(batch_size)
    label = "bert_jax train_step" + (f" with {variant}" if variant else "")
    if bench.args.unpad_multiple:
        label += (f" (blocks on {tokens} of {batch_size * bench.args.seq_len} token slots)" if tokens
                  else " (no padding to skip: the padded step)")
    return Impl(f"ours {variant}".strip(), label, jax.devices()[0].platform, step.launch,
                lambda m: float(step.wait(m)["loss"]), lambda m: float(step.finish(m)["loss"]), compile_s,
                bench.flops(batch_size), "gathered", peak, step.real_tokens)


def hf_config(transformers, cfg, **kwargs):
    """Hugging Face's BertConfig for our ``cfg``: the same sizes, activation, dropout and initialiser."""
    return transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act=cfg.hidden_act,
        hidden_dropout_prob=cfg.hidden_dropout_prob, attention_probs_dropout_prob=cfg.attention_dropout_prob,
        max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.initializer_range, **kwargs)


def hf_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our batch as Hugging Face's pre-training arguments."""
    labels = np.full(batch["input_ids"].shape, -100, np.int64)  # [B, S]: -100 = no prediction
    rows, cols = np.nonzero(batch["masked_lm_weights"])  # the real ones of the [B, P] predictions
    labels[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
    return {"input_ids": batch["input_ids"], "attention_mask": batch["input_mask"], "token_type_ids":
            batch["segment_ids"], "labels": labels, "next_sentence_label": batch["next_sentence_labels"]}


def hf_torch(cfg, libs, batches, peak, threads: int, dtype: str = "float32", compiled: bool = False) -> Impl:
    """Hugging Face's BertForPreTraining with PyTorch's scaled-dot-product attention, its AdamW (fused on
    a GPU), ``dtype`` "bfloat16" under ``torch.autocast`` (parameters and optimizer in float32, as ours),
    "float32" with TF32 matmuls on a GPU; ``compiled``: the model under ``torch.compile``."""
    torch, transformers = libs["torch"], libs["transformers"]
    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32, as JAX's default float32 matmuls on GPUs
        peak = published_peak(torch.cuda.get_device_name(0), dtype) or (None, "no published peak known")
    elif jax.devices()[0].platform != "cpu":  # JAX's peak is the accelerator's, not this CPU's
        peak = (None, "torch on the CPU: no peak measured")
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(hf_config(transformers, cfg, attn_implementation="sdpa")).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=device == "cuda")
    forward = torch.compile(model) if compiled else model
    data = [{k: torch.from_numpy(v.astype(np.int64)).to(device) for k, v in hf_batch(b).items()} for b in batches]
    count = itertools.count()
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def launch():
        """One step queued on the GPU (run, on a CPU): (its loss on the host, an event after the step)."""
        with autocast:
            loss = forward(**data[next(count) % len(data)]).loss  # prediction_logits [B, S, V]: the dense head
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device != "cuda":
            return loss.detach().float(), None
        # Copied and marked in the stream's order: waiting for this step never waits for one queued after it.
        host = loss.detach().float().to("cpu", non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    def wait(handle) -> float:
        host, done = handle
        if done is not None:
            done.synchronize()
        return float(host)

    compile_s = None
    if compiled:  # the first step compiles: timed here, not among the steps
        t = time.perf_counter()
        wait(launch())
        compile_s = time.perf_counter() - t
    b, s = batches[0]["input_ids"].shape
    label = (f"transformers {transformers.__version__} BertForPreTraining (torch {torch.__version__}, "
             f"{model.config._attn_implementation} attention, "
             + ("bfloat16 autocast" if dtype == "bfloat16" else "float32") + (", torch.compile" if compiled else "")
             + (", fused AdamW" if device == "cuda" else "") + ")")
    return Impl("hf-torch-compile" if compiled else "hf-torch", label, device, launch, wait, wait, compile_s,
                dense_mlm_flops(cfg, b, s), "dense", peak, float(np.mean([x["input_mask"].sum() for x in batches])))


def hf_flax(cfg, libs, batches, peak, options) -> Impl:
    transformers = libs["transformers"]
    b, s = batches[0]["input_ids"].shape
    model = transformers.FlaxBertForPreTraining(hf_config(transformers, cfg), input_shape=(1, s), dtype=jnp.float32,
                                                _do_init=False)
    params = jax.jit(model.init_weights, static_argnums=1)(jax.random.key(0), (1, s))  # random: nothing downloaded
    tx = optax.adamw(1e-4, weight_decay=0.01)

    def loss_fn(params, batch, rng):
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], params=params,
                    dropout_rng=rng, train=True)
        labels = batch["labels"]  # [B, S], -100 = no prediction
        mlm = optax.softmax_cross_entropy_with_integer_labels(out.prediction_logits, jnp.maximum(labels, 0))
        mlm = jnp.sum(mlm * (labels >= 0)) / jnp.maximum(jnp.sum(labels >= 0), 1)  # mean over predictions
        return mlm + optax.softmax_cross_entropy_with_integer_labels(  # NSP: [B, 2] logits
            out.seq_relationship_logits, batch["next_sentence_label"]).mean()

    def train_step(params, opt_state, batch, rng, index):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(rng, index))
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    data = [jax.device_put({k: v.astype(np.int32) for k, v in hf_batch(x).items()}) for x in batches]
    state, rng = {"params": params, "opt": jax.jit(tx.init)(params), "index": 0}, jax.random.key(1)
    t = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, state["opt"], data[0], rng,
                                                                np.uint32(0)).compile(options)
    compile_s = time.perf_counter() - t

    def launch():
        i = state["index"]
        state["params"], state["opt"], loss = compiled(state["params"], state["opt"], data[i % len(data)], rng,
                                                       np.uint32(i))
        state["index"] = i + 1
        return loss

    def finish(loss) -> float:
        return float(jax.block_until_ready((state["params"], state["opt"], loss))[2])

    return Impl("hf-flax", f"transformers FlaxBertForPreTraining + optax (flax {flax.__version__})",
                jax.devices()[0].platform, launch, lambda loss: float(jax.block_until_ready(loss)), finish, compile_s,
                dense_mlm_flops(cfg, b, s), "dense", peak,
                float(np.mean([x["input_mask"].sum() for x in batches])))


def alternate(impls: list[Impl], warmup: int, steps: int, block: int) -> dict[str, tuple[list[float], list]]:
    """Warm-up steps for each, then turns of ``block`` timed steps each until every one has ``steps``,
    each step queued behind the running one as the trainer runs ours (`timing.queued_times`; a turn
    ends with the device idle): {name: (step seconds, losses)}."""
    out = {i.name: ([], []) for i in impls}
    for impl in impls:
        out[impl.name][1].extend(impl.step() for _ in range(warmup))
    while any(len(out[i.name][0]) < steps for i in impls):
        for impl in impls:
            times, losses = out[impl.name]
            if n := min(block, steps - len(times)):
                turn, results = timing.queued_times(impl, n)
                times.extend(turn)
                losses.extend(results)
    return out


def compare(bench, variants: list, libs: dict, batch_size: int) -> dict:
    """Times ``bench``'s step, the ``variants`` ([(flags, their Bench)]) and the ``--compare``
    references on ``batch_size``, taking turns; one "compare" result."""
    a, devices = bench.args, bench.mesh.devices.size
    peak = device_peak(a.dtype, devices)
    impls, failed = [ours(bench, batch_size, peak)], {}
    for name, v in variants:  # a variant that does not build or compile is reported, the others still timed
        try:
            impls.append(ours(v, batch_size, peak if v.args.dtype == a.dtype else device_peak(v.args.dtype, devices),
                              name))
        except Exception as e:  # noqa: BLE001 - whatever the compiler raises
            failed[name] = f"{type(e).__name__}: {cli.message(e)}"[:300]
    batches = bench.host_batches(batch_size, packed=False)  # the unpacked batches ours cycles through
    impls += [hf_flax(bench.cfg, libs, batches, peak, bench.options) if n == "hf-flax" else
              hf_torch(bench.cfg, libs, batches, peak, a.torch_threads, a.dtype, compiled=n == "hf-torch-compile")
              for n in a.compare]
    timed = alternate(impls, max(a.warmup, 1), a.steps, a.compare_block)
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
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4), "mlm_head": impl.mlm_head,
            "model_flops_per_step": impl.flops, "achieved_flops_per_s": round(flop_s),
            "peak_flops_per_s": peak_flops and round(peak_flops), "peak_source": source,
            "mfu": peak_flops and round(flop_s / peak_flops, 4)})
    for r in rows:  # > 1: ours is faster
        r["ours_over_theirs"] = round(rows[0]["tokens_per_s"] / r["tokens_per_s"], 3)
        r["ours_over_theirs_real_tokens"] = round(rows[0]["real_tokens_per_s"] / r["real_tokens_per_s"], 3)
    return {"mode": "compare", **bench.describe(batch_size),
            **{f"{k}_version": v.__version__ for k, v in libs.items()}, "steps": a.steps, "warmup": max(a.warmup, 1),
            "compare_block": a.compare_block, "variants": a.variant, "implementations": rows, "failed": failed,
            "ratio_tokens_per_s": {r["name"]: r["ours_over_theirs"] for r in rows[1:]},
            "ratio_real_tokens_per_s": {r["name"]: r["ours_over_theirs_real_tokens"] for r in rows[1:]}}


def summary(r: dict) -> str:
    lines = [f"compare: {r['model']}-{r['size']} seq_len {r['seq_len']} batch {r['batch_size']} "
             f"P {r['max_predictions']} {r['dtype']} on {r['device_kind']} (load {r['load_average'][0]}); "
             f"{r['steps']} timed steps each, in turns of {r['compare_block']} after {r['warmup']} warm-up"]
    for x in r["implementations"]:
        mfu = "-" if x["mfu"] is None else f"{100 * x['mfu']:.1f}%"
        compile_s = "" if x["compile_s"] is None else f", compiled in {x['compile_s']:.1f} s"
        lines += [f"  {x['name']}: median {x['step_time_median_s'] * 1e3:.1f} ms (min {x['step_time_min_s'] * 1e3:.1f})"
                  ", "
                  f"{x['tokens_per_s']:.0f} tokens/s ({x['real_tokens_per_s']:.0f} real); ours/this "
                  f"{x['ours_over_theirs']:.2f} (real tokens {x['ours_over_theirs_real_tokens']:.2f}); "
                  f"{x['model_flops_per_step'] / 1e9:.2f} GFLOP ({x['mlm_head']} MLM head), MFU {mfu}; loss "
                  f"{x['loss_first']} -> {x['loss_last']}{compile_s}", f"    {x['label']}; peak {x['peak_source']}"]
    lines += [f"  ours {name}: failed to build or compile: {why}" for name, why in r.get("failed", {}).items()]
    return "\n".join(lines)

"""The Hugging Face reference steps that ``--compare`` times beside ours (bert_jax/benchmark/compare.py):
transformers' ``BertForPreTraining`` (PyTorch) and ``FlaxBertForPreTraining`` (a jitted optax step),
built from our `bert_jax.model.config.BertConfig` and fed our synthetic batches; the optional 'bench'
packages (``pip install -e '.[bench]'``: transformers==4.57.6, torch==2.13.0) load here.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
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

from bert_jax.benchmark.flops import dense_mlm_flops, published_peak
from bert_jax.benchmark.timing import mean_real_tokens

IMPLEMENTATIONS = ("hf-torch", "hf-flax")


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


def hf_config(transformers, cfg):
    """Hugging Face's BertConfig for our ``cfg``: the same sizes, activation, dropout and initialiser."""
    return transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act=cfg.hidden_act,
        hidden_dropout_prob=cfg.hidden_dropout_prob, attention_probs_dropout_prob=cfg.attention_dropout_prob,
        max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.initializer_range)


def hf_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our synthetic batch as Hugging Face's pre-training arguments (numpy)."""
    labels = np.full(batch["input_ids"].shape, -100, np.int64)  # (B, S): -100 = no prediction
    rows, cols = np.nonzero(batch["masked_lm_weights"])  # the real ones of the (B, P) predictions
    labels[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
    return {"input_ids": batch["input_ids"], "attention_mask": batch["input_mask"],  # (B, S) each
            "token_type_ids": batch["segment_ids"], "labels": labels,
            "next_sentence_label": batch["next_sentence_labels"]}  # (B,)


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

"""The trainers' steps as the benchmark's tools build, compile and size them (`bert_jax.benchmark.step`
times them on this machine, `bert_jax.benchmark.aot` compiles them for a TPU): the benchmark's only
imports of the trainers."""

from __future__ import annotations

import functools

from bert_jax.config_args import is_finetuning


def build(config, mesh):
    """(the trainer's `Steps`, its model's `BertConfig`, {key: (shape, dtype)} of a batch of
    ``config.batch_size``) for a resolved ``config`` on ``mesh``, as ``train.py`` builds them:
    pre-training's (configs/pretrain.py), or fine-tuning's for a config with a ``task``."""
    vocab, b = config.model.get("vocab_size") or 30522, config.batch_size
    if is_finetuning(config):
        from bert_jax.finetuning import task as ft
        from input_pipeline.tasks import make_task
        from input_pipeline.tasks.base import feature_shapes

        # Only the task's kind and labels: no data is read ("tfds" reads nothing until asked).
        task = make_task({**config.task.to_dict(), "source": config.task.get("source") or "tfds"})
        cfg = ft.model_config(config, None, vocab, task.kind)
        shapes = {**feature_shapes(task.kind, b, config.max_seq_length), "weight": ((b,), "float32")}
        return ft.jit_finetuning_steps(config, cfg, task.kind, task.num_labels, 1000, mesh), cfg, shapes
    from bert_jax.pretraining.objective import jit_pretraining_steps
    from bert_jax.resolve import described_model
    from input_pipeline.pretraining.batch import shapes

    cfg, data = described_model(config.model, vocab_size=vocab), config.data
    return jit_pretraining_steps(config, cfg, mesh), cfg, shapes(b, data.max_seq_length, data.max_predictions_per_seq,
                                                                 data.pack_examples)


def update_fn(steps):
    """The optimizer update alone, as the trainer's step ends: (state, gradients) -> (state, metrics)."""
    from bert_jax.training.steps import apply_gradients

    return functools.partial(apply_gradients, tx=steps.layout.tx, schedule=steps.schedule, metrics={}, norm=steps.norm)


def memory(compiled) -> dict | None:
    """XLA's memory analysis of a compiled step per device, in bytes (None where the backend has none):
    ``total`` = arguments + outputs − aliased (the donated state counts once) + temporaries + code."""
    try:
        m = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError, AttributeError):
        m = None
    if m is None:
        return None
    names = {"arguments": "argument", "outputs": "output", "aliased": "alias", "temporaries": "temp",
             "generated_code": "generated_code"}
    out = {k: int(getattr(m, f"{v}_size_in_bytes", 0) or 0) for k, v in names.items()}
    return {**out, "total": out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
            + out["generated_code"]}


def largest_fitting(mem, budget: float, limit: int = 1 << 16, known: dict | None = None) -> int:
    """The largest n in [0, limit] with ``mem(n) <= budget`` for an increasing ``mem`` (each call a
    compile; ``known``: values already computed, updated). Memory is nearly affine in the batch: the
    line through n = 1 and 2 guesses, then bisection between the nearest fit and miss."""
    known = {} if known is None else known

    def m(n: int) -> float:
        if n not in known:
            known[n] = mem(n)
        return known[n]

    if m(1) > budget:
        return 0
    lo, hi = 1, limit + 1  # lo fits, hi does not (limit + 1: not known)
    guess = 1 + int((budget - m(1)) // max(m(2) - m(1), 1e-9)) if limit > 1 else 1
    for p in (guess, guess + 1):
        if lo < p < hi:
            lo, hi = (p, hi) if m(p) <= budget else (lo, p)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if m(mid) <= budget else (lo, mid)
    return lo

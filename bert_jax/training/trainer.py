"""Pre-training: ``run(config, workdir)`` (``train.py`` with configs/pretrain.py or configs/demo.py).

`build_steps` makes the jitted, sharded ``train_step`` (donated state) and ``eval_step`` on a
('data', 'fsdp', 'tensor') mesh from the config: the same function serves the trainer, the
benchmark and ahead-of-time compilation, so what they measure is what runs. `run` adds the input
(each process its own share; prefetched onto the devices in a background thread), resume from the
newest checkpoint in the workdir (parameters, optimizer state, step and every process's input
position), held-out evaluation at step 0 and every ``eval_every`` steps, the collapse warning
(`bert_jax.training.health`: each train window and evaluation against the step-0 evaluation) and
the shared loop (`bert_jax.training.loop`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from bert_jax.model.config import BertConfig
from bert_jax.model.execution import resolve_per_device_batch
from bert_jax.resolve import described_model
from bert_jax.training import health
from bert_jax.training import sharding as sh
from bert_jax.training import train_step as ts
from bert_jax.training.checkpoints import Checkpointer
from bert_jax.training.job import job
from bert_jax.training.loop import train_loop
from bert_jax.training.metric_writer import MetricWriter, read_metrics
from bert_jax.training.progress import Progress
from bert_jax.training.resume import check_workdir_model, gather_data_states, initial_state
from bert_jax.training.steps import Steps, jit_steps


def model_config(config, vocab_size: int) -> BertConfig:
    """The model ``config.model`` describes, with the vocabulary's size."""
    return described_model(config.model, vocab_size=vocab_size)


class BlockRows:
    """Rows ``[i * rows, (i + 1) * rows)`` of every batch of ``source``; its position is the source's."""

    def __init__(self, source, i: int, rows: int):
        self.source, self.rows = source, slice(i * rows, (i + 1) * rows)

    def state(self) -> dict:
        return self.source.state()

    def restore(self, state: dict) -> None:
        self.source.restore(state)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return {k: v[self.rows] for k, v in next(self.source).items()}


def make_input(config, split: str, block: tuple[int, int] = (0, 1)):
    """An iterator of this process's rows of the global batches, block i of n (`sh.process_block`),
    with ``state()``/``restore()``. Synthetic and in-memory text input give the same global batches
    for any n; TFRecord shards are split by file (process i reads files i::n)."""
    i, n = block
    if config.batch_size % n:
        raise ValueError(f"batch_size {config.batch_size} is not divisible by {n} processes")
    local = config.batch_size // n
    if config.data.kind == "synthetic":
        if config.data.pack_examples:
            raise ValueError("config.data.pack_examples needs data.kind='pretraining' (synthetic batches "
                             "are not packed; the benchmark packs them with --packing K)")
        from input_pipeline.pretraining.synthetic import SyntheticBatches

        batches = SyntheticBatches(batch_size=config.batch_size, seq_len=config.data.max_seq_length,
                                   max_predictions=config.data.max_predictions_per_seq,
                                   vocab_size=config.model.vocab_size,
                                   seed=config.seed * 1000 + (7 if split == "eval" else 0))
        return batches if n == 1 else BlockRows(batches, i, local)
    if config.data.kind == "pretraining":
        from input_pipeline.pretraining.dataset import make_pretraining_dataset

        return make_pretraining_dataset(config, split=split, batch_size=local, process_index=i, process_count=n)
    raise ValueError(f"config.data.kind={config.data.kind!r}: expected 'pretraining' or 'synthetic'")


def unpadded(place, config, mesh, rules, accumulation: int = 1):
    """``place`` that first adds ``token_index`` when ``config.unpad_multiple`` > 0."""
    multiple = config.unpad_multiple
    if multiple and jax.process_count() > 1:
        raise ValueError("config.unpad_multiple needs a single process: every process would have to agree on "
                         "each batch's number of real tokens while seeing only its own rows (docs/pretraining.md)")
    if multiple and accumulation > 1:
        raise ValueError("config.unpad_multiple does not go with micro-batches: set per_device_batch=0")
    from input_pipeline.unpadding import adding_token_index

    return adding_token_index(place, sh.batch_shards(mesh, rules), multiple) if multiple else place


def vocab_size_of(config) -> int:
    if config.data.kind == "synthetic":
        return config.model.vocab_size
    from input_pipeline.package_data import resolve
    from input_pipeline.tokenizers.factory import load_tokenizer

    if not config.data.get("vocab"):
        raise ValueError("config.data.vocab is empty: set --config.data.vocab=PATH (a vocab.txt, a SentencePiece "
                         ".model or a directory holding one)")
    return load_tokenizer(resolve(config.data.vocab)).vocab_size


def electra_settings(config) -> dict | None:
    """``config.electra`` (generator_fraction, rtd_weight, rtd_prior) for objective "rtd", else None."""
    if config.objective != "rtd":
        return None
    if "electra" not in config:
        raise ValueError("objective 'rtd' needs config.electra (generator_fraction, rtd_weight): "
                         "use configs/pretrain.py:model=electra")
    settings = dict(config.electra)
    prior = settings.get("rtd_prior", 0.0)  # a hand-written config from before the key: the zero bias
    if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0.0 <= prior < 1.0:
        raise ValueError(f"config.electra.rtd_prior={prior!r}: expected 0 (the discriminator's output bias "
                         "starts at 0) or the replaced fraction it starts at, in (0, 1)")
    return settings


def accumulation_steps(config, mesh: Mesh, rules) -> int:
    """Micro-batches per optimizer step from the one knob, ``config.per_device_batch`` (resolved: a
    number; `bert_jax.resolve`): N > 0 rows per batch shard (data x fsdp devices) in a micro-batch
    gives ``batch_size / (N * batch shards)`` of them, so one recipe runs on any slice; 0: one."""
    value = config.per_device_batch
    if value == "auto":
        raise ValueError("per_device_batch='auto' is not resolved: resolve the config first (bert_jax.resolve)")
    per_device = resolve_per_device_batch(value, "", rows=0)
    if not per_device:
        return 1
    shards = sh.batch_shards(mesh, rules)
    if config.batch_size % (per_device * shards):
        raise ValueError(f"batch_size {config.batch_size} is not a multiple of per_device_batch {per_device} x "
                         f"{shards} batch shards (mesh {dict(mesh.shape)}): choose per_device_batch dividing "
                         f"{config.batch_size // shards if config.batch_size % shards == 0 else 'batch_size / shards'}")
    return config.batch_size // (per_device * shards)


def build_steps(config, model_cfg: BertConfig, mesh: Mesh) -> Steps:
    """Pre-training's model, objective and optimizer (``config.optimizer``) through the shared
    builder (`bert_jax.training.steps.jit_steps`). Gradient accumulation is a ``lax.scan`` inside
    the step (one call = one optimizer step over `accumulation_steps` micro-batches)."""
    optimizer = config.optimizer.to_dict()
    if optimizer.get("generator_lr_scale", 1.0) != 1.0 and config.objective != "rtd":
        raise ValueError(f"--config.optimizer.generator_lr_scale={optimizer['generator_lr_scale']}: ELECTRA's "
                         f"generator rate (objective 'rtd'); objective {config.objective!r} has no generator")
    rules = tuple(tuple(r) for r in config.sharding_rules)
    accumulation = accumulation_steps(config, mesh, rules)
    make_model = ts.pretraining_model(model_cfg, config.objective, electra_settings(config))
    return jit_steps(make_model, optimizer, mesh, rules,
                     functools.partial(ts.train_step, accumulation_steps=accumulation), ts.eval_step, accumulation)


def evaluate(eval_fn, state, data, num_batches: int, mesh, rules,
             interrupted: Callable[[], bool] = lambda: False) -> dict | None:
    """Held-out metrics over ``num_batches`` batches; None if ``interrupted()`` turns true on the way."""
    totals = None
    for _ in range(num_batches):
        if interrupted():
            return None
        # Summed on the host: a handful of scalars and histograms, and no eager op on arrays sharded
        # over every device (each would compile a program; one such add aborted a CPU test run).
        sums = jax.device_get(eval_fn(state.params, sh.global_batch(next(data), mesh, rules)))
        totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
    return {k: float(v) for k, v in ts.summarize(totals).items()}


def step0_reference(workdir) -> dict | None:
    """The step-0 evaluation recorded in ``workdir``'s metrics.jsonl (the last, if recorded twice),
    or None: a resumed run's reference for the collapse warning."""
    try:
        rows = [r for r in read_metrics(workdir, "eval") if r["step"] == 0]
    except (FileNotFoundError, ValueError):
        return None
    return rows[-1] if rows else None


def eval_source(config) -> str | None:
    """What the held-out evaluation reads, or None when it is switched off (``eval_every=0`` or
    ``eval_steps=0``). Evaluation on with no held-out data is an error: a long run would otherwise
    train blind (docs/data.md builds held-out shards)."""
    if not (config.eval_every and config.eval_steps):
        return None
    d = config.data
    if d.kind == "synthetic":
        return "synthetic batches"
    if d.eval_input:
        return d.eval_input
    if d.eval_fraction:
        from input_pipeline.pretraining.dataset import held_out_every

        return f"every {held_out_every(d.eval_fraction)}th document of {d.input}"
    raise ValueError("no held-out data: set --config.data.eval_input to held-out shards (docs/data.md), or "
                     "--config.data.eval_fraction=F to hold out documents of text input, or --config.eval_every=0 "
                     "to train without evaluation")


def _eval_input(config, block: tuple[int, int]):
    return None if eval_source(config) is None else make_input(config, "eval", block)


def run(config, workdir: str | Path, preemption=None) -> dict:
    """Pre-trains per ``config`` in ``workdir``; returns the last logged train/eval metrics."""
    with job(config, workdir, preemption, check=check_workdir_model) as j:
        return _run(config, j)


def _run(config, j) -> dict:
    config, workdir, is_main, preemption = j.config, j.workdir, j.is_main, j.preemption
    model_cfg = model_config(config, vocab_size_of(config))
    if config.data.max_seq_length > model_cfg.max_length:
        raise ValueError(f"--config.data.max_seq_length={config.data.max_seq_length}: expected at most "
                         f"{model_cfg.max_length} (the model's max_position_embeddings)")
    steps = build_steps(config, model_cfg, sh.make_mesh(tuple(config.mesh_shape)))
    mesh, rules = steps.mesh, steps.rules
    block = sh.process_block(mesh, rules, config.batch_size)
    data = make_input(config, "train", block)
    eval_data = _eval_input(config, block)
    # Every evaluation reads the same held-out batches (the same dynamic masks too): a step's
    # numbers then depend on its parameters alone, not on how many evaluations came before it (the
    # cadence, a resume), and the collapse warning compares like with like against step 0.
    eval_start = eval_data.state() if eval_data is not None else None
    ckpt = Checkpointer(workdir, keep=config.keep_checkpoints)
    writer = MetricWriter(workdir, enabled=is_main)
    place = unpadded(functools.partial(sh.global_batch, mesh=mesh, rules=rules), config, mesh, rules,
                     steps.accumulation_steps)
    prefetch = config.prefetch_batches
    batches = None
    last = {}
    try:
        state = initial_state(config, steps, ckpt, data, block, model=model_cfg)
        if prefetch:  # read, pack and place the next batches while the step runs
            from bert_jax.training.prefetch import DevicePrefetch

            batches = DevicePrefetch(data, place, prefetch)
        total = config.num_train_steps

        def meta(step: int) -> dict:
            states = gather_data_states((batches if prefetch else data).state(), block[0])
            return {"data": states[0], "data_per_process": states, "step": step, "model": dataclasses.asdict(model_cfg)}

        monitor = health.HealthMonitor(warmup_steps=config.optimizer.warmup_steps, enabled=is_main,
                                       advice=health.advice(config.optimizer), total_steps=config.num_train_steps)

        def evaluate_and_log(state, step: int) -> bool:
            if eval_data.state() != eval_start:
                eval_data.restore(eval_start)
            result = evaluate(steps.eval_fn, state, eval_data, config.eval_steps, mesh, rules, preemption.arrived)
            if result is None:  # interrupted by a signal: the loop saves this step and stops
                return False
            last["eval"] = result
            writer.write(step, last["eval"], "eval")
            if is_main:
                print(f"eval at step {step}: " + json.dumps({k: round(v, 4) for k, v in last["eval"].items()}),
                      flush=True)
            monitor.check(step, result, "eval")
            return True

        def after_step(state, step: int) -> None:
            if eval_data is not None and (step % config.eval_every == 0 or step == total):
                evaluate_and_log(state, step)

        # The collapse warning's reference: the step-0 evaluation (recorded like any other, so a
        # resumed run reads it back), or without held-out data the first training step's metrics
        # (the initial parameters on a training batch).
        if int(state.step) == 0 and eval_data is not None:
            if evaluate_and_log(state, 0):
                monitor.reference = last["eval"]
        elif is_main and int(state.step) > 0:
            monitor.reference = step0_reference(workdir)
        first = []  # the first step's metrics, while there is no reference

        def first_step_kept(state, batch, rng):
            state, metrics = steps.train_fn(state, batch, rng)
            if not first:
                first.append(metrics)
            return state, metrics

        def on_log(step: int, summary: dict) -> None:
            if monitor.enabled and monitor.reference is None and first:
                monitor.reference = {k: float(v) for k, v in jax.device_get(first[0]).items()}
            monitor.check(step, summary, "train")

        keep_first = int(state.step) == 0 and monitor.reference is None
        result = train_loop(
            state, first_step_kept if keep_first else steps.train_fn, batches if prefetch else map(place, data),
            jax.random.key(config.seed, impl=config.rng_impl), total=total, ckpt=ckpt,
            writer=writer, progress=Progress(int(state.step), total, config.batch_size, enabled=is_main),
            log_every=config.log_every, checkpoint_every=config.checkpoint_every, meta=meta, after_step=after_step,
            preemption=preemption, on_log=on_log)
        if result.train:
            last["train"] = result.train
    finally:
        if batches is not None:
            batches.close()
        ckpt.close()
        writer.close()
    return {k: last[k] for k in ("train", "eval") if k in last}

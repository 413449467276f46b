"""The pre-training loop: ``run(config, workdir)``. ``train.py`` only parses flags and calls this.

One jitted, sharded ``train_step`` (donated state) on a ('data', 'fsdp', 'tensor') mesh; the same
code runs on a CPU, one GPU or a TPU pod slice. The loop writes ``config.json`` at start, logs
progress (steps/s, examples/s, ETA), writes TensorBoard events and ``metrics.jsonl``, evaluates
every ``eval_every`` steps, saves Orbax checkpoints every ``checkpoint_every`` steps, at the end and
on SIGTERM (preemption), resumes from the newest checkpoint in the workdir, and stops with a clear
message if the loss is NaN/Inf, never saving a checkpoint after it. With
``config.prefetch_batches`` > 0 the next batches are placed on the devices in a background thread
(`bert_jax.training.prefetch.DevicePrefetch`) while the step runs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import signal
import sys
import time
from pathlib import Path

import jax
import numpy as np

from bert_jax.model.config import BertConfig
from bert_jax.training import sharding as sh
from bert_jax.training import train_step as ts
from bert_jax.training.checkpoints import Checkpointer, abstract_target, as_path
from bert_jax.training.metric_writer import MetricWriter
from bert_jax.training.optim import make_optimizer

log = logging.getLogger(__name__)


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or Inf; the workdir keeps the last good checkpoint."""


def model_config(config, vocab_size: int) -> BertConfig:
    m = config.model
    overrides = {k: v for k, v in m.items() if k not in ("size",) and v is not None}
    return BertConfig.from_size(m.size, **{**overrides, "vocab_size": vocab_size})


def make_input(config, split: str, process_index: int, process_count: int):
    """An iterator of this process's share of the global batches, with ``state()``/``restore()``."""
    if config.batch_size % process_count:
        raise ValueError(f"batch_size {config.batch_size} is not divisible by {process_count} processes")
    local = config.batch_size // process_count
    if config.data.kind == "synthetic":
        if config.data.get("pack_examples", 0):
            raise ValueError("config.data.pack_examples needs data.kind='pretraining' (synthetic batches "
                             "are not packed; the benchmark packs them with --packing K)")
        seed = config.seed * 1000 + process_index + (7 if split == "eval" else 0)
        from input_pipeline.synthetic import SyntheticBatches

        return SyntheticBatches(batch_size=local, seq_len=config.data.max_seq_length,
                                max_predictions=config.data.max_predictions_per_seq,
                                vocab_size=config.model.vocab_size, seed=seed)
    if config.data.kind == "pretraining":
        from input_pipeline.dataset import make_pretraining_dataset

        return make_pretraining_dataset(config, split=split, batch_size=local,
                                        process_index=process_index, process_count=process_count)
    raise ValueError(f"config.data.kind={config.data.kind!r}: expected 'pretraining' or 'synthetic'")


def unpadded(place, config, mesh, rules):
    """``place`` that first adds ``token_index`` when ``config.unpad_multiple`` > 0."""
    multiple = config.get("unpad_multiple", 0)
    if multiple and jax.process_count() > 1:
        raise ValueError("config.unpad_multiple needs a single process: every host would have to agree on "
                         "each batch's number of real tokens")
    if multiple and config.optimizer.accumulation_steps > 1:
        raise ValueError("config.unpad_multiple does not go with optimizer.accumulation_steps > 1")
    from input_pipeline.unpadding import adding_token_index

    return adding_token_index(place, sh.batch_shards(mesh, rules), multiple) if multiple else place


def vocab_size_of(config) -> int:
    if config.data.kind == "synthetic":
        return config.model.vocab_size
    from input_pipeline.package_data import resolve
    from input_pipeline.tokenizer_factory import load_tokenizer

    return load_tokenizer(resolve(config.data.vocab)).vocab_size


class Progress:
    """A tqdm bar on a terminal, a plain log line per ``log_every`` steps otherwise."""

    def __init__(self, start: int, total: int, examples_per_step: int, enabled: bool):
        self.start, self.total, self.per_step = start, total, examples_per_step
        self.t0, self.last_t, self.last_step = time.time(), time.time(), start
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
        self.enabled = enabled

    def update(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)

    def report(self, step: int, metrics: dict) -> dict:
        now = time.time()
        rate = (step - self.last_step) / max(now - self.last_t, 1e-9)
        self.last_t, self.last_step = now, step
        eta = (self.total - step) / max(rate, 1e-9)
        per_step = metrics.get("examples", self.per_step)  # packed rows hold several examples
        timing = {"steps_per_sec": rate, "examples_per_sec": rate * per_step}
        if self.enabled:
            shown = " ".join(f"{name} {metrics[k]:.4f}" for k, name in
                             (("loss", "loss"), ("mlm_accuracy", "mlm_acc"), ("accuracy", "acc")) if k in metrics)
            text = (f"step {step}/{self.total} {shown} "
                    f"| {rate:.2f} steps/s {rate * per_step:.0f} ex/s | ETA {eta / 60:.1f} min")
            if self.bar is not None:
                self.bar.set_postfix_str(f"loss {metrics['loss']:.3f}")
                self.bar.write(text)
            else:
                print(text, flush=True)
        return timing

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _mean(rows: list[dict]) -> dict:
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def gather_data_states(state: dict) -> list[dict]:
    """Every process's input position (they differ on a pod: each reads its own files), so each
    process resumes its own stream. Single process: ``[state]``."""
    if jax.process_count() == 1:
        return [state]
    from jax.experimental import multihost_utils

    raw = json.dumps(state).encode()
    if len(raw) > 4096:
        raise ValueError(f"input pipeline state too large to gather ({len(raw)} bytes)")
    rows = multihost_utils.process_allgather(np.frombuffer(raw.ljust(4096), np.uint8))  # [processes, 4096]
    return [json.loads(bytes(r).decode().strip()) for r in np.asarray(rows)]


def evaluate(eval_fn, state, data, num_batches: int, mesh, rules) -> dict:
    totals = None
    for _ in range(num_batches):
        sums = eval_fn(state, sh.global_batch(next(data), mesh, rules))
        totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    return {k: float(v) for k, v in ts.summarize(jax.device_get(totals)).items()}


def start_job(config, workdir: str | Path):
    """Shared start of every job: multi-host initialisation, TensorFlow kept off accelerators,
    ``config.json`` written by process 0. Returns (workdir as a path, is process 0)."""
    from input_pipeline import hide_accelerators_from_tf

    if config.get("multihost", False):
        jax.distributed.initialize()
    hide_accelerators_from_tf()
    workdir = as_path(workdir)
    is_main = jax.process_index() == 0
    if is_main:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
    return workdir, is_main


def run(config, workdir: str | Path) -> dict:
    """Pre-trains per ``config`` in ``workdir``; returns the last logged train/eval metrics.
    Configs with a ``task`` section (configs/glue.py, squad.py, ner.py) fine-tune instead
    (`bert_jax.finetuning.trainer.run`)."""
    if "task" in config:
        from bert_jax.finetuning.trainer import run as finetune

        return finetune(config, workdir)
    workdir, is_main = start_job(config, workdir)
    model_cfg = model_config(config, vocab_size_of(config))
    # Accumulation is a lax.scan inside train_step (one call = one optimizer step), not MultiSteps.
    accumulation_steps = config.optimizer.accumulation_steps
    tx, schedule = make_optimizer({**config.optimizer.to_dict(), "accumulation_steps": 1})
    if config.batch_size % accumulation_steps:
        raise ValueError(f"batch_size {config.batch_size} is not divisible by accumulation_steps {accumulation_steps}")
    mesh = sh.make_mesh(tuple(config.mesh_shape))
    rules = tuple(tuple(r) for r in config.sharding_rules)
    shardings = ts.state_shardings(model_cfg, config.objective, tx, mesh, rules)
    abstract = jax.eval_shape(functools.partial(ts.init_state, model_cfg, config.objective, tx, config.seed))
    target = abstract_target(abstract, shardings)
    data = make_input(config, "train", jax.process_index(), jax.process_count())

    ckpt = Checkpointer(workdir, keep=config.keep_checkpoints)
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(target)
        per_process = meta.get("data_per_process") or [meta["data"]]
        if len(per_process) != jax.process_count():
            raise ValueError(f"{ckpt.directory}: saved by {len(per_process)} processes, resumed by "
                             f"{jax.process_count()}; the input position cannot be carried over")
        data.restore(per_process[jax.process_index()])
        log.info("resumed from %s at step %d", ckpt.directory, int(state.step))
    elif config.get("init_checkpoint"):  # e.g. phase 2 continues phase 1's state on new data
        source = Checkpointer(config.init_checkpoint)
        state, _ = source.restore(target)
        source.close()
        log.info("initialised from %s at step %d", config.init_checkpoint, int(state.step))
    else:
        state = jax.jit(functools.partial(ts.init_state, model_cfg, config.objective, tx, config.seed),
                        out_shardings=shardings)()

    graphdef = ts.model_graphdef(model_cfg, config.objective)
    batch_sh = sh.batch_sharding(mesh, rules)
    train_fn = jax.jit(
        functools.partial(ts.train_step, graphdef=graphdef, tx=tx, schedule=schedule,
                          accumulation_steps=accumulation_steps),
        in_shardings=(shardings, batch_sh, None), out_shardings=(shardings, None), donate_argnums=0)
    eval_fn = jax.jit(functools.partial(ts.eval_step, graphdef=graphdef),
                      in_shardings=(shardings, batch_sh), out_shardings=None)
    eval_data = None
    if config.eval_every and config.eval_steps:
        d = config.data
        if d.kind == "synthetic" or d.eval_input or d.eval_fraction:
            eval_data = make_input(config, "eval", jax.process_index(), jax.process_count())
        else:
            log.warning("no held-out data (set config.data.eval_input to held-out shards): evaluation is off")

    rng = jax.random.key(config.seed, impl=config.get("rng_impl", "threefry2x32"))
    writer = MetricWriter(workdir, enabled=is_main)
    stop = {"signal": None}
    previous = signal.signal(signal.SIGTERM, lambda signum, _: stop.update(signal=signum))
    step, total = int(state.step), config.num_train_steps
    progress = Progress(step, total, config.batch_size, enabled=is_main)
    pending, last = [], {}

    place = unpadded(functools.partial(sh.global_batch, mesh=mesh, rules=rules), config, mesh, rules)
    prefetch = config.get("prefetch_batches", 0)
    if prefetch:  # read, pack and place the next batches while the step runs
        from bert_jax.training.prefetch import DevicePrefetch

        batches = DevicePrefetch(data, place, prefetch)
    else:
        batches = map(place, data)

    def save(step: int) -> None:
        states = gather_data_states((batches if prefetch else data).state())
        ckpt.save(step, state, {"data": states[0], "data_per_process": states, "step": step,
                                "model": dataclasses.asdict(model_cfg)})

    try:
        while step < total:
            state, metrics = train_fn(state, next(batches), rng)
            step += 1
            pending.append(metrics)
            progress.update(step)
            due_ckpt = step % config.checkpoint_every == 0 or step == total or stop["signal"]
            if step % config.log_every == 0 or due_ckpt:
                rows = jax.device_get(pending)
                pending = []
                summary = _mean(rows)
                if not np.isfinite(summary["loss"]):
                    good = ckpt.latest_step()
                    raise TrainingDivergedError(
                        f"loss is {summary['loss']} at step {step}; stopping. The last good checkpoint "
                        f"is {'step ' + str(good) if good is not None else 'none'} in {ckpt.directory}")
                summary.update(progress.report(step, summary))
                writer.write(step, summary, "train")
                last["train"] = summary
            if eval_data is not None and (step % config.eval_every == 0 or step == total):
                last["eval"] = evaluate(eval_fn, state, eval_data, config.eval_steps, mesh, rules)
                writer.write(step, last["eval"], "eval")
                if is_main:
                    print(f"eval at step {step}: " + json.dumps({k: round(v, 4) for k, v in last["eval"].items()}),
                          flush=True)
            if due_ckpt:
                save(step)
            if stop["signal"]:
                log.warning("SIGTERM received: saved a checkpoint at step %d; exiting", step)
                break
    finally:
        if prefetch:
            batches.close()
        signal.signal(signal.SIGTERM, previous)
        progress.close()
        ckpt.close()
        writer.close()
    return last

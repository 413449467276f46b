"""A job's plan without running it: ``python train.py ... --dry_run`` (`dry_run`).

It resolves the config for the platform it runs on (as the job would: `bert_jax.resolve`), checks
what the job would read — the training and held-out data (files or globs match; TFRecord shards fit
the config's lengths), the vocabulary, the workdir's own checkpoints and ``init_checkpoint`` (each
array's shape against the model's, from the checkpoint's metadata: the restore's own check), a
fine-tuning task's files (read and featurised as the job does) — and returns the plan as text:
steps, batch, tokens (padded, and real ones from the shards' summary), the learning-rate schedule,
evaluation, checkpoint cadence, mesh, parameters and their per-device memory with the optimizer
state; fine-tuning: each split's examples and features, steps, epochs, learning rate and schedule.
Nothing is created: no workdir, no lock, no compiled step. Bad input raises the error the job would
raise, so on the command line it is one ``error:`` line and exit status 2; what would run but not as
meant (an evaluation that repeats held-out rows, an ``init_checkpoint`` not written yet) is a
``warning:`` line. Several-process configs (``multihost``) are planned on this one process's devices;
``hosts`` (``--hosts N``) checks the batch and the shard files per host.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax

from bert_jax.config_args import is_finetuning
from bert_jax.training import compiler_options
from bert_jax.training.checkpoints import as_path

BYTES_PER_FLOAT = 4  # parameters and Adam's two moments are float32 whatever the compute dtype


def dry_run(config, workdir, hosts: int | None = None) -> str:
    """The plan of the job ``config`` describes in ``workdir`` (see the module docstring); ``hosts``:
    the number of hosts a ``multihost`` job will run on."""
    from bert_jax.training import sharding as sh
    from bert_jax.training.trainer import check_counts, resolved

    check_counts(config)
    if hosts is not None and (not config.multihost or hosts < 1):
        raise ValueError(f"--hosts {hosts}: expected a number of hosts >= 1, for a job with --config.multihost=True")
    mesh = sh.config_mesh(config)
    c = resolved(config, mesh)
    options = compiler_options.of_config(c)
    compiler_options.check(options)
    where = f"resolved for {jax.default_backend()}, {jax.device_count()} device(s)"
    if c.multihost:
        where += f"; multihost: planned for {hosts} host(s)" if hosts else "; multihost"
    lines, warnings = [f"plan for {workdir} ({where}; nothing was run)"], []
    if c.multihost and not hosts:
        warnings.append("multihost: the batch and shard files per host are not checked; add --hosts N (the pod's "
                        "number of hosts, e.g. 4 for a v4-32)")
    if is_finetuning(c):
        lines += _finetuning(c)
    else:
        lines += _pretraining(c, workdir, mesh, hosts or 1, warnings)
    if options:
        lines.append(f"XLA options of the steps: {compiler_options.text(options)}")
    return "\n".join(lines + [f"warning: {w}" for w in warnings])


def _pretraining(c, workdir, mesh, hosts: int, warnings: list[str]) -> list[str]:
    from bert_jax.pretraining.evaluation import eval_source
    from bert_jax.pretraining.task import checked_model_config
    from bert_jax.training import sharding as sh
    from bert_jax.training.sharding_rules import config_rules
    from bert_jax.training.steps import accumulation_steps
    from input_pipeline.pretraining.dataset import eval_repeats, shards_summary

    d = c.data
    model = checked_model_config(c)  # what the job checks first: the start, the vocabulary, the length
    rules = config_rules(c)
    accumulation = accumulation_steps(c, mesh, rules)
    total, batch, length = c.num_train_steps, c.batch_size, d.max_seq_length
    if batch % hosts:
        raise ValueError(f"--config.batch_size={batch}: not divisible by {hosts} hosts (each host reads its own "
                         "rows of every batch)")
    train = _data_line(c, d.input, "train", hosts) if d.kind != "synthetic" else "synthetic batches"
    held_out = eval_source(c)
    if held_out is not None and d.eval_input and d.kind != "synthetic":
        held_out = _data_line(c, d.eval_input, "held-out", hosts)
        if warning := eval_repeats(c, hosts):
            warnings.append(warning)
    elif held_out is not None and d.kind != "synthetic":
        held_out += " (counted when the run builds it; it warns if an evaluation would repeat rows)"
    start, restore_line = _start(c, workdir, model, mesh, warnings)
    steps = max(total - start, 0) if start is not None else None
    o = c.optimizer
    params = _parameter_count(model, c)
    shards = mesh.shape["fsdp"] * mesh.shape["tensor"]
    state_bytes = 3 * params * BYTES_PER_FLOAT / shards  # parameters + Adam's m and v, split by FSDP/tensor
    summary = shards_summary(d.input) if d.kind != "synthetic" and d.input else None
    real = ""
    if summary and summary.get("examples"):
        fraction = summary["tokens"] / (summary["examples"] * length)
        per_row = summary["tokens"] / summary["examples"]
        real = f"; real tokens {fraction:.0%} of them ({per_row:.0f} a row in {d.input})"
    if steps is None:
        step_line = (f"steps: from {c.init_checkpoint}'s last step -> {total:,}, batch {batch:,} = "
                     f"{batch * length:,} tokens a step padded{real}")
    else:
        step_line = (f"steps: {start:,} -> {total:,} ({steps:,} to run), batch {batch:,} = {batch * length * steps:,} "
                     f"tokens padded ({batch * length:,} a step){real}")
    lines = [
        f"model: {c.model.size} ({model.num_layers} layers x {model.hidden_size}, {params / 1e6:.1f}M parameters, "
        f"vocabulary {model.vocab_size:,}, compute {model.dtype}), objective {c.objective}"
        + (f"; rotary base {model.rope_theta:,.0f} in global layers, {model.local_rope_theta:,.0f} in local ones"
           if model.rotary else ""),
        f"data: {train}; length {length}, {d.max_predictions_per_seq} predictions per row, {d.masking} masking"
        + (f"; up to {d.pack_examples} examples a row, none attending to another" if d.pack_examples else ""),
        restore_line,
        step_line,
        _optimizer_line(o),
        ("evaluation: off (eval_every=0)" if held_out is None else
         f"evaluation: every {c.eval_every:,} steps and at the end, {c.eval_steps} batches of {batch} from {held_out}"),
        f"checkpoints: every {c.checkpoint_every:,} steps, the last {c.keep_checkpoints} kept, in "
        f"{as_path(workdir) / 'checkpoints'}",
        f"mesh: {dict(mesh.shape)} over {mesh.devices.size} device(s); {batch // sh.batch_shards(mesh, rules):,} "
        f"rows per batch shard" + (f" in {accumulation} micro-batches" if accumulation > 1 else ""),
        *([f"hosts: {hosts}, each reading {batch // hosts:,} rows of every batch from its own shard files"]
          if hosts > 1 else []),
        f"memory per device: {state_bytes / 2**30:.2f} GiB of parameters and optimizer state (float32); "
        "activations not estimated here (python -m bert_jax.benchmark.aot compile: the step on a TPU topology)",
    ]
    return lines


def _optimizer_line(o) -> str:
    """The optimizer, its schedule and decay as the step applies them (bert_jax/training/optim.py)."""
    stable = o.optimizer == "stableadamw"
    name = "stableadamw (update clipping per tensor, no global clip)" if stable else o.optimizer
    late = f", {o.late_rate:g} from step {o.late_from_step:,}" if o.late_rate else ""
    decay = (f"weight decay {o.weight_decay:g} per step at the peak rate (fully decoupled; scaled by lr / peak)"
             if stable else f"weight decay {o.weight_decay:g}, clip {o.clip_norm:g}")
    return (f"optimizer: {name}, lr {o.learning_rate:g}{late}, warmup {o.warmup_steps:,} steps, schedule "
            f"{o.schedule} to step {o.num_train_steps:,}"
            + (f" (the last {o.decay_steps:,} decaying)" if o.schedule == "wsd" else "") + f", {decay}")


def _data_line(c, spec: str, split: str, hosts: int = 1) -> str:
    """``spec`` checked as the job reads it: TFRecord shards (count, shapes; with several hosts, at
    least one file each) or text files."""
    from input_pipeline.corpora import sources
    from input_pipeline.package_data import locate
    from input_pipeline.pretraining.dataset import check_shards, held_out_every, shards_summary

    if not spec:
        raise ValueError("config.data.input is empty: set --config.data.input=... (see docs/data.md)")
    if spec.strip().startswith("tfds:"):
        return f"{spec} (TFDS; read when the job starts)"
    files = check_shards(spec, c.data)
    if files is not None:
        key = "input" if split == "train" else "eval_input"
        if len(files) < hosts:
            raise ValueError(f"--config.data.{key}={spec}: {len(files)} TFRecord files for {hosts} hosts; each host "
                             f"reads its own files: write at least {hosts} (create_pretraining_data --num_shards)")
        summary = shards_summary(spec)
        count = f", {summary['examples']:,} examples" if summary else ""
        per_host = f", {len(files) / hosts:g} a host" if hosts > 1 else ""
        return f"{spec} ({len(files):,} TFRecord files{per_host}{count})"
    found = sources.list_files(locate(spec))
    fraction = c.data.eval_fraction
    held = f", every {held_out_every(fraction)}th document held out" if fraction and not c.data.eval_input \
        else ""
    return f"{spec} ({len(found):,} text file(s){held if split == 'train' else ''})"


def _start(c, workdir, model, mesh, warnings: list[str]) -> tuple[int | None, str]:
    """The step the job starts at (None: an ``init_checkpoint`` not written yet) and how: the workdir's
    own checkpoint, ``init_checkpoint``, or fresh; each checkpoint's arrays checked against the
    model's as its restore checks them."""
    from bert_jax.training.checkpoints import Checkpointer

    steps = _checkpoint_steps(as_path(workdir))
    if steps:
        from bert_jax.training.trainer import refuse_another_model

        refuse_another_model(workdir, c.restore, model)  # another model's checkpoint: the changed keys, one line
        ckpt = Checkpointer(workdir, async_save=False)
        try:
            step = ckpt.restore_step(c.restore)
            ckpt.check_restore(_layout(c, model, mesh).target(), step)
        finally:
            ckpt.close()
        return step, f"start: resumes from {workdir}'s checkpoint at step {step:,} (restore={c.restore})"
    if c.init_checkpoint:
        source = as_path(c.init_checkpoint)
        found = _checkpoint_steps(source)
        if not found:
            return _planned_start(c, source, model, warnings)
        _check_init_checkpoint(c, model, mesh, found[-1])
        if c.init_mode == "params":
            return 0, f"start: step 0 with the parameters of {c.init_checkpoint} at step {found[-1]:,} " \
                      "(init_mode=params: a fresh optimizer)"
        if c.init_mode == "encoder":
            return 0, f"start: step 0 with the encoder of {c.init_checkpoint} at step {found[-1]:,}, the rest " \
                      f"fresh (seed {c.seed}; init_mode=encoder: a fresh optimizer)"
        line = f"start: {c.init_checkpoint}'s state at step {found[-1]:,} (parameters, optimizer, step; " \
               "init_mode=state: its schedule continues)"
        saved = source / "config.json"
        planned = json.loads(saved.read_text()).get("num_train_steps") if saved.exists() else None
        if isinstance(planned, int) and found[-1] < planned:
            line += f"; note: that run planned {planned:,} steps and has not reached them"
        return found[-1], line
    return 0, f"start: fresh parameters (seed {c.seed})"


def _layout(c, model, mesh):
    """The pre-training state's layout (shapes and shardings; nothing allocated or compiled)."""
    from bert_jax.pretraining.objective import jit_pretraining_steps

    return jit_pretraining_steps(c, model, mesh).layout


def _check_init_checkpoint(c, model, mesh, step: int) -> None:
    """``init_checkpoint``'s arrays against this model's, per ``init_mode``, as `start_state`'s
    restore checks them before reading any (from the checkpoint's metadata)."""
    from bert_jax.pretraining.start import ENCODER
    from bert_jax.training.checkpoints import Checkpointer

    target = _layout(c, model, mesh).target()
    source = Checkpointer(c.init_checkpoint, async_save=False)
    try:
        if c.init_mode == "encoder":
            source.check_restore_params({ENCODER: target.params[ENCODER]}, step, what="encoder's parameters")
        elif c.init_mode == "params":
            source.check_restore_params(target.params, step)
        else:
            source.check_restore(target, step, hint=False)
    finally:
        source.close()


def _planned_start(c, source, model, warnings: list[str]) -> tuple[int | None, str]:
    """``init_checkpoint`` without a checkpoint yet: phase 1 planned (or started: its ``config.json``,
    whose model must be this one) but not run. The plan goes on; the run checks the checkpoint."""
    if source.exists() and not (source / "config.json").exists():
        raise FileNotFoundError(f"--config.init_checkpoint={c.init_checkpoint}: no checkpoints/ directory "
                                "with a step (expected the workdir of a pre-training run)")
    carried = {"state": "its state (step, optimizer)", "params": "its parameters",
               "encoder": "its encoder"}[c.init_mode]
    if not source.exists():
        warnings.append(f"--config.init_checkpoint={c.init_checkpoint} does not exist yet: planned as a checkpoint "
                        "of this model; the run checks it when it starts")
        return (None if c.init_mode == "state" else 0), f"start: {carried} from {c.init_checkpoint} (not written yet)"
    planned = json.loads((source / "config.json").read_text())
    changes = _planned_model_changes(planned, c, model)
    if changes:
        raise ValueError(f"--config.init_checkpoint={c.init_checkpoint}: its config.json plans another model: "
                         f"{', '.join(changes)}")
    steps = planned.get("num_train_steps")
    steps = steps if isinstance(steps, int) else None
    planned_steps = f"{steps:,} steps" if steps is not None else "its steps"
    warnings.append(f"--config.init_checkpoint={c.init_checkpoint} has no checkpoint yet (its config.json plans "
                    f"this model, {planned_steps}); the run needs one when it starts")
    start = (steps if c.init_mode == "state" else 0)
    at = f" at its planned step {steps:,}" if steps is not None else ""
    return start, f"start: {carried} from {c.init_checkpoint}{at} (no checkpoint yet)"


def _planned_model_changes(planned: dict, c, model) -> list[str]:
    """The shape fields in which the model of a workdir's ``config.json`` differs from ``model``."""
    import ml_collections

    from bert_jax.resolve import described_model
    from bert_jax.training.trainer import model_changes

    try:
        theirs = described_model(ml_collections.ConfigDict(planned["model"]), vocab_size=model.vocab_size)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"--config.init_checkpoint={c.init_checkpoint}: config.json has no model it describes ({e})") \
            from e
    return model_changes(dataclasses.asdict(theirs), model)


def _checkpoint_steps(workdir) -> list[int]:
    directory = workdir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _parameter_count(model, c) -> int:
    """The pre-training model's parameters (ELECTRA: generator and discriminator), allocating nothing."""
    from flax import nnx

    from bert_jax.pretraining.objective import electra_settings, pretraining_model

    abstract = nnx.eval_shape(lambda: pretraining_model(model, c.objective, electra_settings(c))(0))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def _finetuning(c) -> list[str]:
    """A fine-tuning job: its task files read and featurised as the job does (`FineTuning`: each
    split's examples and features, the steps they make), the encoder it starts from, the optimizer.
    TFDS sources are read when the job starts; their counts are not in the plan."""
    from input_pipeline.package_data import locate

    t = c.task
    source = str(t.source)
    task = " ".join(str(t[k]) for k in ("family", "name", "version") if k in t)
    lines = [f"task: {task} from {source or '(no source)'}"]
    plain = source and not source.startswith(("tfds", "pkg:")) and "=" not in source
    if plain and not as_path(source).exists():
        raise FileNotFoundError(f"--config.task.source={source}: no such file or directory")
    if source.startswith("pkg:"):
        locate(source)  # an unknown package name is an error here
    if source.startswith("tfds"):
        return lines + _finetuning_unread(c)
    from bert_jax.finetuning.task import FineTuning

    job = FineTuning(c, True)  # reads the files, opens the init checkpoint (weights load at the start)
    skipped, dropped = getattr(job.spec, "skipped", {}), getattr(job.spec, "dropped", {})
    for split, d in job.data.items():
        lines.append(f"data: {split} {len(d['examples']):,} examples -> {len(d['features']['input_ids']):,} features "
                     f"(length {c.max_seq_length})"
                     + (f", {skipped[split]:,} malformed lines skipped" if skipped.get(split) else "")
                     + (f", {dropped[split]:,} scored 0 dropped (no label)" if dropped.get(split) else ""))
    if c.init_checkpoint:
        lines.append(f"encoder: {c.init_checkpoint} ({job.model_config.num_layers} layers x "
                     f"{job.model_config.hidden_size}; task heads fresh)")
    else:
        lines.append(f"encoder: random initialisation ({job.model_config.num_layers} layers x "
                     f"{job.model_config.hidden_size}; init_checkpoint is empty)")
    n, total, o = len(job.train["input_ids"]), job.num_train_steps, c.optimizer
    how = (f"num_train_steps={c.num_train_steps:,}" if c.num_train_steps else
           f"{c.num_train_epochs:g} epochs x {n:,} training features / batch {c.batch_size}, rounded up")
    seeds = f", for each of {c.seeds} seeds" if c.seeds > 1 else ""
    lines.append(f"steps: {total:,} ({how}){seeds}")
    warmup = int(round(o.warmup_fraction * total))
    lines.append(f"optimizer: {o.optimizer}, lr {o.learning_rate:g}, warmup {warmup:,} steps "
                 f"({o.warmup_fraction:.0%}), schedule {o.schedule} to 0 at step {total:,}, weight decay "
                 f"{o.weight_decay:g}, clip {o.clip_norm:g}")
    every = f"every {c.eval_every:,} steps and " if c.eval_every else ""
    lines.append(f"evaluation: {', '.join(job.spec.eval_splits)} {every}at the end"
                 + (f"; predictions for {', '.join(c.predict_splits)}" if c.predict_splits else ""))
    return lines


def _finetuning_unread(c) -> list[str]:
    """A fine-tuning job whose data is read when it starts (TFDS): the encoder and the settings."""
    from bert_jax.finetuning.warm_start import open_init_checkpoint

    lines = ["data: TFDS, read when the job starts (examples and steps are not counted here)"]
    if c.init_checkpoint:
        warm = open_init_checkpoint(c.init_checkpoint)
        lines.append(f"encoder: {c.init_checkpoint} ({warm.config.num_layers} layers x {warm.config.hidden_size})")
    else:
        lines.append("encoder: random initialisation (init_checkpoint is empty)")
    counts = {k: c[k] for k in ("num_train_epochs", "num_train_steps", "batch_size", "seeds") if k in c}
    lines.append(f"training: {json.dumps(counts)}, lr {c.optimizer.learning_rate:g}, warmup "
                 f"{c.optimizer.warmup_fraction:.0%} of the steps, schedule {c.optimizer.schedule}")
    return lines

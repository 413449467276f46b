"""A job's plan without running it: ``python train.py ... --dry_run`` (`dry_run`).

It resolves the config for the platform it runs on (as the job would: `bert_jax.resolve`), checks
what the job would read — the training and held-out data (files or globs match; TFRecord shards fit
the config's lengths), the vocabulary, the workdir's own checkpoints and ``init_checkpoint`` — and
returns the plan as text: steps, batch, tokens, the learning-rate schedule, evaluation, checkpoint
cadence, mesh, parameters and their per-device memory with the optimizer state. Nothing is created:
no workdir, no lock, no compiled step. Bad input raises the error the job would raise, so on the
command line it is one ``error:`` line and exit status 2. Several-process configs (``multihost``)
are planned on this one process's devices.
"""

from __future__ import annotations

import json
import math

import jax

from bert_jax.training.checkpoints import as_path

BYTES_PER_FLOAT = 4  # parameters and Adam's two moments are float32 whatever the compute dtype


def dry_run(config, workdir) -> str:
    """The plan of the job ``config`` describes in ``workdir`` (see the module docstring)."""
    from bert_jax.training import sharding as sh
    from bert_jax.training.trainer import check_counts, resolved

    check_counts(config)
    mesh = sh.make_mesh(tuple(config.mesh_shape))
    c = resolved(config, mesh)
    lines = [f"plan for {workdir} (resolved for {jax.default_backend()}, {jax.device_count()} device(s); "
             "nothing was run)"]
    if "task" in c:
        lines += _finetuning(c)
    else:
        lines += _pretraining(c, workdir, mesh)
    return "\n".join(lines)


def _pretraining(c, workdir, mesh) -> list[str]:
    from bert_jax.resolve import described_model
    from bert_jax.training import sharding as sh
    from bert_jax.training.pretraining import accumulation_steps, check_start, eval_source, vocab_size_of

    check_start(c)
    d = c.data
    vocab_size = vocab_size_of(c)
    model = described_model(c.model, vocab_size=vocab_size)
    if d.max_seq_length > model.max_length:
        raise ValueError(f"--config.data.max_seq_length={d.max_seq_length}: expected at most {model.max_length} "
                         "(the model's max_position_embeddings)")
    rules = tuple(tuple(r) for r in c.sharding_rules)
    accumulation = accumulation_steps(c, mesh, rules)
    train = _data_line(c, d.input, "train") if d.kind != "synthetic" else "synthetic batches"
    held_out = eval_source(c)
    start, restore_line = _start(c, workdir, model)
    total, batch, length = c.num_train_steps, c.batch_size, d.max_seq_length
    steps = max(total - start, 0)
    o = c.optimizer
    params = _parameter_count(model, c)
    shards = mesh.shape["fsdp"] * mesh.shape["tensor"]
    state_bytes = 3 * params * BYTES_PER_FLOAT / shards  # parameters + Adam's m and v, split by FSDP/tensor
    lines = [
        f"model: {c.model.size} ({model.num_layers} layers x {model.hidden_size}, {params / 1e6:.1f}M parameters, "
        f"vocabulary {vocab_size:,}, compute {model.dtype}), objective {c.objective}"
        + (f"; rotary base {model.rope_theta:,.0f} in global layers, {model.local_rope_theta:,.0f} in local ones"
           if model.rotary else ""),
        f"data: {train}; length {length}, {d.max_predictions_per_seq} predictions per row, {d.masking} masking"
        + (f"; up to {d.pack_examples} examples a row, none attending to another" if d.pack_examples else ""),
        restore_line,
        f"steps: {start:,} -> {total:,} ({steps:,} to run), batch {batch:,} = {batch * length * steps:,} tokens "
        f"({batch * length:,} a step)",
        _optimizer_line(o),
        ("evaluation: off (eval_every=0)" if held_out is None else
         f"evaluation: every {c.eval_every:,} steps and at the end, {c.eval_steps} batches of {batch} from {held_out}"),
        f"checkpoints: every {c.checkpoint_every:,} steps, the last {c.keep_checkpoints} kept, in "
        f"{as_path(workdir) / 'checkpoints'}",
        f"mesh: {dict(mesh.shape)} over {mesh.devices.size} device(s); {batch // sh.batch_shards(mesh, rules):,} "
        f"rows per batch shard" + (f" in {accumulation} micro-batches" if accumulation > 1 else ""),
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


def _data_line(c, spec: str, split: str) -> str:
    """``spec`` checked as the job reads it: TFRecord shards (count, shapes) or text files."""
    from input_pipeline.corpora import sources
    from input_pipeline.package_data import locate
    from input_pipeline.pretraining.dataset import check_shards, held_out_every

    if not spec:
        raise ValueError("config.data.input is empty: set --config.data.input=... (see docs/data.md)")
    if spec.strip().startswith("tfds:"):
        return f"{spec} (TFDS; read when the job starts)"
    files = check_shards(spec, c.data)
    if files is not None:
        return f"{spec} ({len(files):,} TFRecord files)"
    found = sources.list_files(locate(spec))
    fraction = c.data.eval_fraction
    held = f", every {held_out_every(fraction)}th document held out" if fraction and not c.data.eval_input \
        else ""
    return f"{spec} ({len(found):,} text file(s){held if split == 'train' else ''})"


def _start(c, workdir, model) -> tuple[int, str]:
    """The step the job starts at and how: the workdir's own checkpoint, ``init_checkpoint``, or fresh."""
    steps = _checkpoint_steps(as_path(workdir))
    if steps:
        from bert_jax.training.checkpoints import Checkpointer
        from bert_jax.training.trainer import refuse_another_model

        refuse_another_model(workdir, c.restore, model)  # another model's checkpoint: the changed keys, one line
        ckpt = Checkpointer(workdir, async_save=False)
        try:
            step = ckpt.restore_step(c.restore)
        finally:
            ckpt.close()
        return step, f"start: resumes from {workdir}'s checkpoint at step {step:,} (restore={c.restore})"
    if c.init_checkpoint:
        source = as_path(c.init_checkpoint)
        found = _checkpoint_steps(source)
        if not found:
            raise FileNotFoundError(f"--config.init_checkpoint={c.init_checkpoint}: no checkpoints/ directory "
                                    "with a step (expected the workdir of a pre-training run)")
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


def _checkpoint_steps(workdir) -> list[int]:
    directory = workdir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _parameter_count(model, c) -> int:
    """The pre-training model's parameters (ELECTRA: generator and discriminator), allocating nothing."""
    from flax import nnx

    from bert_jax.training.pretraining import electra_settings, pretraining_model

    abstract = nnx.eval_shape(lambda: pretraining_model(model, c.objective, electra_settings(c))(0))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def _finetuning(c) -> list[str]:
    """A fine-tuning job: its task data (a plain path must exist; TFDS names and SQuAD's
    ``train=PATH,dev=PATH`` are read when the job starts) and the encoder it starts from."""
    from bert_jax.finetuning.warm_start import open_init_checkpoint
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
    if c.init_checkpoint:
        warm = open_init_checkpoint(c.init_checkpoint)
        lines.append(f"encoder: {c.init_checkpoint} ({warm.config.num_layers} layers x {warm.config.hidden_size})")
    else:
        lines.append("encoder: random initialisation (init_checkpoint is empty)")
    counts = {k: c[k] for k in ("num_train_epochs", "num_train_steps", "batch_size", "seeds") if k in c}
    lines.append(f"training: {json.dumps(counts)}")
    return lines

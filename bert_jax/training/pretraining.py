"""Pre-training as a task of the trainer (`bert_jax.training.trainer`): ``PreTraining``.

The model (`BertForPreTraining` for MLM + NSP | SOP | none, `ElectraForPreTraining` for ELECTRA's
replaced-token detection), its pure steps (``train_step(state, batch, rng) -> (state, metrics)``
with gradient accumulation over micro-batches in a ``lax.scan``; ``eval_step`` sums the held-out
metrics), jitted by `bert_jax.training.steps.jit_steps` (`build_steps`: the same function serves the
trainer, the benchmark and ahead-of-time compilation); the input (each process its own share of
every global batch, `make_input`, prefetched onto the devices in a background thread), whose
position every checkpoint records; the start (``init_checkpoint``: phase 1's state or parameters, or
a masked LM's encoder); the held-out evaluation at step 0 and every ``eval_every`` steps on the same
batches each time; and the collapse warning (`bert_jax.training.health`). Batches have the layout of
`input_pipeline.pretraining.batch`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from bert_jax.model.config import BertConfig
from bert_jax.model.electra import ElectraForPreTraining, ElectraOutput
from bert_jax.model.models import BertForPreTraining
from bert_jax.resolve import described_model
from bert_jax.training import health
from bert_jax.training import sharding as sh
from bert_jax.training import steps as steps_lib
from bert_jax.training.checkpoints import Checkpointer, as_path
from bert_jax.training.metric_writer import read_metrics
from bert_jax.training.steps import Steps, TrainState, accumulation_steps, jit_steps, new_state
from input_pipeline.pretraining.batch import MODEL_INPUT_KEYS

log = logging.getLogger(__name__)

OBJECTIVES = ("nsp", "sop", "none", "rtd")  # rtd: ELECTRA's replaced-token detection


def pretraining_model(cfg: BertConfig, objective: str, electra: dict | None = None) -> Callable[[int], nnx.Module]:
    """seed -> the pre-training model (what `bert_jax.training.state.state_layout` builds from):
    `BertForPreTraining` for MLM + nsp | sop | none, `ElectraForPreTraining` for "rtd" (``electra``:
    its generator_fraction, rtd_weight and rtd_prior, the job config's ``electra`` block)."""
    if objective == "rtd":
        return lambda seed: ElectraForPreTraining(cfg, rngs=nnx.Rngs(seed), **(electra or {}))
    if electra:
        raise ValueError(f"electra settings {sorted(electra)} need objective 'rtd', not {objective!r}")
    return lambda seed: BertForPreTraining(cfg, rngs=nnx.Rngs(seed), objective=objective)


def model_graphdef(cfg: BertConfig, objective: str, electra: dict | None = None) -> nnx.GraphDef:
    """The model's static structure (allocates nothing)."""
    return nnx.graphdef(nnx.eval_shape(lambda: pretraining_model(cfg, objective, electra)(0)))


def init_state(cfg: BertConfig, objective: str, tx: optax.GradientTransformation, seed: int,
               electra: dict | None = None) -> TrainState:
    """A fresh state on the default device (tests and small tools; the trainer creates its state
    in its shards with `bert_jax.training.state.StateLayout.create`)."""
    model = pretraining_model(cfg, objective, electra)(seed)
    return new_state(nnx.state(model, nnx.Param).to_pure_dict(), tx)


def pretraining_losses(out, batch, held_out: bool = False) -> dict[str, jax.Array]:
    """Sums over one batch: masked-LM cross-entropy and accuracy over real predictions (weights),
    NSP/SOP, ELECTRA's RTD (and how often the generator's sample is the original token), and the
    last layer's health sums (`bert_jax.training.health`; ``held_out``: also the evaluation's, the
    discriminator's logit histograms for the AUC, the tokens' covariance and the masked tokens'
    unigram counts)."""
    logits = out.mlm_logits  # [batch, P, vocab] float32
    labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]  # [batch, P]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [batch, P]
    total_weight = weights.sum()
    correct = (jnp.argmax(logits, -1) == labels) * weights  # [batch, P]
    # One weight per example slot: [batch], or [batch·K] for packed rows (1 = a real example).
    w = (batch["nsp_weights"].reshape(-1) if "nsp_weights" in batch
         else jnp.ones(labels.shape[:1], jnp.float32))  # [examples]
    m = {"mlm_loss_sum": (ce * weights).sum(), "mlm_correct": correct.sum(), "mlm_weight": total_weight,
         "examples": w.sum()}
    if out.nsp_logits is not None:
        nsp_logits = out.nsp_logits.reshape(-1, 2)  # [examples, 2]
        nsp_labels = batch["next_sentence_labels"].reshape(-1)  # [examples]: [batch] or [batch·K] packed
        nsp_ce = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, nsp_labels)  # [examples]
        m["nsp_loss_sum"] = (nsp_ce * w).sum()
        m["nsp_correct"] = ((jnp.argmax(nsp_logits, -1) == nsp_labels) * w).sum()
    if isinstance(out, ElectraOutput):
        real = batch["input_mask"].astype(jnp.float32)  # [batch, length]: ELECTRA's BCE runs over real tokens
        bce = optax.sigmoid_binary_cross_entropy(out.rtd_logits, out.rtd_labels)  # [batch, length]
        m["rtd_loss_sum"] = (bce * real).sum()
        m["rtd_correct"] = (((out.rtd_logits > 0) == (out.rtd_labels > 0)) * real).sum()
        m["rtd_replaced"] = (out.rtd_labels * real).sum()
        m["rtd_tokens"] = real.sum()
        # The generator's sampled accuracy (google-research/electra's sampled_masked_lm_accuracy): a
        # masked position whose sample is the original token is labelled original.
        replaced_at_masks = jnp.take_along_axis(out.rtd_labels, batch["masked_lm_positions"], axis=1)  # [batch, P]
        m["mlm_sampled_correct"] = ((1.0 - replaced_at_masks) * weights).sum()
        if held_out:
            m.update(health.rtd_histograms(out.rtd_logits, out.rtd_labels, real))
    if out.encoder is not None:
        m.update(health.health_sums(out.encoder.sequence_output, batch))
        if held_out:
            m.update(health.held_out_sums(out.encoder.sequence_output, batch, logits.shape[-1]))
    return m


def loss_denominators(batch) -> dict[str, jax.Array]:
    """What each loss term of `_loss` divides by, counted over the whole ``batch``: masked-LM
    predictions, examples (NSP/SOP) and real tokens (ELECTRA's RTD). Micro-batches divide by the whole
    batch's counts, so their summed gradients are the whole batch's gradient, however unevenly the
    predictions fall among them."""
    examples = batch["nsp_weights"].sum() if "nsp_weights" in batch else batch["input_ids"].shape[0]
    return {"mlm_weight": batch["masked_lm_weights"].sum(), "examples": jnp.asarray(examples, jnp.float32),
            "rtd_tokens": batch["input_mask"].astype(jnp.float32).sum()}


def _loss(params, graphdef, batch, rng, deterministic: bool, denominators: dict | None = None,
          held_out: bool = False):
    model = nnx.merge(graphdef, params)
    optional = {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}
    rngs = None if deterministic else nnx.Rngs(dropout=rng)
    args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"], batch["masked_lm_positions"])
    if isinstance(model, ElectraForPreTraining):
        if "cls_positions" in optional:
            raise ValueError("ELECTRA has no sentence-level head: packed batches with cls_positions do not apply")
        # Evaluation draws its replacements from a fixed key: the same held-out numbers every time.
        sample_key = jax.random.fold_in(rng, 1) if rng is not None else jax.random.key(0)
        out = model(*args, batch["masked_lm_ids"], batch["masked_lm_weights"], sample_key=sample_key,
                    deterministic=deterministic, rngs=rngs, **optional)
    else:
        out = model(*args, deterministic=deterministic, rngs=rngs, **optional)
    m = pretraining_losses(out, batch, held_out)
    if isinstance(model, ElectraForPreTraining):
        m["rtd_weighted_loss_sum"] = model.rtd_weight * m["rtd_loss_sum"]  # λ · BCE, summed like the rest
    d = m if denominators is None else denominators  # this batch's counts, or the whole batch's
    loss = m["mlm_loss_sum"] / jnp.maximum(d["mlm_weight"], 1e-5)
    if "nsp_loss_sum" in m:
        loss = loss + m["nsp_loss_sum"] / jnp.maximum(d["examples"], 1e-5)
    if "rtd_loss_sum" in m:
        loss = loss + m["rtd_weighted_loss_sum"] / jnp.maximum(d["rtd_tokens"], 1e-5)
    return loss, m


def summarize(m: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Sums (as accumulated over micro-batches or eval batches) → means, accuracies and the health
    metrics (`bert_jax.training.health.summarize_health`)."""
    out = {"mlm_loss": m["mlm_loss_sum"] / jnp.maximum(m["mlm_weight"], 1e-5),
           "mlm_accuracy": m["mlm_correct"] / jnp.maximum(m["mlm_weight"], 1e-5)}
    if "nsp_loss_sum" in m:
        out["nsp_loss"] = m["nsp_loss_sum"] / jnp.maximum(m["examples"], 1e-5)
        out["nsp_accuracy"] = m["nsp_correct"] / jnp.maximum(m["examples"], 1e-5)
    rtd = {}
    if "rtd_loss_sum" in m:
        tokens = jnp.maximum(m["rtd_tokens"], 1e-5)
        out["rtd_loss"] = m["rtd_loss_sum"] / tokens
        out["rtd_accuracy"] = m["rtd_correct"] / tokens
        out["rtd_replaced_fraction"] = m["rtd_replaced"] / tokens  # how often the generator fooled the mask
        out["mlm_sampled_accuracy"] = m["mlm_sampled_correct"] / jnp.maximum(m["mlm_weight"], 1e-5)
        rtd = {"weighted": m["rtd_weighted_loss_sum"] / tokens}
    out["loss"] = out["mlm_loss"] + out.get("nsp_loss", 0.0) + rtd.get("weighted", 0.0)
    out["examples"] = m["examples"]  # examples in the summed batches (packed rows hold several)
    out.update(health.summarize_health(m))
    return out


def _train_loss(params, graphdef, batch, rng, denominators: dict | None):
    return _loss(params, graphdef, batch, rng, False, denominators)


def train_step(state: TrainState, batch: dict, rng: jax.Array, *, graphdef, tx, schedule,
               accumulation_steps: int = 1) -> tuple[TrainState, dict]:
    """One optimizer step on the pre-training loss (`bert_jax.training.steps.train_step`: micro-batches
    dividing by the whole batch's counts, `loss_denominators`)."""
    return steps_lib.train_step(state, batch, rng, graphdef=graphdef, tx=tx, schedule=schedule, loss=_train_loss,
                                denominators=loss_denominators, summarize=summarize,
                                accumulation_steps=accumulation_steps)


def eval_step(params: dict, batch: dict, *, graphdef) -> dict:
    """Sums over one batch (add them up across batches, then `summarize`), with the held-out extras
    (`pretraining_losses`)."""
    _, sums = _loss(params, graphdef, batch, None, True, held_out=True)
    return sums


# ------------------------------------------------------------------------------------------------
# The model and its steps, from the job config.
# ------------------------------------------------------------------------------------------------


def model_config(config, vocab_size: int) -> BertConfig:
    """The model ``config.model`` describes, with the vocabulary's size."""
    return described_model(config.model, vocab_size=vocab_size)


def vocab_size_of(config) -> int:
    if config.data.kind == "synthetic":
        return config.model.vocab_size
    from input_pipeline.package_data import locate
    from input_pipeline.tokenizers.factory import load_tokenizer

    if not config.data.vocab:
        raise ValueError("config.data.vocab is empty: set --config.data.vocab=PATH (a vocab.txt, a SentencePiece "
                         ".model or a directory holding one)")
    return load_tokenizer(locate(config.data.vocab)).vocab_size


def electra_settings(config) -> dict | None:
    """``config.electra`` (generator_fraction, rtd_weight, rtd_prior, tie_embeddings) for objective
    "rtd", else None."""
    if config.objective != "rtd":
        return None
    if "electra" not in config:
        raise ValueError("objective 'rtd' needs config.electra (generator_fraction, rtd_weight): "
                         "use configs/pretrain.py:model=electra")
    prior = config.electra.rtd_prior
    if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0.0 <= prior < 1.0:
        raise ValueError(f"config.electra.rtd_prior={prior!r}: expected 0 (the discriminator's output bias "
                         "starts at 0) or the replaced fraction it starts at, in (0, 1)")
    return dict(config.electra)


def build_steps(config, model_cfg: BertConfig, mesh: Mesh) -> Steps:
    """Pre-training's model, objective and optimizer (``config.optimizer``) through the shared
    builder (`bert_jax.training.steps.jit_steps`). Gradient accumulation is a ``lax.scan`` inside
    the step (one call = one optimizer step over `accumulation_steps` micro-batches)."""
    optimizer = config.optimizer.to_dict()
    if optimizer["generator_lr_scale"] != 1.0 and config.objective != "rtd":
        raise ValueError(f"--config.optimizer.generator_lr_scale={optimizer['generator_lr_scale']}: ELECTRA's "
                         f"generator rate (objective 'rtd'); objective {config.objective!r} has no generator")
    rules = tuple(tuple(r) for r in config.sharding_rules)
    accumulation = accumulation_steps(config, mesh, rules)
    make_model = pretraining_model(model_cfg, config.objective, electra_settings(config))
    return jit_steps(make_model, optimizer, mesh, rules,
                     functools.partial(train_step, accumulation_steps=accumulation), eval_step, accumulation)


# ------------------------------------------------------------------------------------------------
# The input: each process's rows of every global batch, with a position a checkpoint records.
# ------------------------------------------------------------------------------------------------


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


def placing(config, mesh: Mesh, rules, accumulation: int = 1) -> Callable:
    """numpy batch → global arrays on the mesh, adding ``token_index`` (the encoder's blocks on the
    real tokens only) when ``config.unpad_multiple`` > 0."""
    place = functools.partial(sh.global_batch, mesh=mesh, rules=rules)
    multiple = config.unpad_multiple
    if not multiple:
        return place
    if jax.process_count() > 1:
        raise ValueError("config.unpad_multiple needs a single process: every process would have to agree on "
                         "each batch's number of real tokens while seeing only its own rows (docs/pretraining.md)")
    if accumulation > 1:
        raise ValueError("config.unpad_multiple does not go with micro-batches: set per_device_batch=0")
    from input_pipeline.unpadding import adding_token_index

    return adding_token_index(place, sh.batch_shards(mesh, rules), multiple)


def gather_data_states(state: dict, block: int = 0) -> list[dict]:
    """Every process's input position (they differ on a pod: each reads its own files), in the
    order of their input blocks (`sh.process_block`), so each process resumes its own stream.
    Single process: ``[state]``."""
    if jax.process_count() == 1:
        return [state]
    from jax.experimental import multihost_utils

    raw = json.dumps([block, state]).encode()
    if len(raw) > 4096:
        raise ValueError(f"input pipeline state too large to gather ({len(raw)} bytes)")
    rows = multihost_utils.process_allgather(np.frombuffer(raw.ljust(4096), np.uint8))  # [processes, 4096]
    rows = [json.loads(bytes(r).decode().strip()) for r in np.asarray(rows)]
    return [s for _, s in sorted(rows, key=lambda row: row[0])]


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


def evaluate(eval_fn, state, data, num_batches: int, mesh, rules,
             interrupted: Callable[[], bool] = lambda: False, train_counts=None) -> dict | None:
    """Held-out metrics over ``num_batches`` batches; None if ``interrupted()`` turns true on the way.
    ``train_counts`` (the training batches' masked labels, `health.LabelCounts.counts`): adds
    ``mlm_unigram_cross_entropy``, the held-out labels' loss under their frequencies."""
    totals = None
    for _ in range(num_batches):
        if interrupted():
            return None
        # Summed on the host: a handful of scalars and histograms, and no eager op on arrays sharded
        # over every device (each would compile a program; one such add aborted a CPU test run).
        sums = jax.device_get(eval_fn(state.params, sh.global_batch(next(data), mesh, rules)))
        totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
    result = {k: float(v) for k, v in summarize(totals).items()}
    if train_counts is not None and "mlm_label_counts" in totals and train_counts.sum():
        result["mlm_unigram_cross_entropy"] = health.unigram_cross_entropy(train_counts, totals["mlm_label_counts"])
    return result


def step0_reference(workdir) -> dict | None:
    """The step-0 evaluation recorded in ``workdir``'s metrics.jsonl (the last, if recorded twice),
    or None: a resumed run's reference for the collapse warning."""
    try:
        rows = [r for r in read_metrics(workdir, "eval") if r["step"] == 0]
    except (FileNotFoundError, ValueError):
        return None
    return rows[-1] if rows else None


# ------------------------------------------------------------------------------------------------
# Where a run starts other than its own checkpoint: init_checkpoint, or fresh.
# ------------------------------------------------------------------------------------------------

# What init_checkpoint carries over: "state" (parameters, optimizer state and step: the paper's phase 2
# continues phase 1's schedule), "params" (parameters only: the LAMB recipe's phase 2) or "encoder" (the
# encoder's parameters ``bert/`` only, into a fresh state of any objective: ELECTRA's discriminator
# warm-started from a masked LM's encoder, then trained jointly with a fresh generator).
INIT_MODES = ("state", "params", "encoder")
ENCODER = "bert"  # the encoder's key in every pre-training model's parameters


def check_start(config) -> None:
    """``init_mode`` is one of `INIT_MODES`, and "encoder" has an ``init_checkpoint`` to take it from."""
    if config.init_mode not in INIT_MODES:
        raise ValueError(f"config.init_mode={config.init_mode!r}: expected one of {INIT_MODES}")
    if config.init_mode == "encoder" and not config.init_checkpoint:
        raise ValueError("init_mode=encoder starts the encoder from a masked LM's workdir: set "
                         "--config.init_checkpoint=WORKDIR (ELECTRA's runlocal: the workdir of python train.py "
                         "--config configs/pretrain.py:model=modernbert,runlocal --workdir /tmp/modernbert_tiny), "
                         "or --config.init_mode=state to start from scratch")


def initial_state(config, layout) -> TrainState:
    """``init_checkpoint`` per ``init_mode`` (`INIT_MODES`), else a fresh state (the trainer has
    looked for the workdir's own checkpoint first)."""
    check_start(config)
    if not config.init_checkpoint:
        return layout.create(config.seed)
    mode = config.init_mode
    if not (as_path(config.init_checkpoint) / "checkpoints").is_dir():  # Orbax would create it
        raise FileNotFoundError(f"--config.init_checkpoint={config.init_checkpoint}: no checkpoints/ directory "
                                f"(expected the workdir of a pre-training run)")
    source = Checkpointer(config.init_checkpoint)
    try:
        if mode == "encoder":  # the rest (heads, a generator) as a fresh start of this seed initialises it
            state = layout.create(config.seed)
            target = layout.target().params
            encoder = source.restore_params({ENCODER: target[ENCODER]}, what="encoder's parameters")
            state = layout.from_params({**state.params, ENCODER: encoder[ENCODER]})
        elif mode == "params":  # a new run on old weights: step 0, fresh optimizer, its own schedule
            state = layout.from_params(source.restore_params(layout.target().params))
        else:
            state, _ = source.restore(layout.target(), hint=False)
    finally:
        source.close()
    log.info("initialised from %s (%s) at step %d", config.init_checkpoint, mode, int(state.step))
    return state


# ------------------------------------------------------------------------------------------------
# The task the trainer runs.
# ------------------------------------------------------------------------------------------------


class PreTraining:
    """Pre-training's part of `bert_jax.training.trainer.run`: one run, in the workdir itself."""

    name = ""  # log lines carry no task name
    show_progress = True

    def __init__(self, config, is_main: bool):
        self.config, self.is_main = config, is_main
        check_start(config)
        self.model = model_config(config, vocab_size_of(config))
        if config.data.max_seq_length > self.model.max_length:
            raise ValueError(f"--config.data.max_seq_length={config.data.max_seq_length}: expected at most "
                             f"{self.model.max_length} (the model's max_position_embeddings)")
        self.mesh = sh.make_mesh(tuple(config.mesh_shape))
        self.rules = tuple(tuple(r) for r in config.sharding_rules)
        self.block = sh.process_block(self.mesh, self.rules, config.batch_size)
        self.data = make_input(config, "train", self.block)  # opens the input: a missing file fails here
        self.eval_data = None if eval_source(config) is None else make_input(config, "eval", self.block)
        # Every evaluation reads the same held-out batches (the same dynamic masks too): a step's
        # numbers then depend on its parameters alone, not on how many evaluations came before it (the
        # cadence, a resume), and the collapse warning compares like with like against step 0.
        self.eval_start = self.eval_data.state() if self.eval_data is not None else None
        if is_main and self.eval_data is not None:
            from input_pipeline.pretraining.dataset import eval_repeats

            if warning := eval_repeats(config, jax.process_count()):  # what the dry run warns of too
                log.warning("%s", warning)
        self.monitor = health.HealthMonitor(warmup_steps=config.optimizer.warmup_steps, enabled=is_main,
                                            advice=health.advice(config.optimizer),
                                            total_steps=config.num_train_steps)
        self.batches = None
        self.last_eval: dict = {}
        # The masked labels of the training batches this process has read since it started: the
        # fitted unigram model the generator's warning compares against (`health.unigram_sign`).
        self.label_counts = health.LabelCounts(self.model.vocab_size)

    def runs(self, workdir) -> list[tuple[int, object]]:
        return [(self.config.seed, workdir)]

    def build_steps(self, seed: int) -> Steps:
        return build_steps(self.config, self.model, self.mesh)

    def total_steps(self) -> int:
        return self.config.num_train_steps

    def initial_state(self, layout, seed: int) -> TrainState:
        return initial_state(self.config, layout)

    def inputs(self, steps: Steps, seed: int, start: int, meta: dict | None, workdir):
        """The placed training batches from the restored position (``meta``: the checkpoint's).
        The collapse warning's reference: the step-0 evaluation (recorded like any other, so a
        resumed run reads it back)."""
        if meta is not None:
            per_process = meta.get("data_per_process") or [meta["data"]]
            if len(per_process) != self.block[1]:
                raise ValueError(f"{workdir}/checkpoints: saved by {len(per_process)} processes, resumed by "
                                 f"{self.block[1]}; the input position cannot be carried over")
            self.data.restore(per_process[self.block[0]])
        if self.is_main and start > 0:
            self.monitor.reference = step0_reference(workdir)
        placed = placing(self.config, self.mesh, self.rules, steps.accumulation_steps)

        def place(batch):
            return placed(self.label_counts.add(batch))

        if not self.config.prefetch_batches:
            return self.counted(map(place, self.data))
        from bert_jax.training.prefetch import DevicePrefetch  # read, pack and place ahead while the step runs

        self.batches = DevicePrefetch(self.data, place, self.config.prefetch_batches)
        return self.counted(self.batches)

    def counted(self, batches):
        """``batches`` as they are, each one's labels counted as the step takes it (`health.LabelCounts`)."""
        for batch in batches:
            self.label_counts.commit()
            yield batch

    def meta(self, step: int) -> dict:
        states = gather_data_states((self.batches or self.data).state(), self.block[0])
        return {"data": states[0], "data_per_process": states, "step": step, "model": dataclasses.asdict(self.model)}

    def evaluation_due(self, step: int, total: int) -> bool:
        return self.eval_data is not None and (step % self.config.eval_every == 0 or step == total)

    def evaluate(self, steps: Steps, state, step: int, writer, interrupted: Callable[[], bool]) -> bool:
        """The held-out metrics at ``step``, written and shown; False if a signal interrupted it."""
        if self.eval_data.state() != self.eval_start:
            self.eval_data.restore(self.eval_start)
        result = evaluate(steps.eval_fn, state, self.eval_data, self.config.eval_steps, self.mesh, self.rules,
                          interrupted, self.label_counts.counts)
        if result is None:
            return False
        self.last_eval = result
        writer.write(step, result, "eval")
        if self.is_main:
            print(f"eval at step {step}: " + json.dumps({k: round(v, 4) for k, v in result.items()}), flush=True)
        if step == 0:
            self.monitor.reference = result
        self.monitor.check(step, result, "eval")
        return True

    def logged(self, step: int, summary: dict, first: dict | None) -> None:
        """After each logged window: the collapse warning. Without a step-0 evaluation its reference
        is the first step's metrics (the initial parameters on a training batch)."""
        if self.monitor.enabled and self.monitor.reference is None and first is not None:
            self.monitor.reference = {k: float(v) for k, v in jax.device_get(first).items()}
        self.monitor.check(step, summary, "train")

    def finish(self, steps: Steps, state, step: int, train: dict, writer, workdir) -> dict:
        return {k: v for k, v in (("train", train), ("eval", self.last_eval)) if v}

    def summarize(self, results: list[dict], workdir) -> dict:
        return results[0]

    def close(self) -> None:
        if self.batches is not None:
            self.batches.close()


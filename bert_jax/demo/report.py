"""The numbers `python -m bert_jax.demo` reports: the MLM unigram baseline, fine-tuning rows, the results table
(printed and written to ``<workdir>/demo_results.md``) and the machine it ran on."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import os
import platform
from pathlib import Path


def duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (all threads)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine() -> str:
    """e.g. 'AMD EPYC 7B13, 2 CPU cores, JAX 0.10.2 on cpu'."""
    import jax

    model = platform.processor() or platform.machine()
    with_name = Path("/proc/cpuinfo")
    if with_name.exists():
        for line in with_name.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    device = jax.devices()[0]
    kind = device.platform if device.platform == "cpu" else f"{device.platform} ({device.device_kind})"
    return f"{model}, {cores} CPU cores, JAX {jax.__version__} on {kind}"


def unigram_baseline(config, eval_epochs: int = 5) -> tuple[int, dict]:
    """(eval batches in one pass over the held-out documents, the baseline): the accuracy of always
    predicting the token most often masked in one epoch of the training split, measured on the
    masked positions of ``eval_epochs`` passes (each with its own dynamic masks) over the eval split
    — the same masking and positions the trainer's MLM accuracy is measured on."""
    import numpy as np

    from input_pipeline.pretraining.dataset import make_pretraining_dataset

    def passes(split: str, epochs: int):
        data = make_pretraining_dataset(config, split=split, batch_size=config.batch_size)
        while True:
            batch = next(data)
            if data.state()["epoch"] >= epochs:
                return
            yield data.state()["epoch"], batch

    counts = collections.Counter()
    for _, b in passes("train", 1):
        counts.update(b["masked_lm_ids"][b["masked_lm_weights"] > 0].tolist())
    token = counts.most_common(1)[0][0]
    hits = total = eval_batches = 0
    for epoch, b in passes("eval", eval_epochs):
        eval_batches += epoch == 0
        w = b["masked_lm_weights"] > 0
        hits += int(np.sum(b["masked_lm_ids"][w] == token))
        total += int(np.sum(w))
    from input_pipeline.package_data import resolve

    vocab = Path(resolve(config.data.vocab))
    vocab = vocab / "vocab.txt" if vocab.is_dir() else vocab
    lines = vocab.read_text(encoding="utf-8").splitlines() if vocab.suffix == ".txt" else []
    name = lines[token] if token < len(lines) else str(token)
    return eval_batches, {"token": name, "token_id": int(token), "accuracy": hits / max(total, 1),
                          "masked_tokens": total, "eval_passes": eval_epochs,
                          "train_share": counts[token] / max(sum(counts.values()), 1)}


def finetune_row(key: str, label: str, settings: dict, config, results: dict, workdir: Path,
                 probe: dict | None = None) -> dict:
    from bert_jax.training.metric_writer import read_metrics

    dev = results["summary"].get("dev", {}).get("accuracy", {})
    per_seed = [r["dev"]["accuracy"] for r in results["per_seed"]]
    first = workdir / f"seed_{results['seeds'][0]}" if len(results["seeds"]) > 1 else workdir
    steps = max((r["step"] for r in read_metrics(first, "train")), default=0)
    return {"key": key, "label": label, "seeds": len(per_seed), "per_seed": per_seed,
            "mean": dev.get("mean", float("nan")), "steps": steps, "epochs": settings["epochs"],
            "lr": settings["lr"], "batch": config.batch_size,
            "max_train_examples": settings["max_train_examples"], "fixed_steps": config.num_train_steps,
            "pooling": config.model.get("classifier_pooling", "cls"), "dir": str(workdir),
            "probe": (probe or {}).get("accuracy", {})}


@dataclasses.dataclass
class Report:
    workdir: Path
    argv: list[str]
    seconds: dict = dataclasses.field(default_factory=dict)  # wall time per stage key
    cpu: dict = dataclasses.field(default_factory=dict)  # CPU time (all threads) per stage key
    data: dict = dataclasses.field(default_factory=dict)
    vocab: dict = dataclasses.field(default_factory=dict)
    task_text: dict = dataclasses.field(default_factory=dict)  # the task's unlabelled training sentences, if used
    pretrain: dict = dataclasses.field(default_factory=dict)  # model -> its pre-training run
    finetune: list = dataclasses.field(default_factory=list)
    dev: dict = dataclasses.field(default_factory=dict)  # sizes / majority class of the dev split
    reused: set = dataclasses.field(default_factory=set)  # stages whose results were already there

    PRETRAIN_TITLES = {"bert": "BERT (MLM + NSP, dynamic masking)",
                       "electra": "ELECTRA (replaced-token detection, dynamic masking)"}

    @staticmethod
    def pretrain_key(model: str) -> str:
        """Stage key of a pre-training run: 3 for BERT (as ever), 3e for ELECTRA."""
        return "3" if model == "bert" else "3" + model[0]

    def _pretrain_line(self, model: str, p: dict) -> str:
        final, base = p.get("final", {}), p.get("baseline", {})
        nan = float("nan")
        if model == "electra":
            what, extra = "generator MLM + 50 × replaced-token detection", (
                f"; the discriminator's held-out AUC **{final.get('rtd_auc', nan):.3f}** (BCE "
                f"{final.get('rtd_bce_over_prior', nan):.2f} × the label prior's entropy), right on "
                f"{final.get('rtd_accuracy', nan):.3f} of real tokens "
                f"({final.get('rtd_replaced_fraction', nan):.3f} replaced)")
            accuracy = "generator MLM accuracy"
        else:
            what, extra = "MLM + NSP", f"; NSP accuracy {final.get('nsp_accuracy', nan):.3f}"
            accuracy = "MLM accuracy"
        key = self.pretrain_key(model)
        return (f"| {key}. pre-training, tiny {model.upper()}, {p.get('steps')} steps × {p.get('batch')} × "
                f"{p.get('seq_len')}, {what} | {accuracy} **{final.get('mlm_accuracy', nan):.3f}** on held-out "
                f"documents vs. unigram baseline {base.get('accuracy', nan):.3f} (always `{base.get('token')}`)"
                f"{extra}{self._reused(key)} | | {self._times(key)} |")

    def _times(self, key: str) -> str:
        return f"{duration(self.seconds.get(key, 0))} | {duration(self.cpu.get(key, 0))}"

    def _reused(self, key: str) -> str:
        return " (reused from an earlier run)" if key in self.reused else ""

    def _row_text(self, row: dict) -> str:
        runs = f"{row['seeds']} seed{'s' if row['seeds'] > 1 else ''}"
        budget = (f"{row['fixed_steps']} steps" if row["fixed_steps"] else
                  f"{row['epochs']:g} epoch{'s' if row['epochs'] != 1 else ''} = {row['steps']} steps")
        budget += f" of {row['batch']}"
        if row["max_train_examples"]:
            budget += f" on the first {row['max_train_examples']:,} training sentences"
        seeds = " / ".join(f"{v:.3f}" for v in row["per_seed"])
        head = "mean of the tokens" if row.get("pooling") == "mean" else "pooled [CLS]"
        return (f"dev accuracy **{row['mean']:.3f}** (mean of {runs}: {seeds}; {budget}, lr {row['lr']:g}; "
                f"classifier on the {head})")

    @staticmethod
    def _probe_text(row: dict) -> str:
        p = row.get("probe") or {}
        if not p:
            return ""
        nan = float("nan")
        return (f"**{p.get('last4_mean', nan):.3f}** (last layers), {p.get('mean', nan):.3f} (last layer), "
                f"{p.get('cls', nan):.3f} ([CLS])")

    def markdown(self) -> str:
        v = self.vocab
        p = self.pretrain.get("bert") or next(iter(self.pretrain.values()), {})
        base = p.get("baseline", {})
        lines = ["# bert-jax demo results", "",
                 f"Machine: {machine()}. {datetime.date.today().isoformat()}.",
                 "Command: `" + " ".join(["python -m bert_jax.demo", *self.argv]) + "`", "",
                 "| stage | result | frozen features | wall time | CPU time |", "|---|---|---|---|---|"]
        d = self.data
        lines.append(f"| 1. data (pip, cached) | corpus `{d.get('corpus')}`, task `{d.get('task_file')}` | | "
                     f"{self._times('1')} |")
        lines.append(f"| 2. WordPiece vocabulary | {v.get('vocab_size', 0):,} tokens from {v.get('sentences', 0):,} "
                     f"sentences ([UNK] rate {v.get('unk_rate', 0):.2%}){self._reused('2')} | | {self._times('2')} |")
        lines += [self._pretrain_line(model, run) for model, run in self.pretrain.items()]
        for i, row in enumerate(self.finetune):
            key = f"4{'abcde'[i]}"
            lines.append(f"| {key}. fine-tune {row['label']} | {self._row_text(row)}{self._reused(key)} | "
                         f"{self._probe_text(row)} | {self._times(key)} |")
        lines.append(f"| total | | | {self._times('total')} |")
        lines.append("")
        for model, run in self.pretrain.items():
            curve = ", ".join(f"{s}: {a:.3f}" for s, a in run.get("curve", []))
            what = "generator's MLM accuracy" if model == "electra" else "MLM accuracy"
            lines.append(f"{model.upper()}: {what} on the held-out documents during pre-training "
                         f"(step: accuracy): {curve}.")
            if run.get("auc_curve"):
                auc = ", ".join(f"{s}: {a:.3f}" for s, a in run["auc_curve"])
                lines.append(f"{model.upper()}: the discriminator's held-out AUC (step: AUC): {auc}.")
        lines += [
                  f"The unigram baseline is measured on {base.get('masked_tokens', 0):,} masked positions "
                  f"({base.get('eval_passes')} passes over the held-out documents, dynamic masks).", ""]
        if self.dev:
            lines += [f"Sentiment task: {self.dev['train']:,} training and {self.dev['dev']:,} dev sentences; "
                      f"always answering the majority class scores {self.dev['majority']:.3f} on dev.", ""]
        if any(row.get("probe") for row in self.finetune):
            lines += ["Frozen features: the dev accuracy of a logistic regression on each row's *starting* encoder, "
                      "weights untouched (`python -m bert_jax.finetuning.probe`): the last four hidden layers "
                      "concatenated (all three of a 2-layer encoder, the embedding output counting as one), each "
                      "averaged over the sentence's tokens, as the paper's feature-based approach; then the last "
                      "layer alone, averaged and at [CLS]. The from-scratch row's is the same network at random "
                      "initialisation, so a pre-trained row above it learned features the task can use.", ""]
        dirs = ", ".join(f"`{Path(run.get('dir', '')).name}/`" for run in self.pretrain.values())
        lines += [f"TensorBoard: `tensorboard --logdir {self.workdir}` (pre-training in {dirs}, fine-tuning in "
                  f"`finetune/`).", ""]
        return "\n".join(lines)

    def write(self, text: str) -> Path:
        path = self.workdir / "demo_results.md"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return path

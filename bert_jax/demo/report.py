"""The numbers `python -m bert_jax.demo` reports: the MLM unigram baseline, fine-tuning rows, the paired
bootstrap of pre-trained minus scratch on dev, the results table (printed and written to
``<workdir>/demo_results.md``), the learning-rate selection on validation and the machine it ran on."""

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
    — the same masking and positions the trainer's MLM accuracy is measured on; and two unigram
    cross-entropies in nats on those positions: ``entropy``, of the held-out masked tokens' own
    frequencies (what the trainer's ``mlm_unigram_entropy`` measures on one pass), and
    ``train_cross_entropy``, of the training epoch's frequencies (add-one smoothed over the vocabulary).
    ``held_out_sha256``: a fingerprint of the first pass's batches (`held_out_fingerprint`), which
    tells whether two runs evaluated the same tokens and masks."""
    import hashlib

    import numpy as np

    counts = collections.Counter()
    for _, b in passes(config, "train", 1):
        counts.update(b["masked_lm_ids"][b["masked_lm_weights"] > 0].tolist())
    token = counts.most_common(1)[0][0]
    hits = total = eval_batches = 0
    held_out = collections.Counter()
    fingerprint = hashlib.sha256()
    for epoch, b in passes(config, "eval", eval_epochs):
        eval_batches += epoch == 0
        if epoch == 0:
            held_out_fingerprint(fingerprint, b)
        w = b["masked_lm_weights"] > 0
        hits += int(np.sum(b["masked_lm_ids"][w] == token))
        total += int(np.sum(w))
        held_out.update(b["masked_lm_ids"][w].tolist())
    from input_pipeline.package_data import locate

    vocab = Path(locate(config.data.vocab))
    vocab = vocab / "vocab.txt" if vocab.is_dir() else vocab
    lines = vocab.read_text(encoding="utf-8").splitlines() if vocab.suffix == ".txt" else []
    name = lines[token] if token < len(lines) else str(token)
    n = np.array(list(held_out.values()), np.float64)
    entropy = float(-(n / n.sum() * np.log(n / n.sum())).sum()) if total else float("nan")
    vocab_size = max(len(lines), max(held_out, default=0) + 1, max(counts, default=0) + 1)
    train_total = sum(counts.values())
    train_ce = (-sum(c * np.log((counts[t] + 1) / (train_total + vocab_size)) for t, c in held_out.items()) / total
                if total else float("nan"))
    return eval_batches, {"token": name, "token_id": int(token), "accuracy": hits / max(total, 1),
                          "masked_tokens": total, "eval_passes": eval_epochs,
                          "train_share": counts[token] / max(train_total, 1),
                          "entropy": entropy, "train_cross_entropy": float(train_ce),
                          "held_out_sha256": fingerprint.hexdigest()}


def held_out_sha256(config) -> str:
    """The SHA-256 of one pass over ``config``'s held-out batches (`held_out_fingerprint`): what
    `unigram_baseline` reports as ``held_out_sha256``, without its other passes."""
    import hashlib

    h = hashlib.sha256()
    for _, batch in passes(config, "eval", 1):
        held_out_fingerprint(h, batch)
    return h.hexdigest()


def passes(config, split: str, epochs: int):
    """(epoch, batch) of ``config``'s pre-training batches of ``split`` for its first ``epochs`` passes."""
    from input_pipeline.pretraining.dataset import make_pretraining_dataset

    data = make_pretraining_dataset(config, split=split, batch_size=config.batch_size)
    while True:
        batch = next(data)
        if data.state()["epoch"] >= epochs:
            return
        yield data.state()["epoch"], batch


def held_out_fingerprint(h, batch: dict):
    """Adds a held-out ``batch`` (numpy arrays) to SHA-256 ``h``: each field's name, shape and values
    (as int64 / float64, so a dtype of the pipeline's own does not matter), fields in name order."""
    import numpy as np

    for key in sorted(batch):
        a = np.asarray(batch[key])
        a = a.astype(np.float64 if a.dtype.kind == "f" else np.int64)
        h.update(f"{key}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())


def finetune_row(key: str, label: str, settings: dict, config, results: dict, workdir: Path,
                 probe: dict | None = None) -> dict:
    from bert_jax.training.metric_writer import read_metrics

    dev = results["summary"].get("dev", {}).get("accuracy", {})
    per_seed = [r["dev"]["accuracy"] for r in results["per_seed"]]
    seed_ids = list(results["seeds"])
    first = workdir / f"seed_{results['seeds'][0]}" if len(results["seeds"]) > 1 else workdir
    steps = max((r["step"] for r in read_metrics(first, "train")), default=0)
    return {"key": key, "label": label, "seeds": len(per_seed), "per_seed": per_seed, "seed_ids": seed_ids,
            "mean": dev.get("mean", float("nan")), "steps": steps, "epochs": settings["epochs"],
            "lr": settings["lr"], "batch": config.batch_size,
            "max_train_examples": settings["max_train_examples"], "fixed_steps": config.num_train_steps,
            "pooling": config.model.classifier_pooling, "dir": str(workdir),
            "scratch": settings.get("scratch"), "model": settings.get("model"),
            "probe": (probe or {}).get("accuracy", {})}


def dev_correctness(directory: Path, seeds: list[int], split: str = "dev") -> dict[str, float] | None:
    """{example id: its correctness averaged over ``seeds``} in file order, from the prediction files
    the fine-tuning trainer writes (``[seed_S/]predictions/<split>_sentiment.tsv``: id, prediction,
    p_positive, label, text); None when a seed's file is missing."""
    totals: dict[str, float] = {}
    for seed in seeds:
        path = (directory / f"seed_{seed}" if len(seeds) > 1 else directory) / "predictions" / f"{split}_sentiment.tsv"
        if not path.exists():
            return None
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            example_id, prediction, _, label, _ = line.split("\t", 4)
            totals[example_id] = totals.get(example_id, 0.0) + float(prediction == label)
    return {k: v / len(seeds) for k, v in totals.items()}


def paired_bootstrap(a, b, *, resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """mean(a - b) over paired items (per-sentence correctness of two rows) and its ``level``
    percentile interval from ``resamples`` resamples of the items with replacement (numpy,
    ``default_rng(seed)``): the same inputs give the same interval."""
    import numpy as np

    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    if d.ndim != 1 or not len(d):
        raise ValueError(f"paired_bootstrap: expected two equal-length non-empty lists, got {len(a)} and {len(b)}")
    means = d[np.random.default_rng(seed).integers(0, len(d), (resamples, len(d)))].mean(1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return {"difference": float(d.mean()), "low": float(low), "high": float(high), "n": len(d),
            "resamples": resamples, "bootstrap_seed": seed, "level": level}


def selection_markdown(results: list[dict], *, validation: int, train: int, majority: float, command: str) -> str:
    """``--select_lr``'s table: each row's validation accuracy at each rate, its best in bold."""
    lrs = sorted({r["lr"] for r in results})
    best = {}
    for r in results:
        if r["row"] not in best or r["mean"] > best[r["row"]]["mean"]:
            best[r["row"]] = r
    lines = ["# bert-jax demo: fine-tuning learning rate, chosen on validation", "",
             f"Machine: {machine()}.", f"Command: `{command}`", "",
             f"Validation: {validation:,} sentences (every 10th training sentence; always answering the majority "
             f"class scores {majority:.3f}), fine-tuned on the other {train:,}. Dev is not read.", "",
             "| row | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | chosen |",
             "|---|" + "---|" * (len(lrs) + 1)]
    for row in dict.fromkeys(r["row"] for r in results):
        cells = []
        for lr in lrs:
            r = next((r for r in results if r["row"] == row and r["lr"] == lr), None)
            if r is None:
                cells.append("")
                continue
            text = f"{r['mean']:.3f}" + (f" ({' / '.join(f'{v:.3f}' for v in r['per_seed'])})"
                                         if len(r["per_seed"]) > 1 else "")
            when = "reused from an earlier run" if r.get("reused") else duration(r["seconds"])
            cells.append((f"**{text}**" if r is best[row] else text) + f", {when}")
        label = next(r["label"] for r in results if r["row"] == row)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {best[row]['lr']:g} |")
    return "\n".join([*lines, ""])


def finetune_key(i: int) -> str:
    """Stage key of the i-th fine-tuning row: 4a, 4b, ..."""
    return f"4{chr(ord('a') + i)}"


@dataclasses.dataclass
class Report:
    workdir: Path
    argv: list[str]
    seconds: dict = dataclasses.field(default_factory=dict)  # wall time per stage key
    cpu: dict = dataclasses.field(default_factory=dict)  # CPU time (all threads) per stage key
    data: dict = dataclasses.field(default_factory=dict)
    vocab: dict = dataclasses.field(default_factory=dict)
    task_text: dict = dataclasses.field(default_factory=dict)  # the task's unlabelled training sentences, if used
    pretrain: dict = dataclasses.field(default_factory=dict)  # run's directory name -> its pre-training run
    finetune: list = dataclasses.field(default_factory=list)
    dev: dict = dataclasses.field(default_factory=dict)  # sizes / majority class of the dev split
    reused: set = dataclasses.field(default_factory=set)  # stages whose results were already there
    comparisons: list = dataclasses.field(default_factory=list)  # pre-trained minus scratch on dev (paired bootstrap)
    curve: list = dataclasses.field(default_factory=list)  # --curve's lines: the figure and its numbers

    PRETRAIN_TITLES = {"modernbert": "ModernBERT (MLM, 30% masked, documents packed apart)",
                       "electra_mlm": "ELECTRA whose discriminator starts from the ModernBERT run",
                       "bert": "BERT (MLM + NSP, dynamic masking)",
                       "electra": "ELECTRA (replaced-token detection, dynamic masking)"}
    NAMES = {"modernbert": "ModernBERT", "bert": "BERT", "electra": "ELECTRA", "electra_mlm": "ELECTRA from ModernBERT"}

    @staticmethod
    def pretrain_key(model: str, seed: int = 0) -> str:
        """Stage key of a pre-training run: 3 for BERT (as ever), 3e for ELECTRA, 3m for ModernBERT, 3x
        for ELECTRA from ModernBERT; a pre-training seed S > 0 appends S (3m1)."""
        letter = {"bert": "", "electra_mlm": "x"}.get(model, model[0])
        return "3" + letter + (str(seed) if seed else "")

    def _pretrain_line(self, p: dict) -> str:
        final, base = p.get("final", {}), p.get("baseline", {})
        nan = float("nan")
        model = p.get("model", "bert")
        key = self.pretrain_key(model, p.get("seed", 0))
        seed = f", seed {p['seed']}" if len([r for r in self.pretrain.values() if r.get("model") == model]) > 1 else ""
        head = (f"| {key}. pre-training, tiny {self.NAMES[model]}{seed}, {p.get('steps')} steps × {p.get('batch')} × "
                f"{p.get('seq_len')}, ")
        if model.startswith("electra"):
            loss, entropy = final.get("mlm_loss", nan), final.get("mlm_unigram_entropy", nan)
            verdict = "below" if loss < entropy else "above"
            result = (f"the discriminator's held-out AUC **{final.get('rtd_auc', nan):.3f}** (BCE "
                      f"{final.get('rtd_bce_over_prior', nan):.2f} × the label prior's entropy), right on "
                      f"{final.get('rtd_accuracy', nan):.3f} of real tokens "
                      f"({final.get('rtd_replaced_fraction', nan):.3f} replaced); its last layer's top direction "
                      f"holds {final.get('token_top_share', nan):.0%} of the variance. The generator: held-out loss "
                      f"**{loss:.2f}** nats, {verdict} the masked tokens' unigram cross-entropy {entropy:.2f}; "
                      f"sampled accuracy {final.get('mlm_sampled_accuracy', nan):.4f}")
            return (f"{head}generator MLM + 50 × replaced-token detection | {result}{self._reused(key)} | | "
                    f"{self._times(key)} |")
        objective = "MLM + NSP" if model == "bert" else "MLM, 30% masked"
        nsp = f"; NSP accuracy {final.get('nsp_accuracy', nan):.3f}" if model == "bert" else ""
        return (f"{head}{objective} | MLM accuracy **{final.get('mlm_accuracy', nan):.3f}** on held-out "
                f"documents vs. unigram baseline {base.get('accuracy', nan):.3f} (always `{base.get('token')}`)"
                f"{nsp}{self._reused(key)} | | {self._times(key)} |")

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
        lines = ["# bert-jax demo results", "",
                 f"Machine: {machine()}. {datetime.date.today().isoformat()}.",
                 "Command: `" + " ".join(["python -m bert_jax.demo", *self.argv]) + "`", "",
                 "| stage | result | frozen features | wall time | CPU time |", "|---|---|---|---|---|"]
        d = self.data
        lines.append(f"| 1. data (pip, cached) | corpus `{d.get('corpus')}`, task `{d.get('task_file')}` | | "
                     f"{self._times('1')} |")
        lines.append(f"| 2. WordPiece vocabulary | {v.get('vocab_size', 0):,} tokens from {v.get('sentences', 0):,} "
                     f"sentences ([UNK] rate {v.get('unk_rate', 0):.2%}){self._reused('2')} | | {self._times('2')} |")
        lines += [self._pretrain_line(run) for run in self.pretrain.values()]
        for i, row in enumerate(self.finetune):
            key = finetune_key(i)
            lines.append(f"| {key}. fine-tune {row['label']} | {self._row_text(row)}{self._reused(key)} | "
                         f"{self._probe_text(row)} | {self._times(key)} |")
        keys = {row.get("key"): finetune_key(i) for i, row in enumerate(self.finetune)}
        for c in self.comparisons:
            rows = "+".join(keys.get(r, r) for r in c.get("rows", [c["row"]]))
            what = "pre-trained minus scratch" if len(c.get("rows", [])) < 2 else (
                f"**pooled** over {len(c['rows'])} pre-training seeds, minus scratch")
            lines.append(f"| {rows} − {keys.get(c.get('scratch', 'scratch'), 'scratch')}. {what} | dev accuracy "
                         f"**{c['difference']:+.3f}** [{c['low']:+.3f}, {c['high']:+.3f}]: {c['level']:.0%} interval, "
                         f"paired bootstrap over the {c['n']:,} dev sentences | | | |")
        lines.append(f"| total | | | {self._times('total')} |")
        lines.append("")
        for run in self.pretrain.values():
            model, base = run.get("model", "bert"), run.get("baseline", {})
            name = self.NAMES[model] + (f" (seed {run['seed']})" if run.get("seed") else "")
            if model.startswith("electra"):
                loss = ", ".join(f"{s}: {a:.2f}" for s, a in run.get("loss_curve", []))
                b = run.get("baseline", {})
                more = (f" ({b['entropy']:.2f} over {b['masked_tokens']:,} masked positions of {b['eval_passes']} "
                        f"passes; {b['train_cross_entropy']:.2f} with the training documents' frequencies, add-one "
                        "smoothed)" if "train_cross_entropy" in b else "")
                lines.append(f"{name}: the generator's held-out loss during pre-training (step: nats): {loss}; the "
                             f"masked tokens' unigram cross-entropy (the entropy of their frequencies in the same "
                             f"held-out batches) {run.get('final', {}).get('mlm_unigram_entropy', float('nan')):.2f}"
                             f"{more}. Sampled accuracy: how often the generator's sample is the original token.")
            else:
                curve = ", ".join(f"{s}: {a:.3f}" for s, a in run.get("curve", []))
                lines.append(f"{name}: MLM accuracy on the held-out documents during pre-training "
                             f"(step: accuracy): {curve}. The unigram baseline (always the token most often masked "
                             f"in training) is measured on {base.get('masked_tokens', 0):,} masked positions "
                             f"({base.get('eval_passes')} passes over the held-out documents, dynamic masks).")
            if run.get("auc_curve"):
                auc = ", ".join(f"{s}: {a:.3f}" for s, a in run["auc_curve"])
                lines.append(f"{name}: the discriminator's held-out AUC (step: AUC): {auc}.")
        lines.append("")
        lines += self.curve
        if self.dev:
            lines += [f"Sentiment task: {self.dev['train']:,} training, {self.dev.get('validation', 0):,} validation "
                      f"(every 10th training sentence: where the fine-tuning learning rate was chosen, "
                      f"`--select_lr`, and the pre-training model) and {self.dev['dev']:,} dev sentences (reported "
                      f"here; the classifier's pooling and the fine-tuning budget were chosen on it earlier: "
                      f"docs/records.md, \"Choices made on dev before the validation split\"); always answering the "
                      f"majority class scores {self.dev['majority']:.3f} "
                      f"on dev.", ""]
        if self.comparisons:
            c = self.comparisons[0]
            lines += [f"Pre-trained minus scratch: the difference of the rows' dev accuracies, each dev sentence's "
                      f"correctness averaged over each row's fine-tuning seeds; pooled: averaged over every "
                      f"pre-training and fine-tuning seed of the model. The interval: {c['resamples']:,} resamples "
                      f"of the {c['n']:,} sentences with replacement (numpy, seed {c['bootstrap_seed']}); a single "
                      f"pre-training seed's covers the sentences' sampling only, the pooled one averages the "
                      f"pre-training runs it holds.", ""]
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

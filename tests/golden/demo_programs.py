"""The programs behind README's demo table, fingerprinted: ``python tests/golden/demo_programs.py``
writes ``tests/golden/demo_programs.json``; ``tests/test_demo_programs.py`` checks them.

README's demo table and docs/images/demo_curve.png are numbers of one ``make demo FRESH=1`` run (and
``python -m bert_jax.demo --curve``), minutes of training that no fast test can repeat. Any change to
the float arithmetic of the steps that run made those numbers stale (the GeGLU commit's exact GELU
moved the headline by 0.001, found a stop later). So the file records, for the versions that made the
table, a SHA-256 of each step's program as JAX lowers it on a CPU (StableHLO text, from shapes only,
one device; the same text on any CPU): the tiny ModernBERT's pre-training step (configs/demo.py) and
the fine-tuning steps of its classifier and of all-MiniLM-L6-v2's (configs/sentiment.py as the demo
sets it). And, for the versions of the packages that make the data, a SHA-256 of the held-out batches
of each pre-training seed (`bert_jax.demo.report.held_out_sha256`: tokens, masks and row order, from
the gensim and vaderSentiment packages' text through the demo's own vocabulary), the same on any CPU
(``--no_data`` leaves the last file's as they were: no pip download, no vocabulary). Not covered: the
host-side loops.

When a change moves a fingerprint: re-run ``make demo FRESH=1`` and ``python -m bert_jax.demo --curve``
on the same workdir, update README's table, the figure and the record ("Two pre-training seeds of
ModernBERT's masked LM"), then run this script. A change that only adds to a program's outputs (a new
metric) leaves the numbers as they were: say so in the commit and run this script.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).with_name("demo_programs.json")
# The packages whose code is in the programs: another version of any of them lowers other text.
PACKAGES = ("jax", "jaxlib", "flax", "optax")
# The packages whose code makes the demo's held-out batches (the text's packages are pinned by
# input_pipeline.package_data).
DATA_PACKAGES = ("tensorflow", "tensorflow-text", "numpy")
# all-MiniLM-L6-v2's shapes (its config.json): the demo's MiniLM row, without reading the checkpoint.
MINILM = dict(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536, max_position_embeddings=512)


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    return {p: importlib.metadata.version(p) for p in packages}


def lowered(config) -> str:
    """``config``'s training step (`bert_jax.benchmark.trainer_steps.build`) lowered for this
    platform from shapes on one device: StableHLO text."""
    import jax

    from bert_jax.benchmark import trainer_steps
    from bert_jax.training import sharding as sh
    from bert_jax.training.trainer import resolved

    mesh = sh.config_mesh(config, jax.devices()[:1])
    config = resolved(config, mesh)
    steps, _, shapes = trainer_steps.build(config, mesh)
    batch = {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in shapes.items()}
    rng = jax.eval_shape(lambda: jax.random.key(0, impl=config.rng_impl))
    return steps.train_fn.lower(steps.layout.abstract, batch, rng).as_text()


def finetuning(args, s: dict, model: dict):
    """The demo's configs/sentiment.py for a fine-tuning row's settings ``s``
    (`bert_jax.demo.pipeline.finetune_config`), ``model``'s fields on top of its model's where
    sentiment's are None or absent: as a warm start keeps the checkpoint's shape and takes the
    fine-tuning's execution fields."""
    from bert_jax.demo import pipeline as demo

    config, _ = demo.finetune_config(args, "", "", s, "dev")
    with config.unlocked():
        config.model.update({k: v for k, v in model.items() if config.model.get(k) is None})
    return config


def programs() -> dict[str, str]:
    """{step: SHA-256 of its lowered text} of the demo's default rows (`bert_jax.demo.pipeline.finetune_rows`)."""
    from bert_jax.config_args import load_config_file
    from bert_jax.demo import pipeline as demo

    model, args = demo.DEFAULT_PRETRAIN_MODEL, demo.parse_args([])
    pretraining = load_config_file("demo", f"model={model}")
    pretraining.model.vocab_size = demo.VOCAB_SIZE
    encoder = {k: v for k, v in pretraining.model.items() if v is not None}
    rows = {key: s for key, *_, s in demo.finetune_rows(args, {"minilm": True}, "", {(model, 0): Path("pretrained")})}
    configs = {"pretraining": pretraining,
               "finetuning_pretrained": finetuning(args, rows["pretrained-pretrained"], encoder),
               "finetuning_scratch": finetuning(args, rows[demo.scratch_key(model)], {"vocab_size": demo.VOCAB_SIZE}),
               "finetuning_minilm": finetuning(args, rows["minilm"], dict(MINILM, vocab_size=30522))}
    return {name: hashlib.sha256(lowered(c).encode()).hexdigest() for name, c in configs.items()}


def held_out(workdir: Path) -> dict[str, str]:
    """{"seed S": SHA-256 of its held-out batches} of the demo's pre-training runs, its data, vocabulary
    and task text made in ``workdir`` as `python -m bert_jax.demo` makes them (the file order is the
    spec's, so the workdir's path does not matter)."""
    from bert_jax.demo import pipeline as demo
    from bert_jax.demo import report as demo_report

    args = demo.parse_args(["--workdir", str(workdir), "--no_minilm"])
    report = demo_report.Report(workdir=args.workdir, argv=[])
    vocab = demo.build_vocab(args, demo.fetch_data(args, report), report)
    corpus = demo.pretraining_corpus(args, report)
    out = {}
    for seed in range(demo.DEFAULT_PRETRAIN_SEEDS):
        config, _ = demo.load_config("demo", demo.pretrain_arg(args, demo.DEFAULT_PRETRAIN_MODEL, seed),
                                     {"data.input": corpus, "data.vocab": vocab})
        out[f"seed {seed}"] = demo_report.held_out_sha256(config)
    return out


def main(argv=None) -> int:
    import tempfile

    argv = sys.argv[1:] if argv is None else argv
    record = {"made_by": "python tests/golden/demo_programs.py", "versions": versions(), "programs": programs()}
    if "--no_data" in argv:
        old = json.loads(GOLDEN.read_text())
        record.update(data_versions=old["data_versions"], held_out=old["held_out"])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            record.update(data_versions=versions(DATA_PACKAGES), held_out=held_out(Path(tmp)))
    GOLDEN.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

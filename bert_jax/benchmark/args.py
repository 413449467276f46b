"""The command line of ``python -m bert_jax.benchmark`` (usage in bert_jax/benchmark/command.py's docstring):
``parse_args``, and the checks of ``--compare`` and ``--variant`` (bert_jax/benchmark/compare.py)."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys

from bert_jax.model.execution import resolve_per_device_batch
from input_pipeline import command_line as cli


def parse_args(argv=None, usage: str = "") -> argparse.Namespace:
    """``usage``: the command's docstring; its second paragraph (the example commands) is the description."""
    examples = (usage.split("\n\n") + [""])[1] or None
    p = cli.ArgumentParser(prog="python -m bert_jax.benchmark", description=examples,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    models = model_sizes()
    p.add_argument("--model", default="bert", choices=tuple(models),
                   help="the recipe in configs/pretrain.py (its objective, dropout, optimizer, size table)")
    p.add_argument("--size", default=None, help="; ".join(f"{m}: {' | '.join(s)}" for m, s in models.items())
                   + " (default: the recipe's: base; small for electra)")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=ints, default=[32], help="global batch; a comma list runs each")
    p.add_argument("--sweep", action="store_true", help="run every power of two from 8 up to --batch_size")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after compilation")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype")
    p.add_argument("--remat", default="none", help="none | full | a jax.checkpoint_policies name")
    p.add_argument("--scan", dest="scan", action="store_const", const=True, default="auto",
                   help="lax.scan over the layers' stacked parameters (default: the trainer's 'auto': "
                        "unrolled on CPU, scanned on GPU/TPU)")
    p.add_argument("--noscan", dest="scan", action="store_const", const=False,
                   help="unrolled layers, each with its own parameters")
    p.add_argument("--attention_impl", default="auto", choices=("auto", "xla", "cudnn", "explicit"))
    p.add_argument("--attention_dropout", type=float, default=None,
                   help="default: the recipe's (BERT's 0.1 forces the explicit attention path; ALBERT's 0 allows "
                        "the fused one)")
    p.add_argument("--dropout_impl", default="auto", choices=("auto", "jax", "fused"),
                   help="how dropout draws its masks (model.dropout_impl; bert_jax/model/dropout.py)")
    p.add_argument("--rng_impl", default="threefry2x32", choices=("threefry2x32", "philox4x32", "rbg", "unsafe_rbg"),
                   help="PRNG of the dropout keys (config.rng_impl)")
    p.add_argument("--per_device_batch", default="auto", metavar="auto|N",
                   help="rows per device in one micro-batch (config.per_device_batch): auto = 8 on the CPU when "
                        "the batch is a larger multiple of 8, else the whole batch (and with --find_max_batch, "
                        "which sizes whole batches for accelerator memory); 0 = the whole batch")
    p.add_argument("--max_predictions", type=int, default=None, help="P (default: 5/32 of seq_len)")
    p.add_argument("--short_seq_prob", type=float, default=None,
                   help="synthetic example lengths: with this probability uniform in [2, S], else S (the "
                        "pre-training recipe's 0.1); default: uniform in [S/2, S]")
    p.add_argument("--packing", type=int, default=0, metavar="K",
                   help="pack up to K synthetic examples per row (segment-aware attention); 0 = one per row")
    p.add_argument("--unpad_multiple", type=int, default=0, metavar="M",
                   help="blocks on the real tokens only (config.unpad_multiple), counts rounded up to M; 0 = padded")
    p.add_argument("--vocab_size", type=int, default=None,
                   help="default: the paper's (bert, electra 30522; albert 30000; roberta 50265)")
    p.add_argument("--mesh", default=None,
                   help="(data, fsdp, tensor); -1 = the remaining devices (default -1,1,1; 1,1,1 with --compare)")
    p.add_argument("--memory_only", action="store_true", help="compile and report memory; run nothing")
    p.add_argument("--find_max_batch", action="store_true", help="largest batch that fits --memory_gb")
    p.add_argument("--memory_gb", default="16,40,80", help="GiB budgets for --find_max_batch")
    p.add_argument("--batch_multiple", type=int, default=8, help="--find_max_batch granularity")
    p.add_argument("--xla_option", action="append", default=[], metavar="KEY=VALUE",
                   help="XLA compiler option for the step, repeatable (e.g. xla_backend_optimization_level=0)")
    p.add_argument("--compare", default="", metavar="hf-torch,hf-flax",
                   help="also time these reference implementations, taking turns with ours")
    p.add_argument("--references_only", action="store_true",
                   help="--compare: time only the references, not our step (for one process per implementation: "
                        "bert_jax/benchmark/processes.py)")
    p.add_argument("--compare_block", type=int, default=5, help="--compare: steps per turn of each implementation")
    p.add_argument("--variant", action="append", default=[], metavar='"--FLAG VALUE ..."',
                   help="also time our step with these flags added, taking turns (repeatable)")
    p.add_argument("--torch_threads", type=int, default=2, help="--compare: torch.set_num_threads")
    p.add_argument("--profile", default="", metavar="DIR",
                   help="after the timed steps, trace one more step with jax.profiler into DIR")
    p.add_argument("--json", action="store_true", help="print the JSON line instead of a summary")
    p.add_argument("--output", default="", metavar="PATH",
                   help="append each result to PATH as a JSON line (default: no results file)")
    argv, given = [], list(sys.argv[1:] if argv is None else argv)
    while given:  # "--variant --noscan" as one value: argparse would read two flags
        x = given.pop(0)
        argv.append(f"--variant={given.pop(0)}" if x == "--variant" and given else x)
    args = p.parse_args(argv)
    check_model(p, args, models)
    if args.max_predictions is None:
        args.max_predictions = max(1, round(args.seq_len * 5 / 32))  # the paper's 20 at 128, 80 at 512
    check_counts(p, args)
    try:  # the trainer's own check of the value
        resolve_per_device_batch(args.per_device_batch, "cpu", rows=0)
    except ValueError as e:
        p.error(f"--{e}")
    if args.find_max_batch and args.per_device_batch == "auto":
        args.per_device_batch = "0"
    args.compare = [x for x in args.compare.split(",") if x]
    if args.mesh is None:
        args.mesh = "1,1,1" if args.compare else "-1,1,1"
    args.variants = []
    if args.compare or args.variant:
        args.variants = [(v, variant_args(p, argv, v)) for v in args.variant]
        check_args(p, args)
    if args.sweep:
        args.batch_size = [2**k for k in range(3, max(args.batch_size).bit_length()) if 2**k <= max(args.batch_size)]
    return args


SHAPE_FLAGS = ("--model", "--size", "--seq_len", "--batch_size", "--sweep", "--max_predictions", "--vocab_size",
               "--mesh", "--short_seq_prob")  # what must be the same for every variant: the work and the data


def model_sizes() -> dict[str, tuple[str, ...]]:
    """{model: its sizes} from configs/pretrain.py (MODELS, FAMILY_SIZE_NAMES; BERT's table otherwise)."""
    from bert_jax.config_args import config_module
    from bert_jax.model.config import SIZES

    recipes = config_module("pretrain")
    return {m: tuple(recipes.FAMILY_SIZE_NAMES.get(m, SIZES)) for m in recipes.MODELS}


def check_model(parser, args, models: dict[str, tuple[str, ...]]) -> None:
    """``parser.error`` unless ``--size`` is one of ``--model``'s; fills in the defaults that depend on the model."""
    from bert_jax.benchmark.params import PAPER_VOCAB

    sizes = models[args.model]
    if args.size is None:  # the recipe's default size
        from bert_jax.config_args import load_config_file

        args.size = load_config_file("pretrain", f"model={args.model}").model.size.removeprefix(f"{args.model}-")
    if args.size not in sizes:
        parser.error(f"--size {args.size} for --model {args.model}: expected one of {' | '.join(sizes)}")
    if args.vocab_size is None:
        args.vocab_size = PAPER_VOCAB[args.model]
    if args.model == "electra" and args.packing:
        parser.error("--packing: ELECTRA has no sentence-level head for packed rows (cls_positions); "
                     "use --packing 0 with --model electra")


def check_counts(parser, args) -> None:
    """``parser.error`` for a count out of range, or an ``--output`` that is a directory."""
    bad = next((f"--batch_size {b}" for b in args.batch_size if b < 1), None)
    ranges = [("--seq_len", args.seq_len, 4), ("--steps", args.steps, 1), ("--warmup", args.warmup, 0),
              ("--max_predictions", args.max_predictions, 1), ("--packing", args.packing, 0),
              ("--unpad_multiple", args.unpad_multiple, 0), ("--batch_multiple", args.batch_multiple, 1),
              ("--compare_block", args.compare_block, 1)]
    if bad or not args.batch_size:
        parser.error(f"{bad or '--batch_size'}: expected a comma list of batch sizes >= 1")
    for flag, value, low in ranges:
        if value < low:
            parser.error(f"{flag} {value}: expected at least {low}")
    if args.max_predictions > args.seq_len:
        parser.error(f"--max_predictions {args.max_predictions}: expected at most --seq_len ({args.seq_len})")
    if args.output and os.path.isdir(args.output):
        parser.error(f"--output {args.output}: is a directory, expected a file to append JSON lines to")


def variant_args(parser, argv: list[str], variant: str) -> argparse.Namespace:
    """The arguments of ``--variant variant``: ``argv`` with the variant's flags added (they win)."""
    extra = shlex.split(variant)
    flags = {x.split("=")[0] for x in extra if x.startswith("--")}
    clash = sorted(flags & {*SHAPE_FLAGS, "--variant", "--compare", "--memory_only", "--find_max_batch"})
    if clash or not flags:
        parser.error(f"--variant {variant!r}: expected flags that change how the step runs (e.g. '--rng_impl rbg'), "
                     f"not the shapes or the mode; {', '.join(clash) or 'no flag'} given")
    return parse_args([x for x in argv if not x.startswith("--variant=")] + extra)


def check_args(parser, args) -> None:
    """``parser.error`` unless ``args`` (``--compare`` or ``--variant`` given) describe a comparison we can run."""
    from bert_jax.benchmark.hf import IMPLEMENTATIONS

    unknown = sorted(set(args.compare) - set(IMPLEMENTATIONS))
    if unknown:
        parser.error(f"--compare {','.join(unknown)}: expected a comma list of {', '.join(IMPLEMENTATIONS)}")
    if args.compare and args.model != "bert":
        parser.error(f"--compare times Hugging Face's BertForPreTraining: it goes with --model bert, not "
                     f"--model {args.model}")
    if args.memory_only or args.find_max_batch:
        parser.error("--compare and --variant time steps: they do not go with --memory_only or --find_max_batch")
    if args.references_only and (not args.compare or args.variant):
        parser.error("--references_only times the --compare implementations alone: give --compare, and no --variant")
    if not args.compare:
        return
    for a in [args, *(v for _, v in getattr(args, "variants", []))]:
        if a.dtype != "float32":
            parser.error("--compare runs every implementation in float32: leave --dtype at float32")
    if math.prod(int(x) for x in args.mesh.split(",")) != 1:
        parser.error(f"--compare runs on one device (the references know no mesh): --mesh {args.mesh} is not 1,1,1")

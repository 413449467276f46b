r"""Pre-training and fine-tuning entry point: parses flags and calls ``bert_jax.launch.main``.

    python train.py --config configs/pretrain.py:size=tiny,runlocal --workdir /tmp/w \
        [--config.num_train_steps=2000 ...] [--dry_run]

``--dry_run`` resolves the config, checks the data, vocabulary, workdir and checkpoint to restore,
prints the plan (steps, batch, tokens, evaluation, checkpoints, mesh, memory; fine-tuning: each
split's examples, steps, learning rate) and exits without training or writing anything
(bert_jax/plan.py); ``--hosts N`` plans a ``--config.multihost=True`` job for N hosts.

A bad flag, config file, config argument or ``--config.<key>``, and bad input found later (a missing
or malformed data file, a checkpoint that does not fit), print one ``error:`` line and exit with
status 2 (input_pipeline/command_line.py; ``BERT_JAX_DEBUG=1`` shows the traceback); such a job leaves its
workdir as it was (bert_jax/launch.py). A run whose loss becomes NaN/Inf exits with status 1.
"""

from absl import flags
from ml_collections import config_flags

from input_pipeline import command_line as cli

FLAGS = flags.FLAGS


def define_flags(fv: flags.FlagValues = FLAGS, argv: list[str] | None = None) -> None:
    """Defines --config and --workdir on `fv` (only when run as a program: no import-time flags).
    ml_collections finds the ``--config.<key>`` overrides in ``argv`` (default: sys.argv)."""
    config_flags.DEFINE_config_file("config", None, "configs/<job>.py:<args>", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    flags.DEFINE_string("workdir", None, "checkpoints, config.json, metrics and TensorBoard events",
                        required=True, flag_values=fv)
    flags.DEFINE_bool("dry_run", False, "print the job's plan, its inputs checked, and exit without training",
                      flag_values=fv)
    flags.DEFINE_integer("hosts", None, "with --dry_run of a --config.multihost=True job: the number of hosts it "
                         "will run on, to check the batch and the shard files per host", flag_values=fv)
    flags.mark_flags_as_required(["config"], flag_values=fv)


def parse_flags(argv: list[str], fv: flags.FlagValues = FLAGS) -> list[str]:
    """absl's parsing, after the config file and its overrides are checked against its keys."""
    from bert_jax.config_args import check_command_line

    cli.exit_if_help(argv)
    cli.catching(check_command_line)(argv)
    return cli.parse_absl_flags(argv, fv)


def main(argv: list[str], fv: flags.FlagValues = FLAGS) -> None:
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {argv[1:]} (flags are --name=value)")
    from bert_jax import launch

    if fv.dry_run:
        print(launch.dry_run(fv.config, fv.workdir, hosts=fv.hosts))
        return
    if fv.hosts is not None:
        raise ValueError(f"--hosts {fv.hosts}: applies to --dry_run (a multihost job finds its hosts itself)")
    launch.main(fv.config, fv.workdir)


if __name__ == "__main__":
    define_flags()
    cli.run_absl(main, flags_parser=parse_flags)

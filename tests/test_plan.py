"""``python train.py ... --dry_run`` (bert_jax/plan.py): the plan of a job, its inputs checked,
nothing run or written; and the rule that a pre-training job with evaluation on needs held-out data."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bert_jax import launch
from tests.fixtures.pretraining_data import L, P

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
ROOT = Path(__file__).parents[1]


@pytest.fixture()
def shards_config(pretraining_data, pretraining_config):
    """configs/pretrain.py (tiny, static masking) on the fixture's static shards, held out: the unmasked ones."""

    def config(**overrides):
        c = pretraining_config(pretraining_data, pretraining_data / "static", masking="static",
                               eval_input=str(pretraining_data / "static"))
        c.batch_size, c.num_train_steps = 8, 20
        for key, value in overrides.items():
            section, _, name = key.rpartition(".")
            (c[section] if section else c)[name] = value
        return c

    return config


def test_plan_names_steps_data_evaluation_and_memory(shards_config, pretraining_data, tmp_path):
    text = launch.dry_run(shards_config(eval_steps=10), tmp_path / "w")
    summary = json.loads((pretraining_data / "static" / "summary.json").read_text())
    assert "steps: 0 -> 20 (20 to run), batch 8" in text
    real = summary["tokens"] / (summary["examples"] * L)  # the shards' real tokens, padding left out
    assert f"{8 * L * 20:,} tokens padded ({8 * L} a step); real tokens {real:.0%} of them" in text
    assert f"(4 TFRecord files, {summary['examples']:,} examples)" in text and f"length {L}, {P} predictions" in text
    assert "evaluation: every" in text and "static" in text.split("evaluation:")[1]
    assert "start: fresh parameters" in text
    assert "GiB of parameters and optimizer state" in text
    assert "warning:" not in text  # 10 batches of 8 rows: fewer than the held-out examples
    assert not (tmp_path / "w").exists()  # nothing written


def test_held_out_smaller_than_an_evaluation_is_a_warning(shards_config, pretraining_data, tmp_path):
    """An evaluation of more rows than the held-out shards hold repeats rows: the plan says so, and
    how many batches read each row at most once; the run's start logs the same line."""
    examples = json.loads((pretraining_data / "static" / "summary.json").read_text())["examples"]
    steps = examples // 8 + 5
    text = launch.dry_run(shards_config(eval_steps=steps), tmp_path / "w")
    warning = [line for line in text.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1, text
    expected = (f"{examples:,} held-out examples, fewer than an evaluation reads ({steps} batches of 8 = "
                f"{steps * 8:,} rows): rows repeat, some 2 times; --config.eval_steps={examples // 8} reads each at "
                "most once; or hold")
    assert expected in warning[0]
    from input_pipeline.pretraining.dataset import eval_repeats

    assert eval_repeats(shards_config(eval_steps=steps)) in warning[0]  # the run's own warning
    assert eval_repeats(shards_config(eval_steps=examples // 8)) is None


def test_hosts_check_the_batch_and_shards_per_host(shards_config, tmp_path):
    """multihost=True: --hosts N checks that every host has shard files and its rows of a batch;
    without it the plan says what it did not check."""
    text = launch.dry_run(shards_config(multihost=True, eval_steps=10), tmp_path / "w", hosts=2)
    assert "multihost: planned for 2 host(s)" in text and "(4 TFRecord files, 2 a host, " in text
    assert "hosts: 2, each reading 4 rows of every batch from its own shard files" in text
    with pytest.raises(ValueError, match=r"--config.data.input=.*: 4 TFRecord files for 8 hosts; each host reads its "
                                         r"own files: write at least 8"):
        launch.dry_run(shards_config(multihost=True, batch_size=16), tmp_path / "w", hosts=8)
    with pytest.raises(ValueError, match=r"--config.batch_size=8: not divisible by 3 hosts"):
        launch.dry_run(shards_config(multihost=True), tmp_path / "w", hosts=3)
    text = launch.dry_run(shards_config(multihost=True, eval_steps=10), tmp_path / "w")
    assert "warning: multihost: the batch and shard files per host are not checked; add --hosts N" in text
    with pytest.raises(ValueError, match=r"--hosts 2: .* for a job with --config.multihost=True"):
        launch.dry_run(shards_config(), tmp_path / "w", hosts=2)


@pytest.fixture(scope="module")
def tiny_workdir(tmp_path_factory, tiny_config):
    """A tiny pre-training workdir (2 layers x 128, vocabulary 101, synthetic batches), checkpoint at step 2."""
    workdir = tmp_path_factory.mktemp("tiny_p1") / "w"
    launch.run(tiny_config(steps=2, eval_every=0, checkpoint_every=2), workdir)
    return workdir


def test_phase_two_of_another_shape_fails_the_dry_run(tiny_workdir, tiny_config, tmp_path):
    """The restore's shape check, on the checkpoint's metadata: a phase 2 of another size is the
    error the run would stop with; of the same model, the plan starts at phase 1's step."""
    c = tiny_config(init_checkpoint=str(tiny_workdir), eval_every=0)
    text = launch.dry_run(c, tmp_path / "p2")
    assert f"start: {tiny_workdir}'s state at step 2" in text
    c.model.size = "mini"  # 4 layers x 256
    with pytest.raises(ValueError, match=r"checkpoints/2: cannot restore the checkpoint of step 2: does not fit this "
                                         r"model/optimizer: .* is \[128\] in the checkpoint, \[256\] here"):
        launch.dry_run(c, tmp_path / "p2")
    c.init_mode = "params"
    with pytest.raises(ValueError, match=r"its parameters do not fit this model"):
        launch.dry_run(c, tmp_path / "p2")


@pytest.mark.slow  # ~6 s: a process of its own; the same check in-process is fast (above)
def test_train_py_dry_run_of_another_shape_is_one_line(tiny_workdir, tmp_path):
    """The command line: status 2 and one error line, before any accelerator or training."""
    cmd = [sys.executable, "train.py", "--config", "configs/pretrain.py:size=mini,phase=2,synthetic", "--workdir",
           str(tmp_path / "p2"), "--dry_run", f"--config.init_checkpoint={tiny_workdir}", "--config.eval_every=0",
           "--config.model.vocab_size=101", "--config.model.max_position_embeddings=32",
           "--config.data.max_seq_length=16", "--config.data.max_predictions_per_seq=4"]
    env = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is [128] in the checkpoint, [256] here" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "p2").exists()


def test_phase_two_planned_before_phase_one_has_run(tiny_workdir, tiny_config, tmp_path):
    """init_checkpoint not written yet: the plan goes on with a warning; phase 1 started (its
    config.json, no checkpoint): its model is checked against this one."""
    missing = tmp_path / "not_yet"
    text = launch.dry_run(tiny_config(init_checkpoint=str(missing), eval_every=0), tmp_path / "p2")
    assert f"warning: --config.init_checkpoint={missing} does not exist yet" in text
    assert f"steps: from {missing}'s last step -> 6" in text
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.json").write_text((tiny_workdir / "config.json").read_text())
    text = launch.dry_run(tiny_config(init_checkpoint=str(started), eval_every=0), tmp_path / "p2")
    assert f"start: its state (step, optimizer) from {started} at its planned step 2 (no checkpoint yet)" in text
    assert "has no checkpoint yet (its config.json plans this model, 2 steps)" in text
    c = tiny_config(init_checkpoint=str(started), eval_every=0)
    c.model.size = "mini"
    with pytest.raises(ValueError, match=r"its config.json plans another model: model.hidden_size 128 → 256"):
        launch.dry_run(c, tmp_path / "p2")


def test_finetuning_plan_counts_examples_steps_and_rate(load_config, tmp_path):
    """A fine-tuning plan reads the task's files as the job does: each split's examples and features,
    the steps they make, the learning rate and its schedule."""
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad",
                                                   "film", "the", "was"]) + "\n")
    lines = [f"{i % 2}\tthe film was {'good' if i % 2 else 'bad'}" for i in range(24)] + ["x\tan unknown label"]
    (tmp_path / "reviews.tsv").write_text("\n".join(lines) + "\n")
    c = load_config("sentiment", "runlocal,lr=3e-5")
    c.vocab, c.task.source, c.num_train_steps, c.num_train_epochs = str(tmp_path / "vocab.txt"), \
        str(tmp_path / "reviews.tsv"), 0, 2.0
    text = launch.dry_run(c, tmp_path / "ft")
    # 25 lines, every 10th dev: lines 10 and 20 dev; 23 train, the last malformed (skipped).
    assert "data: train 22 examples -> 22 features (length 128), 1 malformed lines skipped" in text
    assert "data: dev 2 examples -> 2 features" in text
    steps = -(-2 * 22 // c.batch_size)
    assert f"steps: {steps:,} (2 epochs x 22 training features / batch {c.batch_size}, rounded up)" in text
    warmup = round(0.1 * steps)
    assert f"lr 3e-05, warmup {warmup} steps (10%), schedule bert to 0 at step {steps}" in text
    assert "evaluation: dev at the end" in text
    assert not (tmp_path / "ft").exists()


def test_no_held_out_data_is_an_error_unless_evaluation_is_off(shards_config, tmp_path):
    with pytest.raises(ValueError, match=r"no held-out data: set --config.data.eval_input.*--config.eval_every=0"):
        launch.dry_run(shards_config(**{"data.eval_input": ""}), tmp_path / "w")
    text = launch.dry_run(shards_config(**{"data.eval_input": "", "eval_every": 0}), tmp_path / "w")
    assert "evaluation: off" in text


def test_shards_that_do_not_fit_the_config_fail_the_dry_run(shards_config, tmp_path):
    with pytest.raises(ValueError, match=r"max_seq_length"):
        launch.dry_run(shards_config(**{"data.max_seq_length": 2 * L}), tmp_path / "w")


def test_phase_two_plan_starts_from_phase_one(shards_config, tmp_path):
    """init_checkpoint=<phase-1 workdir>: the plan starts at its last step and keeps its schedule;
    a directory that is no workdir is an error naming the key."""
    (tmp_path / "nothing").mkdir()
    with pytest.raises(FileNotFoundError, match=r"--config.init_checkpoint=.*no checkpoints/"):
        launch.dry_run(shards_config(init_checkpoint=str(tmp_path / "nothing")), tmp_path / "w2")
    (tmp_path / "p1" / "checkpoints" / "900").mkdir(parents=True)
    text = launch.dry_run(shards_config(init_checkpoint=str(tmp_path / "p1")), tmp_path / "w2")
    assert "state at step 900" in text and "its schedule continues" in text


def test_train_py_dry_run_prints_the_plan_and_writes_nothing(pretraining_data, tmp_path):
    """The command line: the plan on stdout, exit 0, no workdir. (A dry run's error as one line with
    status 2: tests/test_bad_input.py's table, in-process, and its command-line cases.)"""
    cmd = [sys.executable, "train.py", "--config", "configs/pretrain.py:size=tiny,masking=static",
           f"--config.data.input={pretraining_data / 'static'}",
           f"--config.data.eval_input={pretraining_data / 'static'}",
           f"--config.data.vocab={pretraining_data / 'vocab.txt'}", f"--config.data.max_seq_length={L}",
           f"--config.data.max_predictions_per_seq={P}", "--dry_run", "--workdir", str(tmp_path / "w")]
    env = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "steps: 0 -> 900,000" in done.stdout and "evaluation: every 10,000 steps" in done.stdout
    assert not (tmp_path / "w").exists()


def test_modernbert_phases_plan(load_config, tmp_path):
    """configs/pretrain.py:model=modernbert (docs/family.md): phase 1 at 1,024 tokens, RoPE 10k on every
    layer, StableAdamW at 8e-4 (large 5e-4, then 5e-5 from 900B tokens) with the peak held; phase 2 at
    8,192 continuing phase 1's state (moments and step), the global layers at 160k, 3e-4 with its
    last 10.6k steps decaying."""
    text = {}
    for size, phase in (("base", 1), ("base", 2), ("large", 1)):
        c = load_config("pretrain", f"model=modernbert,size={size},phase={phase}")
        c.data.update(input="pkg:wikipedia", vocab="pkg:minilm/vocab.txt", eval_fraction=0.05)
        if phase == 2:
            (tmp_path / "p1" / "checkpoints" / "360000").mkdir(parents=True)
            c.init_checkpoint = str(tmp_path / "p1")
        text[size, phase] = launch.dry_run(c, tmp_path / f"w{size}{phase}")
    one, two, large = text["base", 1], text["base", 2], text["large", 1]
    assert "model: modernbert-base (22 layers x 768" in one and "objective none" in one
    assert "rotary base 10,000 in global layers, 10,000 in local ones" in one
    assert "length 1024, 308 predictions per row, dynamic masking; up to 8 examples a row, none attending" in one
    assert "steps: 0 -> 360,000" in one and "batch 4,608" in one
    assert ("optimizer: stableadamw (update clipping per tensor, no global clip), lr 0.0008, warmup 640 steps, "
            "schedule wsd to step 360,000 (the last 0 decaying), weight decay 1e-05 per step at the peak rate") in one
    assert "lr 0.0005, 5e-05 from step 190,700, warmup 424 steps" in large
    assert "length 8192, 2458 predictions per row, dynamic masking; up to 32 examples a row" in two
    assert "batch 576" in two
    assert "rotary base 160,000 in global layers, 10,000 in local ones" in two
    assert f"start: {tmp_path / 'p1'}'s state at step 360,000 (parameters, optimizer, step" in two
    assert "steps: 360,000 -> 423,600 (63,600 to run)" in two
    assert "lr 0.0003, warmup 640 steps, schedule wsd to step 423,600 (the last 10,600 decaying)" in two


def test_electra_runlocal_plan_starts_from_a_masked_lm(load_config, tmp_path):
    """configs/pretrain.py:model=electra,runlocal (docs/family.md): the discriminator's encoder from
    ModernBERT's runlocal workdir, the rest fresh at step 0; with no workdir named, the error gives
    the first stage's command."""
    c = load_config("pretrain", "model=electra,runlocal")
    with pytest.raises(ValueError, match="configs/pretrain.py:model=modernbert,runlocal --workdir"):
        launch.dry_run(c, tmp_path / "electra")
    (tmp_path / "mb" / "checkpoints" / "600").mkdir(parents=True)
    c.init_checkpoint = str(tmp_path / "mb")
    text = launch.dry_run(c, tmp_path / "electra")
    assert f"start: step 0 with the encoder of {tmp_path / 'mb'} at step 600, the rest fresh (seed 0" in text
    assert "model: modernbert-tiny (2 layers x 128" in text and "objective rtd" in text
    assert "steps: 0 -> 600" in text and "schedule wsd to step 600 (the last 150 decaying)" in text
    assert not (tmp_path / "electra").exists()


def test_finetuning_plan_of_the_shipped_scored_file(load_config, minilm_dir, tmp_path):
    """docs/finetuning.md's example: tests/fixtures/own_data/scored.tsv, its zero scores dropped and
    counted per split in the plan; as a regression, none."""
    c = load_config("sentiment", "runlocal")
    c.task.source, c.vocab = str(ROOT / "tests/fixtures/own_data/scored.tsv"), str(minilm_dir / "vocab.txt")
    text = launch.dry_run(c, tmp_path / "ft")
    assert "data: train 50 examples -> 50 features (length 128), 4 scored 0 dropped (no label)" in text
    assert "data: dev 5 examples -> 5 features (length 128), 1 scored 0 dropped (no label)" in text
    c.task.target = "score"
    text = launch.dry_run(c, tmp_path / "ft")
    assert "data: train 54 examples -> 54 features (length 128)\n" in text and "dropped" not in text

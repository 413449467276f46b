"""``python train.py ... --dry_run`` (bert_jax/plan.py): the plan of a job, its inputs checked,
nothing run or written; and the rule that a pre-training job with evaluation on needs held-out data."""

import subprocess
import sys

import pytest

from bert_jax import launch
from tests.fixtures.pretraining_data import L, P

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


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


def test_plan_names_steps_data_evaluation_and_memory(shards_config, tmp_path):
    text = launch.dry_run(shards_config(), tmp_path / "w")
    assert "steps: 0 -> 20 (20 to run), batch 8" in text
    assert f"{8 * L * 20:,} tokens" in text
    assert "(4 TFRecord files)" in text and f"length {L}, {P} predictions" in text
    assert "evaluation: every" in text and "static" in text.split("evaluation:")[1]
    assert "start: fresh parameters" in text
    assert "GiB of parameters and optimizer state" in text
    assert not (tmp_path / "w").exists()  # nothing written


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
    a workdir without checkpoints is an error naming the key."""
    with pytest.raises(FileNotFoundError, match=r"--config.init_checkpoint=.*no checkpoints/"):
        launch.dry_run(shards_config(init_checkpoint=str(tmp_path / "nothing")), tmp_path / "w2")
    (tmp_path / "p1" / "checkpoints" / "900").mkdir(parents=True)
    text = launch.dry_run(shards_config(init_checkpoint=str(tmp_path / "p1")), tmp_path / "w2")
    assert "state at step 900" in text and "its schedule continues" in text


def test_train_py_dry_run_prints_the_plan_and_writes_nothing(shards_config, pretraining_data, tmp_path):
    """The command line: the plan on stdout, exit 0, no workdir; a bad path: one error line, status 2."""
    base = [sys.executable, "train.py", "--config", "configs/pretrain.py:size=tiny,masking=static",
            f"--config.data.input={pretraining_data / 'static'}",
            f"--config.data.vocab={pretraining_data / 'vocab.txt'}",
            f"--config.data.max_seq_length={L}", f"--config.data.max_predictions_per_seq={P}", "--dry_run"]
    env = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"}
    ok = subprocess.run([*base, f"--config.data.eval_input={pretraining_data / 'static'}", "--workdir",
                         str(tmp_path / "w")], capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "steps: 0 -> 900,000" in ok.stdout and "evaluation: every 10,000 steps" in ok.stdout
    assert not (tmp_path / "w").exists()
    bad = subprocess.run([*base, "--workdir", str(tmp_path / "w")], capture_output=True, text=True, env=env,
                         timeout=300)
    assert bad.returncode == 2
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no held-out data" in errors[0]
    assert "Traceback" not in bad.stderr


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

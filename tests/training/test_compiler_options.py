"""``config.xla_options`` (bert_jax/training/compiler_options.py): parsed as XLA_FLAGS writes them,
checked by compiling on the job's backend, and given to the compiles of both steps of both trainers.
The command line's errors (one line, status 2, nothing written): tests/fixtures/bad_inputs.py."""

import jax
import pytest

from bert_jax.benchmark import trainer_steps
from bert_jax.config_args import load_config_file
from bert_jax.training import compiler_options
from bert_jax.training import sharding as sh
from bert_jax.training.trainer import resolved


def test_options_parse_as_xla_flags_writes_them():
    text = "--xla_gpu_enable_triton_gemm=false  xla_gpu_dot_merger_threshold_mb=0 --xla_a=0.5 --xla_b=ALL,SOME"
    options = compiler_options.parse(text)
    assert options == {"xla_gpu_enable_triton_gemm": False, "xla_gpu_dot_merger_threshold_mb": 0, "xla_a": 0.5,
                       "xla_b": "ALL,SOME"}
    assert [type(v) for v in options.values()] == [bool, int, float, str]
    assert compiler_options.parse(compiler_options.text(options)) == options
    assert compiler_options.parse("") == {} and compiler_options.parse("  ") == {}


@pytest.mark.parametrize("item", ["fast", "xla_a", "=1", "xla_a=", "--", "Xla_A=1", "xla-a=1"])
def test_an_item_that_is_not_name_equals_value_names_itself_and_the_key(item):
    with pytest.raises(ValueError, match=f"^--where: '{item}' is not an XLA option; expected name=value"):
        compiler_options.parse(f"xla_ok=1 {item}", "--where")


def test_the_check_compiles_with_the_options_on_this_backend():
    compiler_options.check({"xla_gpu_dot_merger_threshold_mb": 0, "xla_gpu_enable_triton_gemm": False})  # CPU: kept
    compiler_options.check({"xla_tpu_enable_latency_hiding_scheduler": True})  # a TPU's own: not judged off a TPU
    compiler_options.check(None)
    with pytest.raises(ValueError, match=r"^--config.xla_options: XLA refused .*No such compile option: 'xla_nope'"):
        compiler_options.check({"xla_tpu_anything": 1, "xla_nope": 1})
    with pytest.raises(ValueError, match="^--flag: XLA refused .*'x' is not a valid int32 value"):
        compiler_options.check({"xla_gpu_dot_merger_threshold_mb": "x"}, "--flag")


# ~8 s each; fine-tuning's builder takes the same argument from its config (~13 s with its imports): slow.
@pytest.mark.parametrize("spec", ["pretrain:size=tiny,synthetic",
                                  pytest.param("glue:task=mrpc,runlocal", marks=pytest.mark.slow)])
def test_both_steps_compile_with_the_configs_options(spec, tmp_path):
    """XLA's own dump (an option) shows the options reached the train and the eval step's compiles."""
    name, _, args = spec.partition(":")
    config = load_config_file(name, args)
    dump = tmp_path / "dump"
    with config.unlocked():
        config.batch_size = 2
        # Less LLVM optimisation: each step compiles in about half the time (its speed does not matter here).
        config.xla_options = f"--xla_dump_to={dump} --xla_dump_hlo_as_text=true --xla_backend_optimization_level=0"
        if name == "pretrain":
            config.data.update(max_seq_length=16, max_predictions_per_seq=2)
        else:
            config.update(max_seq_length=16, eval_batch_size=2)
    mesh = sh.config_mesh(config, jax.devices()[:1])
    config = resolved(config, mesh)
    steps, _, shapes = trainer_steps.build(config, mesh)
    batch = {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in shapes.items()}
    rng = jax.eval_shape(lambda: jax.random.key(0, impl=config.rng_impl))

    def optimized() -> list[str]:
        return sorted(p.read_text() for p in dump.glob("*after_optimizations.txt"))

    steps.train_fn.lower(steps.layout.abstract, batch, rng).compile()
    train = optimized()
    assert len(train) == 1 and "optimizer" in train[0]  # apply_gradients' named scope
    steps.eval_fn.lower(steps.layout.abstract.params, batch).compile()
    assert len(optimized()) == 2

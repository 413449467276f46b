"""init_mode="encoder": a run of any objective starts its encoder (``bert/``) from another run's
checkpoint and everything else fresh (ELECTRA's discriminator warm-started from a masked LM's encoder),
whatever layer layout either run used; an encoder that does not fit is one line naming the
first array."""

import jax
import numpy as np
import pytest
from flax import traverse_util

from bert_jax.pretraining import objective, start
from bert_jax.resolve import described_model, resolve
from bert_jax.training import sharding as sh
from bert_jax.training.checkpoints import Checkpointer, CheckpointRestoreError, to_stored


def _built(config):
    """(resolved config, steps) on one CPU device."""
    resolved = resolve(config, "cpu", batch_shards=1)
    mesh = sh.make_mesh((1, 1, 1), jax.devices()[:1])
    return resolved, objective.jit_pretraining_steps(resolved, described_model(resolved.model, vocab_size=101), mesh)


def _flat(tree) -> dict:
    """Flat numpy arrays in the stored (stacked) layout."""
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(to_stored(tree), sep="/").items()}


def _save(workdir, steps, seed: int, step: int):
    state = steps.layout.create(seed)
    state = state.replace(step=state.step + step, opt_state=jax.tree.map(lambda x: x + 1, state.opt_state))
    ckpt = Checkpointer(workdir, async_save=False)
    ckpt.save(step, state, {})
    ckpt.close()
    return state


def test_electra_starts_its_discriminator_encoder_from_a_masked_lm(tmp_path, tiny_config):
    """A stacked-layer ModernBERT masked LM (step 7, moments 1) into an unrolled ELECTRA: the
    discriminator's encoder is the masked LM's, array for array; the generator and both heads are
    what a fresh start of the run's seed gives; step 0 and moments 0 (its own schedule)."""
    _, mlm = _built(tiny_config(model="modernbert", model_overrides=dict(scan_layers="true")))
    saved = _flat(_save(tmp_path / "mlm", mlm, seed=3, step=7).params)

    config, electra = _built(tiny_config(model="electra", init_checkpoint=str(tmp_path / "mlm"),
                                         init_mode="encoder"))
    assert config.model.scan_layers == "false"  # CPU "auto": the other layout than the checkpoint's
    got = start.start_state(config, electra.layout)
    fresh = _flat(electra.layout.create(config.seed).params)
    ours = _flat(got.params)
    assert set(ours) == set(fresh)
    encoder = [k for k in ours if k.startswith("bert/")]
    assert len(encoder) > 10 and any(k.startswith("generator/") for k in ours)
    for k in ours:
        want = saved[k] if k.startswith("bert/") else fresh[k]
        np.testing.assert_array_equal(ours[k], want, err_msg=k)
    assert not np.array_equal(fresh["bert/embeddings/word_embeddings/embedding"],
                              saved["bert/embeddings/word_embeddings/embedding"])  # the test can tell them apart
    assert int(got.step) == 0
    assert all(float(np.abs(np.asarray(m)).max()) == 0.0 for m in jax.tree.leaves(got.opt_state))  # moments, counts


@pytest.mark.parametrize("overrides,reason", [
    (dict(size="tiny", embedding_size=None), "arrays of this model are not in the checkpoint, first params/bert/"),
    pytest.param(dict(intermediate_size=384),  # ~7 s; the same check as the first case, on one array's shape
                 "ffn/intermediate/kernel is [2, 128, 2, 192] in the checkpoint, [2, 128, 2, 384]",
                 marks=pytest.mark.slow),
])
def test_an_encoder_that_does_not_fit_is_one_line(tmp_path, tiny_config, overrides, reason):
    """BERT's post-norm encoder, or another width, against a ModernBERT checkpoint: the error names
    the checkpoint's step directory and the first array that does not fit, before any array is read."""
    _, mlm = _built(tiny_config(model="modernbert"))
    _save(tmp_path / "mlm", mlm, seed=0, step=2)
    config, electra = _built(tiny_config(model="electra", init_checkpoint=str(tmp_path / "mlm"),
                                         init_mode="encoder", model_overrides=overrides))
    with pytest.raises(CheckpointRestoreError) as e:
        start.start_state(config, electra.layout)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / 'mlm' / 'checkpoints'}/2: cannot restore"), line
    assert "its encoder's parameters do not fit this model" in line and reason in line, line

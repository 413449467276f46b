"""Packed training input (``config.data.pack_examples``): every example is packed exactly once and
in stream order, the position resumes exactly (across an epoch boundary), packed and unpacked
positions are not mixed up, and the trainer trains on packed rows and resumes to the same numbers."""

import shutil

import numpy as np
import pytest

from bert_jax import launch
from bert_jax.training.checkpoints import read_params
from bert_jax.training.metric_writer import read_metrics
from input_pipeline.pretraining.dataset import make_pretraining_dataset

ROWS, K = 4, 3
# Text input (the fixture's shards hold near-full examples of 32 tokens: nothing to pack), built
# at length 64 with many short targets, so that rows hold one to three examples.
L, P = 64, 10
TEXT = dict(max_seq_length=L, max_predictions_per_seq=P, short_seq_prob=0.5, pack_examples=K)


@pytest.fixture(scope="module")
def packed_config(pretraining_data, pretraining_config):
    """``packed_config(masking="dynamic", **data_overrides)``: `TEXT` packed input over the corpus of the
    pretraining_data fixture (tests/fixtures/pretraining_data.py)."""

    def packed_config(masking="dynamic", **overrides):
        data = pretraining_data
        return pretraining_config(data, data / "corpus" / "*.txt", masking, **{**TEXT, **overrides})

    return packed_config


def examples_of(packed) -> list[bytes]:
    """Each example of a packed batch as bytes: its tokens, predictions (positions from its own
    start, ids) and NSP label, in row order."""
    out = []
    for r in range(len(packed["input_ids"])):
        for k in np.nonzero(packed["nsp_weights"][r])[0]:
            start, mine = packed["cls_positions"][r, k], packed["example_ids"][r] == k + 1
            real = packed["masked_lm_weights"][r] > 0
            inside = real & mine[packed["masked_lm_positions"][r]]
            out.append(key(packed["input_ids"][r][mine], packed["masked_lm_positions"][r][inside] - start,
                           packed["masked_lm_ids"][r][inside], packed["next_sentence_labels"][r, k]))
    return out


def key(tokens, positions, ids, label) -> bytes:
    return b"|".join(np.asarray(a, np.int64).tobytes() for a in (tokens, positions, ids, [label]))


def stream(source, n) -> list[bytes]:
    """The first n examples of the unpacked stream (``PretrainingData.chunks``), as `examples_of`."""
    out = []
    for _, _, f in source.chunks(0, 0):
        for i in range(len(f["input_ids"])):
            real = f["masked_lm_weights"][i] > 0
            out.append(key(f["input_ids"][i][f["input_mask"][i] > 0], f["masked_lm_positions"][i][real],
                           f["masked_lm_ids"][i][real], f["next_sentence_labels"][i]))
        if len(out) >= n:
            return out[:n]


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_every_example_is_packed_once_in_order(packed_config, masking):
    packed = make_pretraining_dataset(packed_config(masking), batch_size=ROWS)
    batches = []
    while packed.state()["epoch"] == 0 or len(batches) < 12:  # across an epoch boundary
        batches.append(next(packed))
    seen = [examples_of(b) for b in batches]
    expected = stream(packed.source, sum(map(len, seen)))
    at = 0
    for b, got in zip(batches, seen, strict=True):
        assert b["input_ids"].shape == (ROWS, L) and b["masked_lm_positions"].shape == (ROWS, P)
        assert b["next_sentence_labels"].shape == b["cls_positions"].shape == (ROWS, K)
        assert sorted(got) == sorted(expected[at : at + len(got)])  # each batch packs the next examples
        at += len(got)
    assert sum(map(len, seen)) > 1.3 * ROWS * len(batches)  # rows hold more than one example on average


def test_packed_position_resumes_exactly(packed_config, assert_batches_equal):
    c = packed_config()
    straight = make_pretraining_dataset(c, batch_size=ROWS)
    straight.source.EPOCHS_PER_ITERATOR = 1  # a new tf.data iterator per epoch changes nothing
    expected, states = [], []
    while not states or states[-1]["epoch"] == 0:  # through epoch 0, then 3 batches more
        expected.append(next(straight))
        states.append(straight.state())
    for _ in range(3):
        expected.append(next(straight))
        states.append(straight.state())
    assert states[0] == {"kind": "packed", "epoch": 0, "example": int(expected[0]["nsp_weights"].sum())}
    crossing = next(i for i, s in enumerate(states) if s["epoch"] == 1)
    for k in (3, crossing - 1, crossing, crossing + 1):
        resumed = make_pretraining_dataset(c, batch_size=ROWS)
        resumed.restore(states[k - 1])
        assert_batches_equal([next(resumed), next(resumed)], expected[k : k + 2])
        assert resumed.state() == states[k + 1]


def test_packed_processes_read_disjoint_examples_and_resume(packed_config, assert_batches_equal):
    """Process i of 2 packs the examples of its block of each global batch: none is packed by both
    processes, and each resumes its own position (mid-batch positions included)."""
    c = packed_config()
    parts = [make_pretraining_dataset(c, batch_size=ROWS, process_index=i, process_count=2) for i in (0, 1)]
    batches, states = [[], []], [[], []]
    for _ in range(6):
        for i, p in enumerate(parts):
            batches[i].append(next(p))
            states[i].append(p.state())
    mine = [{x for b in batches[i] for x in examples_of(b)} for i in (0, 1)]
    assert mine[0] and mine[1] and not mine[0] & mine[1]
    assert states[0] != states[1]  # the processes' positions differ
    for i in (0, 1):
        resumed = make_pretraining_dataset(c, batch_size=ROWS, process_index=i, process_count=2)
        resumed.restore(states[i][2])
        assert_batches_equal([next(resumed), next(resumed)], batches[i][3:5])


def test_packed_and_unpacked_positions_are_not_mixed(packed_config):
    packed = make_pretraining_dataset(packed_config(), batch_size=ROWS)
    plain = make_pretraining_dataset(packed_config(pack_examples=0), batch_size=ROWS)
    next(packed), next(plain)
    with pytest.raises(ValueError, match="saved without packing"):
        packed.restore(plain.state())
    with pytest.raises(ValueError, match="pack_examples > 0"):
        plain.restore(packed.state())


def train_config(packed_config, steps):
    c = packed_config(pack_examples=2)
    c.model.update(max_position_embeddings=L)
    c.batch_size, c.num_train_steps, c.mesh_shape = 8, steps, (-1, 1, 1)
    c.optimizer.update(num_train_steps=4, warmup_steps=1, learning_rate=1e-3)
    c.log_every, c.checkpoint_every, c.eval_every = 1, 2, 0
    return c


@pytest.mark.slow  # ~65 s; the packed input position resumes exactly in test_packed_position_resumes_exactly
def test_trainer_on_packed_rows_resumes_exactly(packed_config, tmp_path):
    """4 steps straight; then checkpoint 4 is removed and the run resumes from 2: the same step 4."""
    launch.run(train_config(packed_config, 4), tmp_path)
    rows = read_metrics(tmp_path, "train")
    assert all(r["examples"] > 8 for r in rows)  # 8 rows, more examples
    assert all(r["examples_per_sec"] == pytest.approx(r["examples"] * r["steps_per_sec"]) for r in rows)
    straight, where = read_params(tmp_path)
    assert where.name == "4"
    shutil.rmtree(where)
    launch.run(train_config(packed_config, 4), tmp_path)  # resumes from checkpoint 2
    resumed, where = read_params(tmp_path)
    assert where.name == "4"
    for k in straight:
        np.testing.assert_array_equal(straight[k], resumed[k], err_msg=k)


def test_pipeline_benchmark_packs(pretraining_data):
    from bert_jax.benchmark import pipeline as benchmark

    data = pretraining_data
    result = benchmark.main(["--source", str(data / "corpus" / "*.txt"), "--vocab", str(data / "vocab.txt"),
                             "--max_seq_length", str(L), "--batch_size", str(ROWS), "--batches", "3",
                             "--pack_examples", str(K), "--json"])["pipeline"]
    assert result["pack_examples"] == K and result["batches"] == 3
    assert result["examples"] >= 3 * ROWS and 0.5 < result["real_token_fraction"] <= 1

"""SQuAD v1.1/v2.0 (input_pipeline/tasks/squad.py): reading official files and TFDS, malformed answers.
The files are tests/fixtures/task_files.py's `squad_dataset`; the shared `squad` tasks are in conftest."""

from __future__ import annotations

import json

import pytest

from input_pipeline.tasks.base import TaskDataError
from input_pipeline.tasks.squad import SquadTask, split_context


def test_split_context():
    words, offsets = split_context("  Ab c\u202fd\n e ")
    assert words == ["Ab", "c", "d", "e"]
    assert offsets == [-1, -1, 0, 0, 0, 1, 1, 2, 2, 2, 3, 3]


def test_load_reports_malformed(squad):
    task, data = squad
    train, _ = data["train"]
    assert task.skipped["train"] == 1 and "q_bad" not in {e.qas_id for e in train}
    ex = {e.qas_id: e for e in train}
    assert " ".join(ex["q_mat"].doc_tokens[ex["q_mat"].start_position:ex["q_mat"].end_position + 1]) == "the mat."
    assert ex["q_trader"].orig_answer_text == "Zanzibar-based trader"
    dev, _ = data["dev"]  # evaluation keeps every question, even one whose offset is wrong
    assert task.skipped["dev"] == 0 and "q_bad" in {e.qas_id for e in dev}
    assert {e.qas_id: e for e in dev}["q_bad"].start_position == -1
    assert {e.qas_id: e for e in dev}["q_mat"].answers == ("the mat", "mat")


def test_malformed_raise_names_file_and_question(tmp_path, squad_json):
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(squad_json("1.1")))
    task = SquadTask("1.1", source=f"train={path},dev={path}", on_error="raise")
    with pytest.raises(TaskDataError, match=r"train-v1\.1\.json.*q_bad.*'carnivorous mammals' not found"):
        task.load("train")
    data = squad_json("1.1", malformed=False)
    del data["data"][1]["paragraphs"][0]["qas"][0]["question"]
    path.write_text(json.dumps(data))
    with pytest.raises(TaskDataError, match=r"q_trader.*missing key 'question'"):
        task.load("train")
    assert len(SquadTask("1.1", source=f"train={path}").load("train")) == 3  # skipped, not fatal
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 10_000
    path.write_text(json.dumps(data))
    with pytest.raises(TaskDataError, match=r"q_mat.*answer_start 10000"):
        task.load("train")
    with pytest.raises(FileNotFoundError, match="dev-v2.0.json"):
        SquadTask("2.0", data_dir=str(tmp_path)).load("dev")


def test_tfds_source(tmp_path, minilm_tokenizer, squad_json):
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow as tf

    data = squad_json("2.0", malformed=False)

    def as_dataset(self, *args, **kwargs):
        rows = []
        for article in data["data"]:
            for p in article["paragraphs"]:
                for qa in p["qas"]:
                    answers = qa["answers"]
                    rows.append({"id": qa["id"], "title": article["title"], "context": p["context"],
                                 "question": qa["question"], "is_impossible": qa["is_impossible"],
                                 "answers": {"text": [a["text"] for a in answers],
                                             "answer_start": [a["answer_start"] for a in answers]},
                                 "plausible_answers": {"text": [], "answer_start": []}})
        cols = {k: [r[k] for r in rows] for k in ("id", "title", "context", "question", "is_impossible")}
        for k in ("answers", "plausible_answers"):
            cols[k] = {"text": tf.ragged.constant([r[k]["text"] for r in rows], tf.string),
                       "answer_start": tf.ragged.constant([r[k]["answer_start"] for r in rows], tf.int32)}
        return tf.data.Dataset.from_tensor_slices(cols)

    with tfds.testing.mock_data(as_dataset_fn=as_dataset, data_dir=str(tmp_path)):  # offline
        examples = SquadTask("2.0", "tfds", data_dir=str(tmp_path)).load("dev")
        named = SquadTask("2.0", "tfds:squad/v2.0", data_dir=str(tmp_path)).load("train")
    assert [e.qas_id for e in examples] == ["q_mat", "q_year", "q_trader", "q_queen", "q_none"]
    assert examples[4].is_impossible and examples[0].answers == ("the mat", "mat")
    assert examples[0].doc_tokens is examples[1].doc_tokens  # one split per context
    assert [e.qas_id for e in named] == [e.qas_id for e in examples]

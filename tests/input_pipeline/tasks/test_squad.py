"""SQuAD v1.1/v2.0: reading (malformed answers), windows and positions, post-processing, metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from input_pipeline.tasks import squad_metrics as sm
from input_pipeline.tasks.base import FEATURE_KEYS, MODEL_KEYS, TaskDataError
from input_pipeline.tasks.squad import SquadTask, split_context
from input_pipeline.tasks.squad_features import doc_spans
from input_pipeline.tasks.squad_postprocess import basic_tokenize, get_final_text

L, STRIDE, QLEN = 64, 16, 12
SHORT = "The Cat sat on the mat.  Cats (Felis catus) are small carnivorous mammals, kept at a Café since 7500 BC."
FILLER = " ".join(f"Item {i} is stored in box {i * 7} near the river." for i in range(14))
LONG = (FILLER + " A Zanzibar-based trader bought the old lighthouse in 1888. " + FILLER
        + " The final record mentions Queen Victoria.")


def _qa(qid, question, context, *answers, start_fix=0, impossible=None):
    qa = {"id": qid, "question": question,
          "answers": [{"text": a, "answer_start": context.index(a) + start_fix} for a in answers]}
    if impossible is not None:
        qa["is_impossible"] = impossible
    return qa


def _dataset(version: str, *, malformed: bool = True) -> dict:
    v2 = version == "2.0"
    short_qas = [_qa("q_mat", "What did the cat sit on?", SHORT, "the mat", "mat"),
                 _qa("q_year", "Since when is the Café there?", SHORT, "7500 BC", "since 7500 BC")]
    long_qas = [_qa("q_trader", "Who bought the old lighthouse?", LONG, "Zanzibar-based trader"),
                _qa("q_queen", ("Which queen, according to the very final record of the long river inventory list, "
                 "is mentioned?"), LONG, "Queen Victoria")]
    if malformed:
        short_qas.append(_qa("q_bad", "What are cats?", SHORT, "carnivorous mammals", start_fix=20))
    if v2:
        for qa in short_qas + long_qas:
            qa["is_impossible"] = False
        long_qas.append({"id": "q_none", "question": "Who sold the lighthouse?", "answers": [],
                         "plausible_answers": [{"text": "trader", "answer_start": LONG.index("trader")}],
                         "is_impossible": True})
    return {"version": version, "data": [
        {"title": "Cats", "paragraphs": [{"context": SHORT, "qas": short_qas}]},
        {"title": "Lighthouse", "paragraphs": [{"context": LONG, "qas": long_qas}]}]}


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from input_pipeline.tokenizers import WordPieceTokenizer

    return WordPieceTokenizer(minilm_dir / "vocab.txt")


@pytest.fixture(scope="module", params=["1.1", "2.0"])
def squad(request, tmp_path_factory, tokenizer):
    """(task, {split: (examples, features)}) for one version, from official-format files."""
    version = request.param
    d = tmp_path_factory.mktemp(f"squad{version}")
    for split in ("train", "dev"):
        (d / f"{split}-v{version}.json").write_text(json.dumps(_dataset(version)))
    task = SquadTask(version, data_dir=str(d), doc_stride=STRIDE, max_query_length=QLEN)
    data = {}
    for split in ("train", "dev"):
        examples = task.load(split)
        data[split] = examples, task.featurize(examples, tokenizer, L)
    return task, data


def _decode(tokenizer, ids) -> str:
    return " ".join(tokenizer.id_to_token(ids)).replace(" ##", "")


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


def test_malformed_raise_names_file_and_question(tmp_path):
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(_dataset("1.1")))
    task = SquadTask("1.1", source=f"train={path},dev={path}", on_error="raise")
    with pytest.raises(TaskDataError, match=r"train-v1\.1\.json.*q_bad.*'carnivorous mammals' not found"):
        task.load("train")
    data = _dataset("1.1", malformed=False)
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


def test_windows_stride_and_max_context(squad, tokenizer):
    task, data = squad
    examples, f = data["train"]
    assert set(f) >= {*MODEL_KEYS, *FEATURE_KEYS["span"], "example_index", "token_to_orig", "token_is_max_context"}
    assert all(a.shape[0] == len(f["example_index"]) and a.dtype == np.int32 for a in f.values())
    truncated = False
    for e, ex in enumerate(examples):
        rows = np.flatnonzero(f["example_index"] == e)
        query = tokenizer.tokenize([ex.question_text]).to_list()[0]
        truncated = truncated or len(query) > QLEN
        query = query[:QLEN]
        doc = tokenizer.tokenize([" ".join(ex.doc_tokens)]).to_list()[0]
        tok_to_orig = np.repeat(np.arange(len(ex.doc_tokens)), tokenizer.tokenize(ex.doc_tokens).row_lengths())
        spans = doc_spans(len(doc), L - len(query) - 3, STRIDE)
        assert len(rows) == len(spans) and (len(spans) > 3) == (ex.doc_tokens[0] == "Item")
        for r, (start, length) in zip(rows, spans, strict=True):
            ids, t2o = f["input_ids"][r], f["token_to_orig"][r]
            n = len(query) + length + 3
            assert ids[:n].tolist() == [tokenizer.cls_id, *query, tokenizer.sep_id, *doc[start:start + length],
                                        tokenizer.sep_id]
            assert f["input_mask"][r].tolist() == [1] * n + [0] * (L - n)
            assert f["segment_ids"][r].tolist() == [0] * (len(query) + 2) + [1] * (length + 1) + [0] * (L - n)
            assert (t2o[:len(query) + 2] == -1).all() and (t2o[len(query) + 2 + length:] == -1).all()
            assert t2o[len(query) + 2:len(query) + 2 + length].tolist() == tok_to_orig[start:start + length].tolist()
            # run_squad's _check_is_max_context, literally
            for i in range(length):
                pos, best, best_score = start + i, None, None
                for s, (s_start, s_len) in enumerate(spans):
                    if s_start <= pos <= s_start + s_len - 1:
                        score = min(pos - s_start, s_start + s_len - 1 - pos) + 0.01 * s_len
                        if best_score is None or score > best_score:
                            best, best_score = s, score
                assert f["token_is_max_context"][r, len(query) + 2 + i] == (spans[best] == (start, length))
        assert all(b - a == STRIDE for (a, _), (b, _) in zip(spans[:-1], spans[1:], strict=True))
        assert f["token_is_max_context"][rows].sum() == len(doc)  # each token: max context in one window
    assert truncated  # some question is longer than max_query_length


@pytest.mark.parametrize("split", ["train", "dev"])
def test_positions_decode_to_answer(squad, tokenizer, split):
    _, data = squad
    examples, f = data[split]
    hits = 0
    for r, e in enumerate(f["example_index"]):
        ex, s, t = examples[e], f["start_positions"][r], f["end_positions"][r]
        if ex.is_impossible or ex.start_position < 0:
            assert s == t == 0
            continue
        words = set(f["token_to_orig"][r][f["token_to_orig"][r] >= 0].tolist())
        inside = ex.start_position in words and ex.end_position in words
        assert (s > 0) == inside, (ex.qas_id, r)
        if inside:
            hits += 1
            answer = _decode(tokenizer, tokenizer.tokenize([ex.orig_answer_text]).to_list()[0])
            assert _decode(tokenizer, f["input_ids"][r, s:t + 1]) == answer
    assert hits >= 4


def _logits(f, start=(), end=(), null=-5.0):
    """Start/end logits: 0 everywhere, ``null / 2`` at each [CLS]; ``start``/``end``: ((row, pos), value)."""
    out = {k: np.zeros(f["input_ids"].shape, np.float32) for k in ("start_logits", "end_logits")}
    for key, raised in (("start_logits", start), ("end_logits", end)):
        out[key][:, 0] = null / 2
        for (r, pos), v in dict(raised).items():
            out[key][r, pos] += v
    return out


def _pos(f, examples, tokenizer, qid, word, row=None):
    """(row, position) of the first token of context word index ``word`` in ``qid``'s (first) window."""
    e = next(i for i, ex in enumerate(examples) if ex.qas_id == qid)
    rows = np.flatnonzero(f["example_index"] == e)
    r = rows[0] if row is None else row
    return r, int(np.flatnonzero(f["token_to_orig"][r] == word)[0])


def test_postprocess_picks_span_with_original_case(squad, tokenizer, tmp_path):
    task, data = squad
    examples, f = data["dev"]
    ex = next(e for e in examples if e.qas_id == "q_mat")
    words = ex.doc_tokens
    r, cat = _pos(f, examples, tokenizer, "q_mat", words.index("Cat"))
    _, catus = _pos(f, examples, tokenizer, "q_mat", words.index("catus)"))
    _, cafe = _pos(f, examples, tokenizer, "q_year", words.index("Café"))
    r2 = _pos(f, examples, tokenizer, "q_year", 0)[0]
    outputs = _logits(f, start={(r, cat): 5.0, (r, catus): 8.0, (r, 2): 50.0, (r2, cafe): 9.0},
                      end={(r, cat): 20.0, (r, catus + 1): 8.0, (r2, cafe): 9.0})
    # (catus, cat) scores 28 but ends before it starts; a start at query token 2 scores 70: both invalid
    preds, nbest, null_odds = task.predict(examples, f, outputs)
    assert preds["q_mat"] == "Cat" and preds["q_year"] == "Café"
    texts = [n["text"] for n in nbest["q_mat"]]
    assert texts[:4] == ["Cat", "The Cat", "catus", "Cat sat on the mat. Cats (Felis catus"]  # 25 20 16 13
    assert len(texts) == len(set(texts)) <= task.n_best_size + 1
    assert abs(sum(n["probability"] for n in nbest["q_mat"]) - 1) < 1e-6
    # max_answer_length: a longer span loses to a shorter one despite a higher score
    short = SquadTask(task.version, source={"dev": "unused"}, max_answer_length=3, doc_stride=STRIDE,
                      max_query_length=QLEN)
    assert (short.featurize(examples, tokenizer, L)["input_ids"] == f["input_ids"]).all()
    far = _pos(f, examples, tokenizer, "q_mat", words.index("small"))[1]
    outputs = _logits(f, start={(r, cat): 5.0}, end={(r, cat): 5.0, (r, far): 20.0})
    assert task.predict(examples, f, outputs)[0]["q_mat"] == "Cat sat on the mat. Cats (Felis catus) are small"
    assert short.predict(examples, f, outputs)[0]["q_mat"] == "Cat"
    paths = task.write_predictions(examples, f, outputs, tmp_path, "dev")
    names = ["predictions.json", "nbest_predictions.json"] + (["null_odds.json"] if task.version == "2.0" else [])
    assert [p.name for p in paths] == names
    assert json.loads(paths[0].read_text()) == task.predict(examples, f, outputs)[0]
    train_paths = task.write_predictions(examples, f, outputs, tmp_path, "train")
    assert train_paths[0].name == "train_predictions.json"


def test_max_context_filter_across_windows(squad, tokenizer):
    task, data = squad
    examples, f = data["dev"]
    ex = next(e for e in examples if e.qas_id == "q_trader")
    e = examples.index(ex)
    rows = np.flatnonzero(f["example_index"] == e)
    w = ex.start_position
    # a window holding the answer's first word where it is *not* max context: its score is ignored
    holders = [r for r in rows if (f["token_to_orig"][r] == w).any()]
    best = next(r for r in holders if f["token_is_max_context"][r][f["token_to_orig"][r] == w][0] == 1)
    other = next(r for r in holders if r != best)
    s_other = int(np.flatnonzero(f["token_to_orig"][other] == w)[0])
    s_best = int(np.flatnonzero(f["token_to_orig"][best] == w)[0])
    t_best = int(np.flatnonzero(f["token_to_orig"][best] == ex.end_position)[-1])
    outputs = _logits(f, start={(other, s_other): 30.0, (best, s_best): 3.0},
                      end={(other, s_other): 1.0, (best, t_best): 3.0})
    assert task.predict(examples, f, outputs)[0]["q_trader"] == "Zanzibar-based trader"


def test_null_threshold(squad, tokenizer):
    task, data = squad
    if task.version != "2.0":
        pytest.skip("v2.0 only")
    examples, f = data["dev"]
    ex = next(e for e in examples if e.qas_id == "q_mat")
    r, cat = _pos(f, examples, tokenizer, "q_mat", ex.doc_tokens.index("Cat"))
    outputs = _logits(f, start={(r, cat): 2.0}, end={(r, cat): 2.0}, null=2.0)  # span 4, null 2 (every window)
    preds, nbest, odds = task.predict(examples, f, outputs)
    assert preds["q_mat"] == "Cat" and odds["q_mat"] == pytest.approx(-2.0)
    assert "" in [n["text"] for n in nbest["q_mat"]]
    assert preds["q_none"] == "" and odds["q_none"] == pytest.approx(2.0)  # all-zero spans score 0
    outputs["start_logits"][r, 0] -= 3.0  # the lowest [CLS] score over the windows is the null score
    assert task.predict(examples, f, outputs)[2]["q_mat"] == pytest.approx(-5.0)
    trader = np.flatnonzero(f["example_index"] == [e.qas_id for e in examples].index("q_trader"))
    assert len(trader) > 2 and odds["q_trader"] == pytest.approx(2.0)  # null 2, best non-null span 0
    outputs["end_logits"][trader[1], 0] -= 3.0
    assert task.predict(examples, f, outputs)[2]["q_trader"] == pytest.approx(-1.0)
    strict = SquadTask("2.0", source={"dev": "unused"}, null_score_diff_threshold=-6.0,
                       doc_stride=STRIDE, max_query_length=QLEN)
    strict.featurize(examples, tokenizer, L)
    assert strict.predict(examples, f, outputs)[0]["q_mat"] == ""


def test_oracle_logits_score_100(squad, tokenizer):
    task, data = squad
    examples, f = data["dev"]
    gold = [r for r in range(len(f["example_index"])) if f["start_positions"][r] > 0]
    outputs = _logits(f, start={(r, f["start_positions"][r]): 20.0 for r in gold},
                      end={(r, f["end_positions"][r]): 20.0 for r in gold}, null=1.0)
    metrics = task.evaluate(examples, f, outputs)
    assert all(isinstance(v, float) for v in metrics.values())
    n = len(examples)  # q_bad (not located in dev) is answered wrongly; every other question right
    if task.version == "1.1":
        assert metrics["exact_match"] == pytest.approx(100 * (n - 1) / n)
    else:
        assert metrics["exact"] == pytest.approx(100 * (n - 1) / n)
        assert metrics["NoAns_exact"] == 100.0 and metrics["NoAns_total"] == 1.0
        assert metrics["HasAns_total"] == n - 1


def test_no_valid_span(squad):
    task, data = squad
    examples, f = data["dev"]
    e = [ex.qas_id for ex in examples].index("q_mat")
    (r,) = np.flatnonzero(f["example_index"] == e)
    outputs = _logits(f, start={(r, p): 100.0 for p in np.flatnonzero(f["input_mask"][r] == 0)})
    assert (f["input_mask"][r] == 0).sum() >= task.n_best_size  # every top-20 start is padding
    preds, nbest, odds = task.predict(examples, f, outputs)
    if task.version == "1.1":
        assert preds["q_mat"] == "empty" and [n["text"] for n in nbest["q_mat"]] == ["empty"]
    else:
        assert preds["q_mat"] == "" and odds["q_mat"] == 1e9 and [n["text"] for n in nbest["q_mat"]] == [""]


def test_files_match_official_cli(squad, tmp_path, capsys):
    task, data = squad
    examples, f = data["dev"]
    rng = np.random.default_rng(0)
    outputs = {k: rng.normal(size=f["input_ids"].shape).astype(np.float32) for k in ("start_logits", "end_logits")}
    paths = task.write_predictions(examples, f, outputs, tmp_path, "dev")
    gold = tmp_path / "gold.json"
    gold.write_text(json.dumps(_dataset(task.version)))
    sm.main([str(gold), str(paths[0])] + (["--na-prob-file", str(paths[2])] if task.version == "2.0" else []))
    printed = json.loads(capsys.readouterr().out)
    assert printed == pytest.approx(task.evaluate(examples, f, outputs))


def test_v2_scores_are_those_of_the_written_predictions(squad, tokenizer):
    """A null threshold above the script's na_prob_thresh (1.0) must not turn answers into "no answer"
    in exact/f1: they score predictions.json as written."""
    task, data = squad
    if task.version != "2.0":
        pytest.skip("null odds are v2.0 only")
    examples, f = data["dev"]
    rng = np.random.default_rng(1)
    outputs = {k: rng.normal(size=f["input_ids"].shape).astype(np.float32) for k in ("start_logits", "end_logits")}
    for v in outputs.values():
        v[:, 0] += 4.0  # [CLS]: null odds well above 1.0
    loose = SquadTask("2.0", source={"dev": "unused"}, null_score_diff_threshold=1e8,
                      doc_stride=STRIDE, max_query_length=QLEN)
    loose.featurize(examples, tokenizer, L)
    preds, _, odds = loose.predict(examples, f, outputs)
    assert any(odds[q] > 1.0 and preds[q] for q in preds)  # answered, with null odds above 1.0
    gold = {ex.qas_id: list(ex.answers) for ex in examples}
    plain = sm.evaluate_v2(gold, preds)
    metrics = loose.evaluate(examples, f, outputs)
    assert {k: metrics[k] for k in plain} == pytest.approx(plain)


def test_get_final_text():
    assert basic_tokenize("Café (Felis catus)\u00a0x\u200b!", True) == ["cafe", "(", "felis", "catus", ")", "x", "!"]
    assert basic_tokenize("Café", False) == ["Café"]
    assert get_final_text("cafe", "Café", True) == "Café"
    assert get_final_text("catus", "catus)", True) == "catus"
    assert get_final_text("zanzibar - based", "Zanzibar-based trader", True) == "Zanzibar-based"
    assert get_final_text("[UNK]", "Steve Smith's", True) == "Steve Smith's"  # no alignment: whole words


def test_tfds_source(tmp_path, tokenizer):
    tfds = pytest.importorskip("tensorflow_datasets")
    import tensorflow as tf

    data = _dataset("2.0", malformed=False)

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


# -- metrics ------------------------------------------------------------------------------------


def test_normalize_and_scores():
    assert sm.normalize_answer("The  Cat!") == "cat"
    assert sm.normalize_answer("an Apple, a pear and THE end.") == "apple pear and end"
    assert sm.normalize_answer("theater") == "theater"
    assert sm.f1_score("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)  # P 1, R 1/2
    assert sm.f1_score("cat cat dog", "cat dog dog") == pytest.approx(2 / 3)  # counts clip: 2 shared of 3
    assert sm.f1_score("", "the") == 0.0 and sm.f1_score("", "the", empty_match=True) == 1.0
    assert sm.exact_match_score("The Cat.", "cat") == 1.0
    v1 = sm.evaluate_v1({"a": ["the mat", "a red mat"], "b": ["1888"], "c": ["x"]},
                        {"a": "red mat", "b": "in 1888"})  # c unanswered → 0
    assert v1["exact_match"] == pytest.approx(100 / 3)
    assert v1["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)


def test_evaluate_v2_best_threshold():
    gold = {"a": ["cat"], "b": ["dog house"], "c": [], "d": []}
    preds = {"a": "cat", "b": "house", "c": "", "d": "bird"}
    odds = {"a": -1.0, "b": 0.5, "c": 2.0, "d": 0.2}
    out = sm.evaluate_v2(gold, preds)
    assert out["exact"] == 50.0 and out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 4)
    assert out["HasAns_exact"] == 50.0 and out["NoAns_exact"] == 50.0 and out["total"] == 4
    out = sm.evaluate_v2(gold, preds, odds)  # odds > 1.0 count as "no answer": only c, already ""
    assert out["exact"] == 50.0
    # thresholds by hand, sorted odds a -1.0, d 0.2, b 0.5, c 2.0; start = 2 (no-answer questions)
    # exact: +1 (a) → 3 best at -1.0; -1 (d, "bird") → 2; +0 (b) → 2; +0 (c) → 2
    assert out["best_exact"] == 75.0 and out["best_exact_thresh"] == -1.0
    # f1: 3 at -1.0; 2 at 0.2; 2 + 2/3 at 0.5: best stays 3 at -1.0
    assert out["best_f1"] == 75.0 and out["best_f1_thresh"] == -1.0
    out = sm.evaluate_v2(gold, preds, {**odds, "d": 1.5})  # d's odds > na_prob_thresh 1.0: "bird" → no answer
    assert out["exact"] == 75.0 and out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 1) / 4)
    # f1: a +1 → 3 at -1.0; b +2/3 → 3 2/3 at 0.5 (best); d -1; c 0.  exact: 3 at -1.0, b adds 0
    assert out["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 4) and out["best_f1_thresh"] == 0.5
    assert out["best_exact"] == 75.0 and out["best_exact_thresh"] == -1.0
    with pytest.raises(ValueError, match="no prediction for 1"):
        sm.evaluate_v2(gold, {"a": "cat", "b": "", "c": ""})

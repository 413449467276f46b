"""create_pretraining_data as an Apache Beam pipeline (input_pipeline/pretraining/beam_pipeline.py) on
Beam's DirectRunner: the local tool's bytes (static and unmasked, more shards than files, empty
shards, gzip, the real Wikipedia excerpt), training reads them unchanged, and failures leave
nothing training would read. The failure cases and the command line with several worker processes
are slow-marked."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

pytest.importorskip("apache_beam", reason="the Beam pipeline needs pip install -e '.[beam]' (make test installs it)")

from input_pipeline import create_pretraining_data as cpd  # noqa: E402
from input_pipeline.pretraining import shards  # noqa: E402
from input_pipeline.pretraining.dataset import make_pretraining_dataset  # noqa: E402
from input_pipeline.tokenizers.wordpiece import WordPieceTokenizer  # noqa: E402

L, P = 32, 5  # those of the pretraining_data fixture
ENGINE = ("seconds", "examples_per_second", "tokens_per_second", "num_workers", "runner")


def files_of(directory) -> dict[str, bytes]:
    """Every file the tool leaves in ``directory`` (hidden ones too; a directory as None), by name."""
    return {f.name: f.read_bytes() if f.is_file() else None for f in sorted(Path(directory).iterdir())}


def _fresh_flags() -> flags.FlagValues:
    fv = flags.FlagValues()  # the module defines no flags at import
    cpd.define_flags(fv)
    return fv


def same_output(local, beam) -> None:
    a, b = files_of(local), files_of(beam)
    assert sorted(a) == sorted(b)  # no temporary file or directory left behind
    for name in a:
        if name.startswith("pretrain-"):
            assert a[name] == b[name], name  # byte for byte
    config = {d: json.loads(files["config.json"]) for d, files in (("a", a), ("b", b))}
    assert config["a"] == config["b"]
    summary = [{k: v for k, v in json.loads(files["summary.json"]).items() if k not in ENGINE} for files in (a, b)]
    assert summary[0] == summary[1]


@pytest.mark.parametrize("masking", ["static", pytest.param("none", marks=pytest.mark.slow)])
def test_beam_writes_the_local_tools_bytes(pretraining_data, pretraining_config, masking, tmp_path):
    """The fixture's local shards (4 files -> 4 shards), rebuilt by Beam; training reads them alike."""
    tok = WordPieceTokenizer(pretraining_data / "vocab.txt")
    local = pretraining_data / ("static" if masking == "static" else "unmasked")
    kw = dict(max_seq_length=L, max_predictions_per_seq=P, num_shards=4, random_seed=3, masking=masking,
              dupe_factor=2 if masking == "static" else 1)
    summary = cpd.create_pretraining_data(str(pretraining_data / "corpus" / "*.txt"), str(tmp_path), tok,
                                          runner="DirectRunner", **kw)
    assert summary["runner"] == "DirectRunner" and summary["examples"] > 0
    same_output(local, tmp_path)
    first = {}
    for d in (local, tmp_path):
        c = pretraining_config(pretraining_data, d, "static" if masking == "static" else "dynamic")
        first[d] = next(make_pretraining_dataset(c, batch_size=4))
    for k, v in first[local].items():
        np.testing.assert_array_equal(first[tmp_path][k], v, err_msg=k)


@pytest.mark.slow  # ~6 s; the fast suite has the static bytes and the excerpt
def test_beam_fewer_files_than_shards_empty_shards_gzip(tiny_tok, tmp_path, write_token_corpus):
    """Documents routed one by one (2 files, 7 shards), shards left empty, SOP, gzip: the same
    records (gzip's bytes are the compressor's business) and the same empty files."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_token_corpus(corpus, num_files=2, docs_per_file=2)
    kw = dict(max_seq_length=L, max_predictions_per_seq=P, num_shards=7, random_seed=5, objective="sop",
              compression="gzip", whole_word_mask=True, dupe_factor=2)
    out = {}
    for runner in (None, "DirectRunner"):
        out[runner] = tmp_path / str(runner)
        cpd.create_pretraining_data(str(corpus / "*.txt"), str(out[runner]), tiny_tok, runner=runner,
                                    progress=False, **kw)
    names = sorted(os.listdir(out[None]))
    assert names == sorted(os.listdir(out["DirectRunner"]))
    assert len([n for n in names if n.endswith(".tfrecord.gz")]) == 7
    empty = 0
    for name in names:
        if name.endswith(".tfrecord.gz"):
            records = [list(tf.data.TFRecordDataset(str(out[r] / name), "GZIP").as_numpy_iterator()) for r in out]
            assert records[0] == records[1], name
            empty += not records[0]
    assert empty == 3  # shards 4, 5, 6 get no document (routing: file i feeds shards i, i+2, ...)


def test_beam_on_the_wikipedia_excerpt(minilm_dir, wikipedia_dump, tmp_path):
    """The real dump (one file, 3 shards, NSP, static masks), as the issue asks: the same bytes."""
    tok = WordPieceTokenizer(minilm_dir / "vocab.txt")
    kw = dict(num_shards=3, dupe_factor=2, max_documents_per_file=12)
    for runner in (None, "DirectRunner"):
        cpd.create_pretraining_data(str(wikipedia_dump), str(tmp_path / str(runner)), tok, runner=runner,
                                    progress=False, **kw)
    same_output(tmp_path / "None", tmp_path / "DirectRunner")
    assert json.loads((tmp_path / "DirectRunner" / "summary.json").read_text())["documents"] == 12


@pytest.mark.slow  # ~10 s (4 pipelines); the fast suite has the empty-corpus case in tests/test_bad_input.py
def test_beam_failures_leave_nothing_training_reads(tiny_tok, tmp_path, write_token_corpus, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_token_corpus(corpus, num_files=2, docs_per_file=3)
    (tmp_path / "empty.txt").write_text("\n\n")
    out = tmp_path / "out"
    kw = dict(max_seq_length=L, max_predictions_per_seq=P, num_shards=2, runner="DirectRunner", progress=False)
    cpd.create_pretraining_data(str(corpus / "*.txt"), str(out), tiny_tok, **kw)
    before = files_of(out)
    # An empty corpus: the local tool's error, and the earlier output untouched.
    with pytest.raises(ValueError, match=r"empty.txt: no text to make examples of \(1 files, 0 documents"):
        cpd.create_pretraining_data(str(tmp_path / "empty.txt"), str(out), tiny_tok, **kw)
    assert files_of(out) == before
    # A worker failing while it builds shard 1: no summary.json, and training refuses the directory.
    build = shards.shard_examples

    def failing(s, shard, documents, tokenizer):
        if shard == 1:
            raise RuntimeError("worker lost")
        return build(s, shard, documents, tokenizer)

    monkeypatch.setattr(shards, "shard_examples", failing)
    with pytest.raises(RuntimeError, match="worker lost"):
        cpd.create_pretraining_data(str(corpus / "*.txt"), str(out), tiny_tok, **kw)
    left = files_of(out)
    assert "summary.json" not in left and not any(".tmp-" in n for n in left)
    from input_pipeline.pretraining.dataset import _record_files

    if any(n.startswith("pretrain-") for n in left):  # shards renamed into place before the failure
        with pytest.raises(ValueError, match="without summary.json"):
            _record_files(str(out))
    assert [n for n in left if n.startswith(".beam-temp-")]  # the failed run's, removed by the next one
    monkeypatch.setattr(shards, "shard_examples", build)
    cpd.create_pretraining_data(str(corpus / "*.txt"), str(out), tiny_tok, **kw)
    assert sorted(files_of(out)) == sorted(before)

def test_command_line_passes_beams_options_through(tiny_tok, tmp_path, write_token_corpus, capsys):
    write_token_corpus(tmp_path, num_files=2, docs_per_file=2)
    base = [f"--input={tmp_path}/part-*.txt", f"--vocab={tiny_tok.vocab_file}", "--max_seq_length=32",
            "--max_predictions_per_seq=5", "--num_shards=2"]
    fv = _fresh_flags()
    rest = cpd.parse_flags(["prog", *base, f"--output={tmp_path / 'out'}", "--runner=DirectRunner",
                            "--direct_num_workers=1", "--num_workers=3"], fv)
    assert rest == ["prog", "--direct_num_workers=1", "--num_workers=3"]  # Beam's (Dataflow's worker count)
    cpd.main(rest, fv)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["runner"] == "DirectRunner"
    with pytest.raises(SystemExit) as exit_:  # Beam's options without --runner: a typo, as in any tool
        cpd.parse_flags(["prog", *base, f"--output={tmp_path / 'x'}", "--direct_num_workers=1"], _fresh_flags())
    assert exit_.value.code == 2
    assert "direct_num_workers" in (err := capsys.readouterr().err) and "need --runner" in err


@pytest.mark.slow  # ~30 s: two worker processes start and import TensorFlow
def test_command_line_with_worker_processes(tiny_tok, tmp_path, write_token_corpus):
    """``python -m input_pipeline.create_pretraining_data --runner=DirectRunner`` with Beam's
    multi-processing mode (2 SDK worker processes over gRPC, the portable runner's harness): the
    local tool's bytes."""
    import subprocess
    import sys

    write_token_corpus(tmp_path, num_files=3, docs_per_file=4)
    args = [f"--input={tmp_path}/part-*.txt", f"--vocab={tiny_tok.vocab_file}", "--max_seq_length=32",
            "--max_predictions_per_seq=5", "--num_shards=4", "--dupe_factor=2", "--noprogress"]
    env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    for out, extra in (("local", []), ("beam", ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                                                 "--direct_num_workers=2"])):
        result = subprocess.run([sys.executable, "-m", "input_pipeline.create_pretraining_data", *args,
                                 f"--output={tmp_path / out}", *extra], env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    same_output(tmp_path / "local", tmp_path / "beam")


def test_beam_needs_its_extra(monkeypatch, tiny_tok, tmp_path):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "apache_beam" else find(name, *a))
    (tmp_path / "a.txt").write_text("w1 w2.\n")
    with pytest.raises(Exception, match=r"pip install 'bert-jax\[beam\]'"):
        cpd.create_pretraining_data(str(tmp_path / "a.txt"), str(tmp_path / "out"), tiny_tok, runner="DirectRunner")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ~1 min: two pipelines and a worker pool
def test_heldout_shards_alike_on_beam_and_worker_processes(tiny_tok, tmp_path, write_token_corpus):
    """--heldout_every: the training and held-out directories, byte for byte, whatever runs them."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_token_corpus(corpus, num_files=3, docs_per_file=5)
    kw = dict(max_seq_length=L, max_predictions_per_seq=P, num_shards=4, heldout_every=3, heldout_shards=2,
              dupe_factor=2, progress=False)
    runs = {"local": dict(num_workers=1), "pool": dict(num_workers=2), "beam": dict(runner="DirectRunner")}
    for name, engine in runs.items():
        cpd.create_pretraining_data(str(corpus / "*.txt"), str(tmp_path / name / "p"), tiny_tok, **kw, **engine)
    for name in ("pool", "beam"):
        for d in ("p", "p-heldout"):
            a, b = files_of(tmp_path / "local" / d), files_of(tmp_path / name / d)
            assert sorted(a) == sorted(b), (name, d)
            assert {k: v for k, v in a.items() if k.startswith("pretrain-")} == \
                {k: v for k, v in b.items() if k.startswith("pretrain-")}, (name, d)
    held = json.loads((tmp_path / "beam" / "p-heldout" / "summary.json").read_text())
    assert held["documents"] == 6 and len(held["shards"]) == 2  # documents 0 and 3 of each file

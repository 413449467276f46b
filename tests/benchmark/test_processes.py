"""bert_jax/benchmark/processes.py: one process per implementation, taking turns; its command lines,
its errors and its summary (the processes stubbed: the real run is in docs/records.md)."""

import json

import pytest

from bert_jax.benchmark import args as benchmark_args
from bert_jax.benchmark import processes
from input_pipeline.command_line import UserError

ARGS = ["--size", "base", "--batch_size", "8", "--steps", "6"]


def test_commands_give_each_implementation_its_own_process():
    a = processes.parse_args(["--rounds", "2", "--references", "hf-torch,hf-flax", "--", *ARGS])
    cmds = dict(processes.commands(a))
    assert list(cmds) == ["ours", "hf-torch", "hf-flax"]
    assert cmds["ours"][1:] == ["-m", "bert_jax.benchmark", *ARGS, "--json"]  # the project's defaults
    assert cmds["hf-torch"][-3:] == ["--compare", "hf-torch", "--references_only"]


@pytest.mark.parametrize("argv,message", [
    (["--rounds", "0", "--", *ARGS], "--rounds 0"),
    ([], "expected the benchmark's arguments"),
    (["--", *ARGS, "--compare", "hf-torch"], "--compare: set by this command"),
    (["--", *ARGS, "--references_only"], "--references_only: set by this command")])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        processes.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_summary_is_the_median_of_each_process_median(monkeypatch, tmp_path):
    times = {"ours": iter([4.0, 3.0, 3.5]), "hf-torch": iter([5.0, 4.5, 6.0])}

    def fake(name, cmd, timeout):
        return {"step_time_median_s": next(times[name]), "load_average": [1.0], "glibc_tunables": ""}

    monkeypatch.setattr(processes, "run_process", fake)
    out = tmp_path / "r.jsonl"
    s = processes.main(["--rounds", "3", "--references", "hf-torch", "--output", str(out), "--", *ARGS])
    assert s["median_step_s"] == {"ours": 3.5, "hf-torch": 5.0}
    assert s["ours_over_theirs"] == {"hf-torch": round(5.0 / 3.5, 3)}
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 7 and lines[-1]["mode"] == "processes"


def test_a_failed_process_is_one_line(monkeypatch):
    class Done:
        returncode, stdout, stderr = 2, "", "error: --compare hf-torch needs transformers\n"

    monkeypatch.setattr(processes.subprocess, "run", lambda *a, **k: Done())
    with pytest.raises(UserError, match="hf-torch: .* exited 2: error: --compare hf-torch needs transformers"):
        processes.run_process("hf-torch", ["python", "-m", "bert_jax.benchmark"], 10)


def test_references_only_needs_compare(capsys):
    with pytest.raises(SystemExit):
        benchmark_args.parse_args(["--size", "tiny", "--references_only", "--variant", "--noscan"])
    assert "--references_only times the --compare implementations alone" in capsys.readouterr().err

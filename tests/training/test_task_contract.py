"""The trainer's contract with a task (`bert_jax.training.task.Task`): both tasks implement every
hook with the protocol's parameters and set every attribute it declares, each hook is documented in one
line, and the trainer uses nothing of a task that the protocol does not declare."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from bert_jax.finetuning.task import FineTuning
from bert_jax.pretraining.task import PreTraining
from bert_jax.training import trainer
from bert_jax.training.task import Task

HOOKS = {name: fn for name, fn in vars(Task).items() if inspect.isfunction(fn) and not name.startswith("_")}
ATTRIBUTES = set(Task.__annotations__)


def assigned_in_init(cls) -> set[str]:
    """The ``self.<name>`` that ``cls.__init__`` assigns."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AnnAssign)
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for t in ast.walk(target) if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}


def test_the_protocol_declares_each_hook_in_one_line():
    assert HOOKS and ATTRIBUTES == {"name", "show_progress", "model_config", "num_train_steps"}
    for name, fn in HOOKS.items():
        doc = inspect.getdoc(fn)
        assert doc and "\n" not in doc, f"Task.{name}: expected a one-line docstring"


@pytest.mark.parametrize("task", [PreTraining, FineTuning])
def test_the_task_implements_the_protocol(task):
    for name, hook in HOOKS.items():
        assert callable(getattr(task, name, None)), f"{task.__name__} has no {name}"
        want = list(inspect.signature(hook).parameters)
        got = list(inspect.signature(getattr(task, name)).parameters)
        assert got == want, f"{task.__name__}.{name}{tuple(got)}: the protocol's parameters are {tuple(want)}"
    missing = {a for a in ATTRIBUTES if not hasattr(task, a)} - assigned_in_init(task)
    assert not missing, f"{task.__name__} does not set {sorted(missing)}"


def test_the_trainer_uses_only_what_the_protocol_declares():
    tree = ast.parse(Path(trainer.__file__).read_text(encoding="utf-8"))
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "task"}
    assert used and used <= set(HOOKS) | ATTRIBUTES, used - set(HOOKS) - ATTRIBUTES

"""Every dotted name of the project that the docs or a docstring write in backticks
(`bert_jax.training.steps.jit_steps`, `input_pipeline.pretraining.batch`) and every file path they write
so (`bert_jax/training/steps.py`) names something that exists: a module of the repository, then names
its source binds (read with ``ast``, nothing imported); a file in the repository. A module moved or a
function renamed fails here with the page and line that still name the old one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("bert_jax", "input_pipeline")
DOTTED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)(?:\(\))?`")
# bert_jax's packages, often written without the prefix (`training.steps.jit_steps`); `model.` is left
# out: ``model.size`` is a config key as often as the package.
SHORT = ("training", "pretraining", "finetuning", "interop", "benchmark", "serve", "visualize", "demo")
SHORT_DOTTED = re.compile(r"`((?:" + "|".join(SHORT) + r")(?:\.\w+)+)(?:\(\))?`")
PATH = re.compile(r"`((?:" + "|".join((*PACKAGES, "configs", "tests", "docs")) + r")/[\w./-]*\.(?:py|md))`")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def sources() -> list[Path]:
    return [p for package in (*PACKAGES, "configs") for p in sorted((ROOT / package).rglob("*.py"))]


def docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the module's, each class's and each function's docstring."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    return out


def texts(paths: list[Path]) -> list[tuple[str, str]]:
    """(where, text) for each page's lines and each source's docstrings."""
    out = []
    for path in paths:
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        if path.suffix == ".md":
            out += [(f"{rel}:{i}", line) for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]
        else:
            out += [(f"{rel}:{line} (docstring)", text) for line, text in docstrings(path)]
    return out


def module_file(dotted: str) -> Path | None:
    """The source file of a project module (``a/b.py`` or ``a/b/__init__.py``), None if there is none."""
    base = ROOT.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def defined_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body binds: functions, classes, assignments, imports (re-exports),
    and names bound under ``if``/``try`` at that level."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                out.update({n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for inner in getattr(node, block, []) or []:
                    out.update(defined_names(getattr(inner, "body", None) or [inner]))
    return out


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a project module, or names bound in the longest such module (a class's
    attributes through its body), read from the source without importing it: the first attribute
    must be bound in the module; past a class, its body; past anything else (an instance, a
    re-export), the rest is taken as written."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:i]))
        if path is None:
            continue
        node: ast.AST = ast.parse(path.read_text(encoding="utf-8"))
        for attr in parts[i:]:
            body = getattr(node, "body", None)
            if not isinstance(node, ast.Module | ast.ClassDef) or body is None:
                return True
            names = defined_names(body)
            if isinstance(node, ast.ClassDef):  # dataclass fields, attributes set in __init__
                init = names.get("__init__")
                names.update({t.attr: init for t in ast.walk(init) if isinstance(t, ast.Attribute)} if init else {})
            if attr not in names:
                return False
            node = names[attr]
        return True
    return False


def stale_references(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``where: `name``` for each dotted name or file path in ``paths`` that names nothing."""
    bad = []
    for where, text in texts(paths):
        text = " ".join(text.split())  # a name broken over two docstring lines still reads as one
        bad += [f"{where}: `{name}`" for name in DOTTED.findall(text) if not resolves(name)]
        bad += [f"{where}: `{name}`" for name in SHORT_DOTTED.findall(text) if not resolves(f"bert_jax.{name}")]
        bad += [f"{where}: `{name}`" for name in PATH.findall(text) if not (root / name).exists()]
    return bad


def test_docs_and_docstrings_name_what_exists():
    bad = stale_references(pages() + sources())
    assert not bad, "references to names or files that do not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("reference", ["`bert_jax.training.pretraining.PreTraining`",
                                       "`bert_jax.training.steps.no_such_function`",
                                       "`bert_jax/training/health.py`"])
def test_a_planted_bad_reference_is_found(tmp_path, reference):
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\nThe trainer (`bert_jax.training.trainer.run`) and {reference}.\n")
    module = tmp_path / "module.py"
    module.write_text(f'"""A module naming {reference} in its docstring."""\n')
    assert stale_references([page, module]) == [f"{page}:3: {reference}", f"{module}:1 (docstring): {reference}"]

"""The import arrows of the code, read with `ast` (nothing is imported): the data side never imports
bert_jax, no two modules import each other (directly or around a loop), each package imports only its
own layer of `LAYERS` and those below, and not the packages `FORBIDDEN` to it. Imports inside functions
count as much as top-level ones. docs/architecture.md describes the layers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]

# Lowest first. A module may import modules of its own row and of earlier rows. An entry names a
# package (and everything under it) or a module; the longest entry that names a module decides its row.
# A new package adds an entry (or a row): a module under no entry fails `test_every_module_has_a_layer`.
LAYERS = (
    ("input_pipeline",),
    ("bert_jax.config_args",),
    ("bert_jax.model", "bert_jax.resolve"),
    ("bert_jax.training",),
    ("bert_jax.interop",),
    ("bert_jax.pretraining", "bert_jax.finetuning"),
    ("bert_jax.launch", "bert_jax.plan"),
    ("bert_jax.benchmark", "bert_jax.demo", "bert_jax.visualize", "bert_jax.serve"),
    ("train", "configs"),
)
# Narrower than the rows (docs/architecture.md): packages that must not import some package below them.
FORBIDDEN = {"bert_jax.config_args": ("input_pipeline",), "bert_jax.model": ("input_pipeline",)}
# Imports that break a rule today (an upward import, or an edge that closes a cycle), each listed
# as (importer, imported): why. Both checks ignore these edges; remove an entry when its import goes.
EXCEPTIONS: dict[tuple[str, str], str] = {}
# Package roots whose __init__ is not part of any row: they must import nothing of the project.
ROOTS = ("bert_jax",)
SOURCES = ("bert_jax", "input_pipeline", "configs", "train.py")


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module of `SOURCES` under ``root``."""
    out = {}
    for source in SOURCES:
        for path in sorted((root / source).rglob("*.py")) if (root / source).is_dir() else [root / source]:
            if path.exists():
                parts = path.relative_to(root).with_suffix("").parts
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(project module imported, line) for every import statement in the file, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(dotted: str) -> str | None:  # the longest known module that ``dotted`` starts with
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(resolve(alias.name), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from the importing module's package
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:  # `from pkg import module` names the module itself
                target = f"{base}.{alias.name}"
                found.append((target if target in known else resolve(base), node.lineno))
    return [(target, line) for target, line in found if target and target != name]


def import_graph(root: Path, *, exceptions: bool = False) -> dict[str, list[tuple[str, int]]]:
    """Module → [(imported module, line)]; the `EXCEPTIONS` edges only with ``exceptions=True``."""
    files = module_files(root)
    graph = {name: imports(name, path, set(files)) for name, path in files.items()}
    return {m: [(t, line) for t, line in edges if exceptions or (m, t) not in EXCEPTIONS]
            for m, edges in graph.items()}


def under(module: str, entry: str) -> bool:
    return module == entry or module.startswith(entry + ".")


def entry_of(module: str) -> tuple[int, str] | None:
    """(row, entry) of the longest `LAYERS` entry that names ``module``."""
    found = [(i, e) for i, row in enumerate(LAYERS) for e in row if under(module, e)]
    return max(found, key=lambda f: len(f[1])) if found else None


def layer(module: str) -> int | None:
    return entry_of(module)[0] if entry_of(module) else None


def where(root: Path, module: str, line: int) -> str:
    return f"{module_files(root)[module].relative_to(root)}:{line}"


def data_side_violations(root: Path) -> list[str]:
    return [f"{where(root, m, line)}: {m} imports {t}" for m, edges in import_graph(root).items()
            if m.split(".")[0] == "input_pipeline" for t, line in edges if t.split(".")[0] == "bert_jax"]


def layer_violations(root: Path) -> list[str]:
    bad = []
    for m, edges in import_graph(root).items():
        for t, line in edges:
            if m in ROOTS:
                bad.append(f"{where(root, m, line)}: the package root {m} imports {t}")
            elif t not in ROOTS and layer(t) > layer(m):
                bad.append(f"{where(root, m, line)}: {m} (row {layer(m)} of LAYERS) imports {t} (row {layer(t)})")
            elif any(under(t, f) for f in FORBIDDEN.get(entry_of(m)[1], ())):
                bad.append(f"{where(root, m, line)}: {m} imports {t} (FORBIDDEN)")
    return bad


def find_cycle(graph: dict[str, list[tuple[str, int]]]) -> list[str] | None:
    """One import cycle as its path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t, _ in graph.get(m, ()):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def cycle_message(root: Path) -> str | None:
    graph = import_graph(root)
    cycle = find_cycle(graph)
    if cycle is None:
        return None
    lines = dict(((m, t), line) for m in graph for t, line in graph[m])
    steps = [f"{a} -> {b} ({where(root, a, lines[a, b])})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return "import cycle: " + " -> ".join(cycle) + "\n  " + "\n  ".join(steps)


def test_every_module_has_a_layer():
    unlisted = [m for m in module_files(ROOT) if m not in ROOTS and layer(m) is None]
    assert not unlisted, f"modules under no entry of LAYERS (add a row or an entry): {unlisted}"
    assert all(layer(m) is not None for m, _ in EXCEPTIONS), "an EXCEPTIONS edge names an unknown module"
    assert all(entry_of(p) == (layer(p), p) for p in FORBIDDEN), "a FORBIDDEN key is not an entry of LAYERS"


def test_input_pipeline_never_imports_bert_jax():
    bad = data_side_violations(ROOT)
    assert not bad, "the data side must not import bert_jax:\n" + "\n".join(bad)


def test_no_import_cycle():
    message = cycle_message(ROOT)
    assert message is None, message


def test_layering():
    bad = layer_violations(ROOT)
    assert not bad, "imports against LAYERS (test_architecture.py):\n" + "\n".join(bad)


def test_exceptions_are_still_needed():
    """Each exception is an import the code still has, and it still breaks a rule: upward, or on a cycle."""
    graph = import_graph(ROOT, exceptions=True)

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            m = todo.pop()
            if m == b:
                return True
            if m not in seen:
                seen.add(m)
                todo += [t for t, _ in graph.get(m, ())]
        return False

    edges = {(m, t) for m, targets in graph.items() for t, _ in targets}
    for m, t in EXCEPTIONS:
        assert (m, t) in edges, f"EXCEPTIONS: {m} no longer imports {t}: remove the entry"
        assert layer(t) > layer(m) or reaches(t, m), f"EXCEPTIONS: {m} -> {t} breaks no rule: remove the entry"


def test_the_checks_catch_bad_imports(tmp_path):
    """On a small tree: an upward import (inside a function, relative), a data-side import of bert_jax
    and a cycle are each reported with file:line; a clean tree is not."""
    def write(rel: str, text: str = ""):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    for rel in ("bert_jax/__init__.py", "bert_jax/model/__init__.py", "bert_jax/training/__init__.py",
                "input_pipeline/__init__.py", "bert_jax/training/loop.py", "input_pipeline/masking.py"):
        write(rel)
    write("bert_jax/model/layers.py", "import numpy\nfrom bert_jax.training import loop  # fine? no\n")
    write("bert_jax/training/optim.py", "from bert_jax.model import layers\nfrom input_pipeline import masking\n")
    write("bert_jax/model/heads.py", "import jax\nimport input_pipeline.masking\n")
    assert layer_violations(tmp_path) == [
        "bert_jax/model/heads.py:2: bert_jax.model.heads imports input_pipeline.masking (FORBIDDEN)",
        "bert_jax/model/layers.py:2: bert_jax.model.layers (row 2 of LAYERS) imports bert_jax.training.loop (row 3)"]
    write("bert_jax/model/heads.py", "")
    write("bert_jax/model/layers.py", "def f():\n    from ..training.loop import x\n")
    assert layer_violations(tmp_path) == [
        "bert_jax/model/layers.py:2: bert_jax.model.layers (row 2 of LAYERS) imports bert_jax.training.loop (row 3)"]
    assert cycle_message(tmp_path) is None and data_side_violations(tmp_path) == []
    write("input_pipeline/masking.py", "\n\nimport bert_jax.training.optim as o\n")
    assert data_side_violations(tmp_path) == [
        "input_pipeline/masking.py:3: input_pipeline.masking imports bert_jax.training.optim"]
    assert cycle_message(tmp_path) == (
        "import cycle: bert_jax.training.optim -> input_pipeline.masking -> bert_jax.training.optim\n"
        "  bert_jax.training.optim -> input_pipeline.masking (bert_jax/training/optim.py:2)\n"
        "  input_pipeline.masking -> bert_jax.training.optim (input_pipeline/masking.py:3)")
    write("bert_jax/model/layers.py", "")
    write("input_pipeline/masking.py", "")
    assert not layer_violations(tmp_path) and cycle_message(tmp_path) is None


def step_path() -> tuple[list[str], list[str]]:
    """The files docs/architecture.md's "How a step flows" names: its numbered list (the path from the
    command line into the step, in order) and the files it names beside the path."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## How a step flows", 1)[1].split("\n## ", 1)[0]
    path = re.findall(r"^\d+\. `([^`]+)`", section, re.M)
    beside = section.split("Beside the step", 1)[1] if "Beside the step" in section else ""
    return path, re.findall(r"`(bert_jax/[\w/]+\.py)`", beside)


# What a pre-training step crossed when the house was last counted (issue 59: 13 files, from train.py
# to the model's layers): the path may not grow past it.
STEP_FILES = 13


def test_the_step_path_names_every_file_a_step_crosses():
    """docs/architecture.md names the files from train.py into the jitted step (at most `STEP_FILES`),
    each exists and each imports the next one the step passes to; every module of the trainer's and
    pre-training's packages is named, on the path or beside it."""
    files, beside = step_path()
    assert 0 < len(files) <= STEP_FILES and files[0] == "train.py", files
    assert all((ROOT / f).is_file() for f in files + beside), files + beside
    graph = import_graph(ROOT, exceptions=True)
    module = {f: f.removesuffix(".py").replace("/", ".") for f in files}
    calls = [("train.py", "bert_jax/launch.py"), ("bert_jax/launch.py", "bert_jax/training/trainer.py"),
             ("bert_jax/launch.py", "bert_jax/pretraining/task.py"),  # the task the trainer runs
             ("bert_jax/training/trainer.py", "bert_jax/resolve.py"),
             ("bert_jax/pretraining/task.py", "bert_jax/pretraining/objective.py"),
             ("bert_jax/pretraining/objective.py", "bert_jax/training/steps.py"),
             ("bert_jax/pretraining/objective.py", "bert_jax/pretraining/health.py"),
             ("bert_jax/pretraining/objective.py", "bert_jax/model/models.py"),
             ("bert_jax/training/steps.py", "bert_jax/training/optim.py"),
             ("bert_jax/training/steps.py", "bert_jax/training/sharding.py"),
             ("bert_jax/model/models.py", "bert_jax/model/encoder.py"),
             ("bert_jax/model/encoder.py", "bert_jax/model/layers.py")]
    assert {f for edge in calls for f in edge} <= set(files), files
    for a, b in calls:
        assert module[b] in {t for t, _ in graph[module[a]]}, f"{a} does not import {b}"
    assert "jax.jit(" in (ROOT / "bert_jax/training/steps.py").read_text()
    named = set(files) | set(beside)
    for package in ("training", "pretraining"):
        unnamed = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "bert_jax" / package).glob("*.py"))
                   if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in named]
        assert not unnamed, f"docs/architecture.md's step section names neither path nor place of {unnamed}"


def test_training_holds_the_trainer_the_step_builder_and_the_services():
    """bert_jax/training is the trainer's package: no task lives there (pre-training has its own)."""
    found = {p.stem for p in (ROOT / "bert_jax" / "training").glob("*.py")} - {"__init__"}
    assert found == {"trainer", "task", "steps",  # the trainer, its contract with a task, the step builder
                     "optim", "trust_ratio", "global_norm", "sharding", "sharding_rules",  # the step builder's
                     "compiler_options",
                     "checkpoints", "metric_writer", "progress", "preemption", "workdir_lock", "distributed"}, found


def closures(path: Path) -> dict[str, int]:
    """Function (qualified by its line) → how many functions it defines in its body (lambdas aside)."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions = ast.FunctionDef | ast.AsyncFunctionDef
            inner = [n for n in ast.walk(node) if n is not node and isinstance(n, functions)]
            out[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = len(inner)
    return out


def test_training_functions_define_at_most_two_closures():
    """A function in bert_jax/training or bert_jax/pretraining reads top to bottom: at most two nested
    functions."""
    counts = {k: v for package in ("training", "pretraining")
              for p in sorted((ROOT / "bert_jax" / package).glob("*.py")) for k, v in closures(p).items()}
    assert counts and not {k: v for k, v in counts.items() if v > 2}


def lines(package: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in (ROOT / package).rglob("*.py"))


def test_entry_point_and_benchmark_in_proportion():
    """launch.py dispatches (at most 60 lines); the benchmark package is smaller than the model."""
    assert len((ROOT / "bert_jax" / "launch.py").read_text().splitlines()) <= 60
    assert lines("bert_jax/benchmark") < lines("bert_jax/model"), (lines("bert_jax/benchmark"), lines("bert_jax/model"))


def test_one_trainer_for_pretraining_and_finetuning():
    """The tasks plug into the one trainer; neither has a loop, a restore or a state builder of its own."""
    for task in ("bert_jax/pretraining/task.py", "bert_jax/pretraining/objective.py", "bert_jax/finetuning/task.py"):
        text = (ROOT / task).read_text()
        assert not [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.While)], task  # no loop of its own
        assert not any(call in text for call in (".save(", "set_aside_after(", "state_layout(", "jax.jit(")), task
    assert not (ROOT / "bert_jax" / "finetuning" / "trainer.py").exists()


def function_lengths(path: Path, root: Path = ROOT) -> dict[str, int]:
    """Function (qualified by its file and line) → its lines, decorators and docstring included."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out[f"{path.relative_to(root)}:{node.lineno} {node.name}"] = node.end_lineno - first + 1
    return out


MAX_FUNCTION_LINES = 80


def test_no_function_over_80_lines():
    """A function in bert_jax fits on a screen (`MAX_FUNCTION_LINES`); a longer one has parts to name."""
    long = {k: n for p in sorted((ROOT / "bert_jax").rglob("*.py")) for k, n in function_lengths(p).items()
            if n > MAX_FUNCTION_LINES}
    assert not long, long


def reused_names(path: Path) -> list[str]:
    """Module-level functions of ``path`` whose name another function of the module also has (a
    method, a nested function or a second definition). Methods of different classes may share names
    (they implement one protocol), and so may closures of different functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = ast.FunctionDef | ast.AsyncFunctionDef
    top = [n.name for n in tree.body if isinstance(n, functions)]
    every = [n.name for n in ast.walk(tree) if isinstance(n, functions)]
    return sorted({name for name in top if every.count(name) > 1})


def test_one_function_per_name_in_a_module():
    """``summarize`` at the top of a module and again as a method there reads as one thing; name each
    for what it does."""
    reused = {str(p.relative_to(ROOT)): names for p in sorted((ROOT / "bert_jax").rglob("*.py"))
              if (names := reused_names(p))}
    assert not reused, reused


def test_the_size_checks_catch_long_functions_and_reused_names(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\n\ndef summarize():\n    pass\n\n\n"
                                   "class Task:\n    def summarize(self):\n        pass\n")
    lengths = {k.split(" ")[-1]: n for k, n in function_lengths(tmp_path / "m.py", tmp_path).items()}
    assert lengths["long"] == MAX_FUNCTION_LINES + 1
    assert reused_names(tmp_path / "m.py") == ["summarize"]


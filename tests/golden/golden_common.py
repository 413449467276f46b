"""What the golden scripts (run as scripts in the golden venv: no bert_jax, no jax) share."""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def load_package_data():
    """input_pipeline/package_data.py loaded by path (stdlib only), so neither bert_jax nor jax is imported."""
    path = REPO / "input_pipeline" / "package_data.py"
    spec = importlib.util.spec_from_file_location("_bert_jax_package_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_review_sentences(path: Path) -> list[str]:
    """The vaderSentiment review file's sentences: the third tab-separated column of every non-empty
    line, CRLF endings stripped; a line with another number of fields names itself."""
    out = []
    for n, line in enumerate(path.read_bytes().decode("utf-8").split("\n"), 1):
        line = line.rstrip("\r")
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"{path}:{n}: expected 3 tab-separated fields, found {len(fields)}")
        out.append(fields[2])
    return out


def saved(model, prefix: str = "") -> dict:
    """What a transformers model's ``save_pretrained`` writes: ``{prefix}tensor/<name>`` arrays and
    ``{prefix}config_json`` (safetensors and numpy imported here: only the golden venv has them all)."""
    import numpy as np
    from safetensors import safe_open

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        with safe_open(Path(d) / "model.safetensors", "np") as f:
            out = {f"{prefix}tensor/{k}": f.get_tensor(k) for k in sorted(f.keys())}
        out[f"{prefix}config_json"] = np.str_((Path(d) / "config.json").read_text())
    return out


def start(doc: str, out: Path, argv: list[str] | None = None) -> argparse.Namespace:
    """A torch golden script's start: ``--out`` (default ``out``), torch on 2 threads (the numbers
    were made so), no download progress bars."""
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    return args


def versions(*modules) -> dict:
    """``<name>_version`` of each module (torch, transformers, ...) and Python's, as numpy strings:
    what every golden file records of the code that made it."""
    import platform

    import numpy as np

    v = {f"{mod.__name__}_version": mod.__version__ for mod in (*modules, np)}
    return {k: np.str_(s) for k, s in {**v, "python_version": platform.python_version()}.items()}


def perturb(model, seed: int) -> None:
    """Adds 0.1 * N(0, 1) to every parameter of a torch model, in place (tied parameters stay tied,
    moved once)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))

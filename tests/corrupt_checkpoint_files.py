r"""Which damaged file of an Orbax checkpoint stops a restore, and which restores wrong values
(docs/robustness.md, "A checkpoint that will not restore"):

    python tests/corrupt_checkpoint_files.py /tmp/w/checkpoints/32

For each file under ``<step>/state``, a copy of the step directory gets that file truncated to half
(or one byte in its middle flipped) and is read with `read_tree` (tensorstore, no fingerprint
check); the result is compared array by array with the intact checkpoint.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bert_jax.training.checkpoints import read_tree


def damage(path: Path, mode: str) -> None:
    raw = bytearray(path.read_bytes())
    if mode == "truncate":
        path.write_bytes(bytes(raw[: len(raw) // 2]))
    else:
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))


def main(step_dir: str) -> None:
    src = Path(step_dir)
    ref = read_tree(src / "state")
    files = sorted(p.relative_to(src) for p in (src / "state").rglob("*") if p.is_file())
    for mode in ("truncate", "flip"):
        for rel in files:
            with tempfile.TemporaryDirectory() as tmp:
                dst = Path(tmp) / src.name
                shutil.copytree(src, dst)
                damage(dst / rel, mode)
                try:
                    got = read_tree(dst / "state")
                    differ = [k for k in ref if k not in got or not np.array_equal(ref[k], got[k])]
                    result = f"restores, {len(differ)} arrays differ {differ[:2]}"
                except Exception as e:  # what a resume would raise
                    result = f"error {type(e).__name__}: {' '.join(str(e).split())[:100]}"
            print(f"{mode:8} {rel} ({(src / rel).stat().st_size} bytes): {result}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

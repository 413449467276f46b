"""Writing a finished file in one step: `write_atomically`.

(`input_pipeline.package_data` keeps its own copy: it must stay loadable by file path with the
standard library alone, for `make golden`.)
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | os.PathLike, data: bytes) -> Path:
    """``data`` to a temporary file beside ``path`` (mode 0666 less the umask, its directory made),
    then renamed over it: an interrupted run leaves no half-written file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path

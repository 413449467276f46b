"""Writing a finished file in one step: `write_atomically` (a local path, or a ``gs://`` URL);
`check_output_file` before the work; `path_or_url`, a path that may be a URL.

(`input_pipeline.package_data` keeps its own copy: it must stay loadable by file path with the
standard library alone, for `make golden`.)
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def check_output_file(path: str | os.PathLike) -> Path:
    """``path`` as a Path, or an OSError naming it if it cannot become a file (it is a directory, or
    a file stands where a directory above it belongs): tools check before the work, not after."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, expected a file path", str(path))
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "is a file, expected a directory", str(parent))
            break
    return path


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URL (``gs://...``): pathlib would make it ``gs:/...``."""
    return "://" in os.fspath(path)


def path_or_url(path: str | os.PathLike):
    """``path`` as a Path, or for a URL an ``etils.epath.Path`` (read and written through
    tf.io.gfile), which pathlib would turn into a local ``gs:/...``."""
    if is_url(path):
        from etils import epath

        return epath.Path(os.fspath(path))
    return Path(path)


def write_atomically(path: str | os.PathLike, data: bytes) -> Path:
    """``data`` to a temporary file beside ``path`` (mode 0666 less the umask, its directory made),
    then renamed over it: an interrupted run leaves no half-written file under the final name. A
    URL (``gs://``) is uploaded in one piece through tf.io.gfile (an object store shows an object only
    once its upload is complete); its ``epath.Path`` is returned."""
    if is_url(path):
        target = path_or_url(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return target
    path = check_output_file(path)
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

"""Reads a PyTorch ``state_dict`` file (``pytorch_model.bin``) into numpy arrays without torch.

Only the zip format that ``torch.save`` has written since PyTorch 1.6 is read, and only what a
state dict holds (tensors in an OrderedDict). The unpickler is restricted to those classes, so a
file that smuggles other objects is refused rather than executed.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _StorageType:
    def __init__(self, name: str):
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


def _rebuild_tensor(storage, offset, size, stride, *_):
    itemsize = storage.dtype.itemsize
    if not size:
        return storage[offset : offset + 1].reshape(()).copy()
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride)
    )
    return np.ascontiguousarray(view)


def load_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """``{name: array}`` from a torch zip checkpoint; a clear ValueError for anything else."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path}: not a zip-format PyTorch checkpoint (legacy torch.save format or corrupt); "
            "re-save it with a recent torch or convert it to model.safetensors"
        )
    with zipfile.ZipFile(path) as zf:
        pkl = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if not pkl:
            raise ValueError(f"{path}: zip file has no data.pkl; not a PyTorch checkpoint")
        prefix = pkl[0][: -len("data.pkl")]

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if module == "torch" and name in _STORAGE_DTYPES:
                    return _StorageType(name)
                if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                    return _rebuild_tensor
                if (module, name) == ("torch._utils", "_rebuild_parameter"):
                    return lambda data, *_: data
                if (module, name) == ("collections", "OrderedDict"):
                    return collections.OrderedDict
                raise pickle.UnpicklingError(
                    f"{path}: holds {module}.{name}, which is not part of a tensor state dict"
                )

            def persistent_load(self, pid):
                _, storage_type, key, _location, _numel = pid
                raw = zf.read(f"{prefix}data/{key}")
                return np.frombuffer(raw, dtype=storage_type.dtype)

        try:
            state = Unpickler(zf.open(pkl[0])).load()
        except (pickle.UnpicklingError, KeyError, EOFError, ValueError) as e:
            raise ValueError(f"{path}: cannot read PyTorch state dict: {e}") from e
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict (name → tensor), found {type(state).__name__}")
    return {k: np.asarray(v) for k, v in state.items() if isinstance(v, np.ndarray)}

"""A restricted unpickler for checkpoint extras (RNG states, data-loader positions, ...).

Unpickling can call any importable function, so a pickle somebody else could have written
can run their code as you. Like ``torch.load(weights_only=True)``, extras load through an
allowlist of globals: Python's plain data types, numpy arrays, scalars, dtypes and random
generators, and torch tensors, sizes, devices and dtypes. Anything else (your own class,
say) is refused with its name and the opt-in: ``CheckpointManager(..., unpickle="any")``
for extras you wrote yourself. Standard library only at import; numpy and torch names are
matched by name, never imported here.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from hpctrain.errors import CheckpointError

# module -> names unpickling may resolve there (data types and numpy/torch rebuilders)
ALLOWED: dict[str, frozenset[str]] = {
    "builtins": frozenset({"set", "frozenset", "list", "dict", "tuple", "bytearray", "bytes",
                           "complex", "slice", "range", "int", "float", "str", "bool"}),
    "collections": frozenset({"OrderedDict", "defaultdict", "deque", "Counter"}),
    "datetime": frozenset({"datetime", "date", "time", "timedelta", "timezone"}),
    "decimal": frozenset({"Decimal"}),
    "fractions": frozenset({"Fraction"}),
    "numpy": frozenset({"dtype", "ndarray"}),
    "numpy.core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy._core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy.core.numeric": frozenset({"_frombuffer"}),
    "numpy._core.numeric": frozenset({"_frombuffer"}),
    "numpy.random._pickle": frozenset({"__bit_generator_ctor", "__randomstate_ctor",
                                       "__generator_ctor"}),
    "numpy.random._mt19937": frozenset({"MT19937"}),
    "numpy.random._pcg64": frozenset({"PCG64", "PCG64DXSM"}),
    "numpy.random._philox": frozenset({"Philox"}),
    "numpy.random._sfc64": frozenset({"SFC64"}),
    "numpy.random.bit_generator": frozenset({"SeedSequence", "__pyx_unpickle_SeedSequence"}),
    "torch": frozenset({"Size", "device"}),
    "torch._utils": frozenset({"_rebuild_tensor_v2", "_rebuild_parameter"}),
    # torch.load of the storage bytes, itself weights_only by default since torch 2.6
    "torch.storage": frozenset({"_load_from_bytes"}),
}
TORCH_DTYPES = frozenset({
    "float16", "float32", "float64", "bfloat16", "complex64", "complex128", "uint8", "int8",
    "int16", "int32", "int64", "bool", "half", "float", "double", "long", "int", "short"})


def allowed(module: str, name: str) -> bool:
    """Whether the restricted unpickler resolves ``module.name``."""
    if module == "numpy.dtypes" and name.endswith("DType"):
        return True
    if module == "torch" and name in TORCH_DTYPES:
        return True
    return name in ALLOWED.get(module, ())


class _Restricted(pickle.Unpickler):
    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if not allowed(module, name):
            raise CheckpointError(
                f"{self.where} holds a pickled {module}.{name}, which the safe unpickler "
                "refuses (only Python data types, numpy and torch values load by default: "
                "unpickling can run code). If you wrote this checkpoint yourself, load it "
                "with CheckpointManager(..., unpickle=\"any\"); better, keep extras to "
                "plain types")
        return super().find_class(module, name)


def loads(data: bytes, where: str, mode: str = "safe") -> Any:
    """Unpickle ``data`` (extras read from ``where``); ``mode="any"`` is plain pickle."""
    if mode == "any":
        return pickle.loads(data)
    return _Restricted(data, where).load()

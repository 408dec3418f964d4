"""Chapter 11c: State — finding a model's tensors, naming them, saving and loading them.

What this teaches:
- a model is any Python object: its parameters are simply the Tensors reachable through its
  attributes, lists, tuples and dicts. `get_state_dict` walks that structure and names every
  tensor by its path (`layers.0.weight`), exactly as tinygrad (and PyTorch) name them;
- `load_state_dict` is the reverse walk: it checks every name and shape first and reports *all*
  missing, unexpected and mis-shaped keys in one error, then assigns the values;
- the safetensors file format is simple enough to write by hand: 8 bytes (little-endian u64) with
  the header's length, a JSON header `{name: {dtype, shape, data_offsets}}`, then the raw bytes.
  Loading it runs `json.loads` and `np.frombuffer` — nothing is unpickled, so a file from a
  stranger cannot run code on your machine.

Builds on: tensor.py (Tensor, assign, realize). Used by: training scripts and notebooks.

>>> from tinyteach import Tensor
>>> class Net:
...     def __init__(self):
...         self.layers = [Tensor.zeros(2, 3), {"scale": Tensor.ones(3)}]
>>> list(get_state_dict(Net()))
['layers.0', 'layers.1.scale']
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from tinyteach.dtype import DType, dtypes
from tinyteach.helpers import prod
from tinyteach.schedule import is_contiguous_buffer
from tinyteach.tensor import Tensor

# ---- walking a model ----


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every Tensor reachable from `obj`, keyed by its dotted path (tinygrad's names)."""
    state: dict[str, Tensor] = {}
    _collect(obj, prefix, state, set())
    return state


def _collect(obj: Any, prefix: str, state: dict[str, Tensor], seen: set[int]) -> None:
    if isinstance(obj, Tensor):
        state[prefix.strip(".")] = obj
        return
    if id(obj) in seen:  # a cycle (or a shared sub-object): visit it once
        return
    seen.add(id(obj))
    if hasattr(obj, "_asdict"):  # a namedtuple: use its field names
        obj = obj._asdict()
    elif not isinstance(obj, (list, tuple, dict)) and hasattr(obj, "__dict__"):
        obj = vars(obj)
    if isinstance(obj, (list, tuple)):
        for index, item in enumerate(obj):
            _collect(item, f"{prefix}{index}.", state, seen)
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            _collect(value, f"{prefix}{key}.", state, seen)


def get_parameters(obj: Any) -> list[Tensor]:
    """Every Tensor reachable from `obj`, in state-dict order (each tensor once)."""
    unique: dict[int, Tensor] = {}
    for tensor in get_state_dict(obj).values():
        unique.setdefault(id(tensor), tensor)
    return list(unique.values())


def load_state_dict(model: Any, state_dict: Mapping[str, Tensor],
                    strict: bool = True) -> list[Tensor]:
    """Assign `state_dict`'s values to the model's tensors with the same names, and realize them.

    With strict=True every model key must be present and no extra keys may be given; a shape
    mismatch is always an error. All problems are reported together, before anything changes."""
    targets = get_state_dict(model)
    problems = _state_dict_problems(targets, state_dict, strict)
    if problems:
        raise KeyError("load_state_dict: " + "; ".join(problems))
    loaded = []
    for name, target in targets.items():
        if name in state_dict:
            value = state_dict[name].to(target.device).cast(target.dtype)
            loaded.append(_own_buffer(target).assign(value))
    if loaded:
        Tensor.realize(*loaded)
    return loaded


def _own_buffer(target: Tensor) -> Tensor:
    """Give a not-yet-realized tensor memory of its own, so that assign() copies into it:
    otherwise it would share the state dict's buffer, and training the model would change it."""
    if not is_contiguous_buffer(target.uop):
        target.assign(Tensor.empty(*target.shape, dtype=target.dtype, device=target.device))
    return target


def _state_dict_problems(targets: Mapping[str, Tensor], given: Mapping[str, Tensor],
                         strict: bool) -> list[str]:
    missing = [name for name in targets if name not in given]
    unexpected = [name for name in given if name not in targets]
    mis_shaped = [f"{name} (model {targets[name].shape}, state dict {given[name].shape})"
                  for name in targets if name in given and given[name].shape != targets[name].shape]
    problems = []
    if strict and missing:
        problems.append(f"missing keys {missing}")
    if strict and unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if mis_shaped:
        problems.append(f"mis-shaped keys {mis_shaped}")
    return problems


# ---- the safetensors format ----

SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "I16": dtypes.int16,
    "U16": dtypes.uint16, "I32": dtypes.int32, "U32": dtypes.uint32, "I64": dtypes.int64,
    "U64": dtypes.uint64, "F16": dtypes.float16, "F32": dtypes.float32, "F64": dtypes.float64,
}
_NAME_OF_DTYPE = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file (truncated, corrupt or unsupported)."""


def safe_save(tensors: Mapping[str, Tensor], path: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` to `path` in the safetensors format (realizing them first)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks, offset = [], 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _NAME_OF_DTYPE:
            raise TypeError(f"safe_save: {name} has dtype {tensor.dtype}, which safetensors "
                            f"(as tinyteach writes it) does not support")
        data = np.ascontiguousarray(tensor.numpy()).astype(tensor.dtype.np.newbyteorder("<"))
        raw = data.tobytes()
        header[name] = {"dtype": _NAME_OF_DTYPE[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # pad so the data starts 8-byte aligned
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        for raw in chunks:
            file.write(raw)


def safe_load(path: str | os.PathLike[str], device: str | None = None) -> dict[str, Tensor]:
    """Read a safetensors file into Tensors; raise SafetensorsError for a broken file."""
    with open(path, "rb") as file:
        content = file.read()
    header, data = _split_file(content, str(path))
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        array = _array_from_entry(name, entry, data, str(path))
        tensors[name] = Tensor(array, device=device)
    return tensors


def _split_file(content: bytes, path: str) -> tuple[dict[str, Any], bytes]:
    """The JSON header and the data section, after checking that the sizes add up."""
    if len(content) < 8:
        raise SafetensorsError(f"{path}: {len(content)} bytes is too short for a safetensors "
                               f"file (it starts with an 8-byte header length); truncated?")
    (header_length,) = struct.unpack("<Q", content[:8])
    if header_length > len(content) - 8:
        raise SafetensorsError(f"{path}: the header claims {header_length} bytes but only "
                               f"{len(content) - 8} follow; the file is truncated or corrupt")
    try:
        header = json.loads(content[8:8 + header_length])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsError(f"{path}: the header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header must be a JSON object")
    return header, content[8 + header_length:]


def _array_from_entry(name: str, entry: Any, data: bytes, path: str) -> np.ndarray:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise SafetensorsError(f"{where} needs 'dtype', 'shape' and 'data_offsets'")
    if entry["dtype"] not in SAFETENSORS_DTYPES:
        raise SafetensorsError(f"{where} has unsupported dtype {entry['dtype']!r}; supported: "
                               f"{sorted(SAFETENSORS_DTYPES)}")
    dtype = SAFETENSORS_DTYPES[entry["dtype"]]
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not (_is_int_list(shape) and _is_int_list(offsets) and len(offsets) == 2):
        raise SafetensorsError(f"{where}: shape and data_offsets must be lists of ints >= 0")
    begin, end = offsets
    if end - begin != prod(shape) * dtype.itemsize:
        raise SafetensorsError(f"{where}: data_offsets {offsets} hold {end - begin} bytes but "
                               f"shape {shape} of {entry['dtype']} needs "
                               f"{prod(shape) * dtype.itemsize}")
    if end > len(data):
        raise SafetensorsError(f"{where} ends at byte {end} of the data, but the file has only "
                               f"{len(data)}; the file is truncated")
    raw = np.frombuffer(data[begin:end], dtype=dtype.np.newbyteorder("<"))
    return raw.astype(dtype.np).reshape(shape)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and v >= 0 for v in value)

"""Chapter 11 (part 3): State — finding a model's tensors, naming them, saving and loading them.

What this teaches:
- a model is any Python object: its parameters are simply the Tensors reachable through its
  attributes, lists, tuples and dicts. `get_state_dict` walks that structure and names every
  tensor by its path (`layers.0.weight`), exactly as tinygrad (and PyTorch) name them;
- `load_state_dict` is the reverse walk: it checks every name and shape first and reports *all*
  missing and mis-shaped keys in one error, then assigns the values (keys the model lacks are
  skipped, as tinygrad skips them);
- the safetensors file format is simple enough to write by hand: 8 bytes (little-endian u64) with
  the header's length, a JSON header `{name: {dtype, shape, data_offsets}}`, then the raw bytes.
  Loading it runs `json.loads` and `np.frombuffer` — nothing is unpickled, so a file from a
  stranger cannot run code on your machine;
- a PyTorch checkpoint (`torch.save`) is a zip of raw storages plus a pickle that says how to
  rebuild each tensor. A pickle can name any function to call, so `torch_load` unpickles with an
  allow-list (the dozen names a tensor checkpoint uses) and refuses everything else;
- `tar_extract` reads a tar archive and refuses any member whose path or link would land
  outside the folder it is extracted to (`../x`, `/etc/x`, a symlink to `../../x`).

Builds on: tensor/ (Tensor, assign, realize). Used by: training scripts and notebooks.

>>> from tinyteach import Tensor
>>> class Net:
...     def __init__(self):
...         self.layers = [Tensor.zeros(2, 3), {"scale": Tensor.ones(3)}]
>>> list(get_state_dict(Net()))
['layers.0', 'layers.1.scale']
"""
from __future__ import annotations

import functools
import io
import json
import os
import pickle
import posixpath
import struct
import tarfile
import zipfile
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from tinyteach.dtype import BFLOAT16_WORDS, DType, dtypes, to_bfloat16_bits
from tinyteach.engine.schedule import is_contiguous_buffer
from tinyteach.helpers import GlobalCounters, Timing, prod
from tinyteach.settings import DEBUG
from tinyteach.tensor import Tensor
from tinyteach.tensor.multi import MultiUOp

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


def load_state_dict(model: Any, state_dict: Mapping[str, Tensor], strict: bool = True,
                    verbose: bool = False, consume: bool = False,
                    realize: bool = True) -> list[Tensor]:
    """Assign `state_dict`'s values to the model's tensors with the same names; returns them.

    With strict=True every model key must be present; keys the model lacks (a PyTorch
    checkpoint's `num_batches_tracked`, say) are skipped, as in tinygrad (DEBUG>=1 names them).
    A shape mismatch is always an error (a single value may be () or (1,)). All problems are
    reported together, before anything changes. tinygrad's keywords: `realize=False` leaves
    the loads lazy (the next realize of the model's tensors copies them), `consume=True`
    deletes each loaded key from `state_dict` (to free its tensor early), `verbose=True`
    prints tinygrad's "loaded weights in ... ms, ... GB loaded at ... GB/s"."""
    # tinygrad: verbose=True by default; here it is off, so a notebook's output stays the same
    # from run to run (the line is a wall-clock time)
    targets = get_state_dict(model)
    problems = _state_dict_problems(targets, state_dict, strict)
    if problems:
        raise StateDictError("load_state_dict: " + "; ".join(problems))
    if consume and not isinstance(state_dict, MutableMapping):
        raise TypeError(f"load_state_dict(consume=True) deletes the loaded keys from the state "
                        f"dict, so it must be a dict, not {type(state_dict).__name__}")
    _warn_about_unused_keys(targets, state_dict)
    start_bytes = GlobalCounters.mem_used
    with Timing("loaded weights in ", lambda nanoseconds: _loaded_rate(start_bytes, nanoseconds),
                enabled=verbose):
        loaded = _assign_each(targets, state_dict)
        if realize and loaded:
            Tensor.realize(*loaded)
    if consume:
        for name in targets:
            cast(MutableMapping, state_dict).pop(name, None)
    return loaded


def _assign_each(targets: Mapping[str, Tensor], state_dict: Mapping[str, Tensor]) -> list[Tensor]:
    """Each model tensor that the state dict names, assigned (lazily) its value there."""
    loaded = []
    for name, target in targets.items():
        if name not in state_dict:
            if DEBUG.value >= 1:
                print(f"WARNING: not loading {name}")  # tinygrad's words
            continue
        value = state_dict[name]
        if value.shape != target.shape:  # a single value: () and (1,) are the same count
            value = value.reshape(target.shape)
        if isinstance(target.device, tuple):
            loaded.append(target.replace(_sharded_like(target, value.cast(target.dtype))))
            continue
        value = value.to(target.device).cast(target.dtype)
        loaded.append(_own_buffer(target).assign(value))
    return loaded


def _sharded_like(target: Tensor, value: Tensor) -> Tensor:
    """A value for a sharded model tensor, as tinygrad loads it: a sharded value keeps its own
    sharding; one on a single device is sharded over the target's devices on its axis."""
    if isinstance(value.device, tuple):
        return value
    sharded = cast(MultiUOp, target.uop)
    return value.shard(sharded.devices, sharded.axis)


def _warn_about_unused_keys(targets: Mapping[str, Tensor], given: Mapping[str, Tensor]) -> None:
    if DEBUG.value >= 1 and len(given) > len(targets):  # tinygrad's test and words
        print("WARNING: unused weights in state_dict", sorted(given.keys() - targets.keys()))


def _loaded_rate(start_bytes: int, nanoseconds: int) -> str:
    """The end of tinygrad's line: the memory allocated while loading, and its rate."""
    loaded_bytes = GlobalCounters.mem_used - start_bytes
    return f", {loaded_bytes / 1e9:.2f} GB loaded at {loaded_bytes / max(nanoseconds, 1):.2f} GB/s"


class StateDictError(KeyError, ValueError):
    """Keys of a state dict that do not fit the model: a KeyError (missing names) that is also
    a ValueError (tinygrad's class for a shape mismatch)."""


def _own_buffer(target: Tensor) -> Tensor:
    """Give a not-yet-realized tensor memory of its own, so that assign() copies into it:
    otherwise it would share the state dict's buffer, and training the model would change it."""
    if not is_contiguous_buffer(target.uop):
        target.assign(Tensor.empty(*target.shape, dtype=target.dtype, device=target.device))
    return target


def _same_shape(model: tuple[int, ...], given: tuple[int, ...]) -> bool:
    """Equal shapes, or one value each: BatchNorm's num_batches_tracked is () in PyTorch and
    tinyteach, (1,) in tinygrad, and a checkpoint from either loads into the other."""
    return model == given or (prod(model) == 1 and prod(given) == 1)


def _state_dict_problems(targets: Mapping[str, Tensor], given: Mapping[str, Tensor],
                         strict: bool) -> list[str]:
    missing = [name for name in targets if name not in given]
    mis_shaped = [f"Shape mismatch in layer `{name}`: Expected shape {targets[name].shape}, "
                  f"but found {given[name].shape} in state dict."  # tinygrad's sentence
                  for name in targets
                  if name in given and not _same_shape(targets[name].shape, given[name].shape)]
    problems = []
    if strict and missing:
        problems.append(f"missing keys {missing}")
    if mis_shaped:
        problems.append("mis-shaped keys: " + " ".join(mis_shaped))
    return problems


# ---- the safetensors format ----

SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "I16": dtypes.int16,
    "U16": dtypes.uint16, "I32": dtypes.int32, "U32": dtypes.uint32, "I64": dtypes.int64,
    "U64": dtypes.uint64, "F16": dtypes.float16, "BF16": dtypes.bfloat16, "F32": dtypes.float32,
    "F64": dtypes.float64,
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
        values = tensor.numpy()  # (bfloat16: its float32 values, exactly; written as words)
        if tensor.dtype == dtypes.bfloat16:
            values = to_bfloat16_bits(values)
        data = np.ascontiguousarray(values).astype(tensor.dtype.np.newbyteorder("<"))
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


# ---- PyTorch checkpoints (torch.save's zip format), read without torch ----

class TorchLoadError(pickle.UnpicklingError):
    """A checkpoint that is not one torch_load reads, or one that asks to run code."""


# The storage classes torch.save names, and the numpy type of their elements. bfloat16 has no
# numpy type: it is read as uint16 words, which become a bfloat16 tensor (dtype.py).
TORCH_STORAGES: dict[str, str] = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2",
    "BFloat16Storage": "bfloat16", "LongStorage": "<i8", "IntStorage": "<i4",
    "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1", "BoolStorage": "?",
}
# The dtypes torch names directly (with an UntypedStorage of bytes: uint16, uint32, uint64).
TORCH_DTYPES: dict[str, str] = {
    "float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "bfloat16",
    "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "i1", "uint8": "u1",
    "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "bool": "?",
}


@dataclass(frozen=True)
class _StorageType:
    """What `torch.FloatStorage` (or `torch.float32`) unpickles to: the element type."""
    name: str
    element: str  # a numpy dtype string, "bfloat16", or "bytes" for UntypedStorage


def torch_load(path: str | os.PathLike[str], device: str | None = None) -> Any:
    """Read a checkpoint written by `torch.save` (a zip file: `data.pkl` + one file of raw
    bytes per storage) and return what was saved, with every tensor a tinyteach Tensor.

    A checkpoint is a pickle, and unpickling can call any function a file names. So, as
    PyTorch's `weights_only=True`, only the few names a tensor checkpoint needs are allowed
    (OrderedDict, torch's tensor rebuilders, storage types and dtypes); any other name raises
    TorchLoadError before it is imported, let alone called. bfloat16 stays bfloat16 (its
    words); complex and quantized tensors are refused."""
    path = str(path)
    if not zipfile.is_zipfile(path):
        raise TorchLoadError(f"torch_load: {path} is not a zip file; torch_load reads the zip "
                             f"format torch.save has written since PyTorch 1.6")
    with zipfile.ZipFile(path) as archive:
        pickle_name = _one_pickle(archive, path)
        prefix = pickle_name.removesuffix("data.pkl")
        order = _byte_order(archive, prefix)
        unpickler = _CheckpointUnpickler(io.BytesIO(archive.read(pickle_name)), archive, prefix,
                                         order, device)
        return unpickler.load()


def _one_pickle(archive: zipfile.ZipFile, path: str) -> str:
    pickles = [name for name in archive.namelist() if name.endswith("data.pkl")]
    if len(pickles) != 1:
        raise TorchLoadError(f"torch_load: {path} should hold one <name>/data.pkl, found "
                             f"{pickles or 'none'}")
    return pickles[0]


def _byte_order(archive: zipfile.ZipFile, prefix: str) -> str:
    """'<' or '>': torch.save writes `byteorder` ('little' or 'big'); old files are little."""
    name = f"{prefix}byteorder"
    if name not in archive.namelist():
        return "<"
    return ">" if archive.read(name).strip() == b"big" else "<"


class _CheckpointUnpickler(pickle.Unpickler):
    """pickle.Unpickler with an allow-list: `find_class` is asked for every global the pickle
    names, and answers only from ALLOWED; `persistent_load` reads a storage from the zip."""

    def __init__(self, file: io.BytesIO, archive: zipfile.ZipFile, prefix: str, order: str,
                 device: str | None):
        super().__init__(file)
        self.archive, self.prefix, self.order, self.device = archive, prefix, order, device
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_CALLS:
            return _bind(_ALLOWED_CALLS[(module, name)], self.device)
        if module == "torch" and name in TORCH_STORAGES:
            return _StorageType(name, TORCH_STORAGES[name])
        if module == "torch" and name in TORCH_DTYPES:
            return _StorageType(name, TORCH_DTYPES[name])
        if (module, name) == ("torch.storage", "UntypedStorage"):
            return _StorageType(name, "bytes")
        raise TorchLoadError(
            f"torch_load: the checkpoint asks for {module}.{name}, which is not on the allow-list "
            f"of what a tensor checkpoint needs, so it was refused (nothing was imported or run). "
            f"A checkpoint is a pickle, and a pickle can run code; load it only if you trust "
            f"its source, and with PyTorch itself.")

    def persistent_load(self, pid: Any) -> np.ndarray:
        """('storage', type, key, location, count) -> the storage's elements, read once."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise TorchLoadError(f"torch_load: unexpected persistent id {pid!r}")
        _, storage_type, key, _location, count = pid
        if key not in self.storages:
            self.storages[key] = self._read_storage(storage_type, str(key), int(count))
        return self.storages[key]

    def _read_storage(self, storage_type: _StorageType, key: str, count: int) -> np.ndarray:
        name = f"{self.prefix}data/{key}"
        if name not in self.archive.namelist():
            raise TorchLoadError(f"torch_load: storage {name} is missing from the zip file")
        raw = self.archive.read(name)
        element = {"bytes": "u1", "bfloat16": "u2"}.get(storage_type.element,
                                                        storage_type.element)
        dtype = np.dtype(element)
        if dtype.itemsize > 1:
            dtype = dtype.newbyteorder(">" if self.order == ">" else "<")
        if len(raw) < count * dtype.itemsize:
            raise TorchLoadError(f"torch_load: storage {name} holds {len(raw)} bytes, fewer "
                                 f"than {count} elements of {storage_type.name}")
        values = np.frombuffer(raw, dtype=dtype, count=count).astype(dtype.newbyteorder("="))
        return _as_bfloat16(values) if storage_type.element == "bfloat16" else values


def _as_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns read as uint16, tagged as bfloat16 words (dtype.BFLOAT16_WORDS)."""
    return bits.astype(BFLOAT16_WORDS)


def _elements(storage: np.ndarray, offset: int, size: tuple[int, ...],
              stride: tuple[int, ...]) -> np.ndarray:
    """The tensor torch describes as (storage, offset, size, stride), copied out."""
    if storage.size and offset + sum((s - 1) * st for s, st in zip(size, stride)) >= storage.size:
        raise TorchLoadError(f"torch_load: a tensor of size {size} and stride {stride} at "
                             f"offset {offset} reads past its storage of {storage.size}")
    if prod(size) == 0:
        return np.zeros(size, dtype=storage.dtype)
    strides = tuple(st * storage.itemsize for st in stride)
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size, strides=strides)
    return np.array(view)


def _rebuild_tensor_v2(storage: np.ndarray, offset: int, size: tuple[int, ...],
                       stride: tuple[int, ...], requires_grad: bool = False,
                       backward_hooks: Any = None, metadata: Any = None, *,
                       device: str | None = None) -> Tensor:
    return Tensor(_elements(storage, offset, tuple(size), tuple(stride)), device=device)


def _rebuild_tensor_v3(storage: np.ndarray, offset: int, size: tuple[int, ...],
                       stride: tuple[int, ...], requires_grad: bool,
                       backward_hooks: Any, dtype: _StorageType, metadata: Any = None, *,
                       device: str | None = None) -> Tensor:
    """An UntypedStorage of bytes, read as `dtype` (how torch saves uint16, uint32, uint64)."""
    if not isinstance(dtype, _StorageType) or dtype.element == "bytes":
        raise TorchLoadError(f"torch_load: unsupported tensor dtype {dtype!r}")
    element = "u2" if dtype.element == "bfloat16" else dtype.element
    typed = storage.view(np.dtype(element))
    values = _elements(typed, offset, tuple(size), tuple(stride))
    values = _as_bfloat16(values) if dtype.element == "bfloat16" else values
    return Tensor(values, device=device)


def _rebuild_parameter(data: Tensor, requires_grad: bool, backward_hooks: Any,
                       state: Any = None, *, device: str | None = None) -> Tensor:
    """An nn.Parameter is its tensor (tinyteach has no Parameter class)."""
    return data


def _encode(text: str, encoding: str = "latin1") -> bytes:
    """How protocol-2 pickles store bytes objects: `_codecs.encode(text, 'latin1')`."""
    if encoding not in ("latin1", "latin-1"):
        raise TorchLoadError(f"torch_load: unexpected byte encoding {encoding!r}")
    return text.encode("latin1")


_ALLOWED_CALLS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("_codecs", "encode"): _encode,
}


def _bind(function: Any, device: str | None) -> Any:
    """The rebuilders take the target device; the others are returned as they are."""
    if function in (_rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter):
        return functools.partial(function, device=device)
    return function


# ---- tar archives ----

class UnsafeArchiveError(ValueError):
    """A tar member whose path (or link) would land outside the folder it is extracted to."""


def tar_extract(path: str | os.PathLike[str],
                target: str | os.PathLike[str] | None = None) -> dict[str, Tensor]:
    """Every regular file in the tar archive at `path`, as {name: uint8 Tensor of its bytes}
    (tinygrad's tar_extract). With `target`, the files are also written under that folder.

    Each member is checked first, and the whole archive is refused, naming the member, if any
    path is absolute or climbs out with '..', if a link points outside the archive, or if a
    member is a device or a pipe: a tar file from a stranger cannot write anywhere else."""
    with tarfile.open(path) as archive:
        members = archive.getmembers()
        for member in members:
            _check_member(member, str(path))
        files = {m.name: _member_bytes(archive, m) for m in members if m.isfile()}
        if target is not None:
            Path(target).mkdir(parents=True, exist_ok=True)
            archive.extractall(target, members=members, filter="data")  # Python checks again
    return {name: Tensor(np.frombuffer(data, dtype=np.uint8).copy(), dtype=dtypes.uint8)
            for name, data in files.items()}


def _check_member(member: tarfile.TarInfo, path: str) -> None:
    where = f"tar_extract: {path}: member {member.name!r}"
    if not _stays_inside(member.name):
        raise UnsafeArchiveError(f"{where} has an absolute path or climbs out with '..'; "
                                 f"refusing the whole archive")
    if member.issym() or member.islnk():
        # a symlink is relative to its own folder; a hard link names a path in the archive
        base = posixpath.dirname(member.name) if member.issym() else ""
        if not _stays_inside(posixpath.join(base, member.linkname)):
            raise UnsafeArchiveError(f"{where} is a link to {member.linkname!r}, outside the "
                                     f"archive's folder; refusing the whole archive")
    elif not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(f"{where} is a device, pipe or other special file; refusing")


def _stays_inside(name: str) -> bool:
    """A relative path that, once '.' and '..' are resolved, stays below its folder."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return False
    normal = posixpath.normpath(name.replace("\\", "/"))
    return normal != ".." and not normal.startswith("../")


def _member_bytes(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    stream = archive.extractfile(member)
    assert stream is not None  # a regular file always has one
    return stream.read()

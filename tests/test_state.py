"""Chapter 11c: state dicts, load_state_dict's errors, and the safetensors file format."""
from __future__ import annotations

import json
import struct
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from tinyteach import Tensor, dtypes, nn
from tinyteach.nn.state import (
    SafetensorsError,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_save,
)


class Block:
    def __init__(self) -> None:
        self.conv = nn.Conv2d(2, 3, 3)
        self.norm = nn.BatchNorm2d(3)


class Net:
    def __init__(self) -> None:
        self.blocks = [Block(), Block()]
        self.head = {"fc": nn.Linear(4, 2)}
        self.name = "not a tensor"
        self.scale = 2.0


def test_state_dict_names_follow_tinygrad() -> None:
    names = list(get_state_dict(Net()))
    assert names[:7] == ["blocks.0.conv.weight", "blocks.0.conv.bias", "blocks.0.norm.weight",
                         "blocks.0.norm.bias", "blocks.0.norm.running_mean",
                         "blocks.0.norm.running_var", "blocks.0.norm.num_batches_tracked"]
    assert names[-2:] == ["head.fc.weight", "head.fc.bias"]
    assert len(names) == 16


def test_state_dict_matches_torch_names_for_the_same_model() -> None:
    torch = pytest.importorskip("torch")
    theirs = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2),
                                 torch.nn.Linear(3, 4))
    ours = [nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Linear(3, 4)]
    assert list(get_state_dict(ours)) == list(theirs.state_dict())
    for name, tensor in get_state_dict(ours).items():
        assert tensor.shape == tuple(theirs.state_dict()[name].shape), name


def test_get_parameters_walks_tuples_namedtuples_and_skips_repeats() -> None:
    shared = Tensor.ones(2)
    Pair = namedtuple("Pair", ["left", "right"])
    model = {"pair": Pair(shared, Tensor.zeros(3)), "again": (shared,)}
    parameters = get_parameters(model)
    assert len(parameters) == 2 and parameters[0] is shared
    assert list(get_state_dict(model)) == ["pair.left", "pair.right", "again.0"]


def test_get_state_dict_survives_a_cycle() -> None:
    model = Net()
    model.blocks[0].parent = model  # type: ignore[attr-defined]
    assert len(get_state_dict(model)) == 16


def test_load_state_dict_copies_values() -> None:
    source, target = Net(), Net()
    load_state_dict(target, get_state_dict(source))
    for name, tensor in get_state_dict(target).items():
        np.testing.assert_array_equal(tensor.numpy(), get_state_dict(source)[name].numpy(),
                                      err_msg=name)


def test_loaded_model_does_not_share_memory_with_the_state_dict() -> None:
    source, target = nn.Linear(2, 2), nn.Linear(2, 2)
    source.weight.realize()
    load_state_dict(target, get_state_dict(source))
    before = source.weight.numpy()
    target.weight.assign(target.weight + 1).realize()
    np.testing.assert_array_equal(source.weight.numpy(), before)
    np.testing.assert_array_equal(target.weight.numpy(), before + 1)


def test_load_state_dict_reports_every_problem() -> None:
    model = nn.Linear(3, 2)
    given = {"weight": Tensor.zeros(3, 2), "extra": Tensor.zeros(1)}
    with pytest.raises(KeyError) as error:
        load_state_dict(model, given)
    message = str(error.value)
    assert "missing keys ['bias']" in message
    assert "unexpected keys ['extra']" in message
    assert "weight (model (2, 3), state dict (3, 2))" in message
    before = model.weight.numpy()
    with pytest.raises(KeyError, match="mis-shaped"):
        load_state_dict(model, {"weight": Tensor.zeros(3, 2)}, strict=False)
    np.testing.assert_array_equal(model.weight.numpy(), before)  # nothing changed


def test_load_state_dict_non_strict_loads_what_is_there() -> None:
    model = nn.Linear(3, 2)
    bias_before = model.bias.numpy() if model.bias is not None else None
    load_state_dict(model, {"weight": Tensor.ones(2, 3), "other": Tensor.ones(1)}, strict=False)
    np.testing.assert_array_equal(model.weight.numpy(), np.ones((2, 3)))
    assert model.bias is not None and bias_before is not None
    np.testing.assert_array_equal(model.bias.numpy(), bias_before)


ALL_DTYPES = [dtypes.float16, dtypes.float32, dtypes.float64, dtypes.int8, dtypes.int32,
              dtypes.int64, dtypes.uint8, dtypes.uint32, dtypes.uint64, dtypes.bool]


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {}
    for dtype in ALL_DTYPES:
        values = rng.uniform(-100, 100, size=(2, 3))
        arrays[dtype.name] = (values > 0) if dtype == dtypes.bool else values.astype(dtype.np)
    arrays["scalar"] = np.array(3.5, dtype=np.float32)
    arrays["empty"] = np.zeros((0, 4), dtype=np.float32)
    return arrays


def test_safe_save_and_load_round_trip(tmp_path: Path) -> None:
    arrays = sample_tensors()
    path = tmp_path / "model.safetensors"
    safe_save({name: Tensor(a) for name, a in arrays.items()}, path, metadata={"epoch": "3"})
    loaded = safe_load(path)
    assert list(loaded) == list(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == dtypes.from_np(array.dtype), name
        np.testing.assert_array_equal(loaded[name].numpy(), array, err_msg=name)
    header_length = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert header_length % 8 == 0
    assert json.loads(path.read_bytes()[8:8 + header_length])["__metadata__"] == {"epoch": "3"}


def test_model_round_trip_through_a_file(tmp_path: Path) -> None:
    source, target = Net(), Net()
    safe_save(get_state_dict(source), tmp_path / "net.safetensors")
    load_state_dict(target, safe_load(tmp_path / "net.safetensors"))
    x = Tensor(np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32))
    np.testing.assert_allclose(target.blocks[1].conv(x).numpy(), source.blocks[1].conv(x).numpy())


def test_interoperates_with_the_safetensors_package(tmp_path: Path) -> None:
    numpy_io = pytest.importorskip("safetensors.numpy")
    arrays = sample_tensors()
    ours = tmp_path / "ours.safetensors"
    safe_save({name: Tensor(a) for name, a in arrays.items()}, ours)
    for name, array in numpy_io.load_file(str(ours)).items():
        np.testing.assert_array_equal(array, arrays[name], err_msg=name)
    theirs = tmp_path / "theirs.safetensors"
    numpy_io.save_file(arrays, str(theirs))
    for name, tensor in safe_load(theirs).items():
        np.testing.assert_array_equal(tensor.numpy(), arrays[name], err_msg=name)


def write_file(path: Path, header: object, data: bytes = b"") -> Path:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def test_truncated_and_corrupt_files_give_clear_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    safe_save({"w": Tensor(np.arange(6, dtype=np.float32))}, good)
    content = good.read_bytes()
    cases = {
        "short": (content[:5], "too short"),
        "cut_header": (content[:20], "truncated or corrupt"),
        "cut_data": (content[:-4], "truncated"),
        "not_json": (struct.pack("<Q", 4) + b"\xff{[}", "not valid JSON"),
        "pickle": (b"\x80\x04\x95" + b"\x00" * 20, "truncated or corrupt"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(data)
        with pytest.raises(SafetensorsError, match=message):
            safe_load(path)


def test_inconsistent_headers_are_rejected(tmp_path: Path) -> None:
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    bad_headers = {
        "unsupported dtype": {"w": {**entry, "dtype": "BF16"}},
        "needs 8": {"w": {**entry, "data_offsets": [0, 4]}},
        "lists of ints": {"w": {**entry, "shape": [-2]}},
        "needs 'dtype'": {"w": {"shape": [2]}},
        "JSON object": [1, 2],
    }
    for message, header in bad_headers.items():
        with pytest.raises(SafetensorsError, match=message):
            safe_load(write_file(tmp_path / "bad.safetensors", header, b"\x00" * 8))

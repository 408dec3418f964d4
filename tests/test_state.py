"""Chapter 11c: state dicts, load_state_dict's errors, and the safetensors file format."""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import tarfile
import zipfile
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tinyteach import Tensor, dtypes, nn
from tinyteach import dtype as dtype_module
from tinyteach.nn.state import (
    SafetensorsError,
    TorchLoadError,
    UnsafeArchiveError,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_save,
    tar_extract,
    torch_load,
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
    assert "extra" not in message  # a key the model lacks is skipped, as tinygrad skips it
    assert "Shape mismatch in layer `weight`: Expected shape (2, 3), but found (3, 2)" in message
    assert isinstance(error.value, ValueError)  # tinygrad's class for a shape mismatch
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


def test_load_state_dict_skips_keys_the_model_lacks() -> None:
    """A PyTorch BatchNorm checkpoint holds running statistics and num_batches_tracked; a
    BatchNorm without running statistics takes its weight and bias and skips the rest."""
    torch = pytest.importorskip("torch")
    source = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        source.weight.copy_(torch.tensor([1.5, -2.0, 0.25]))
        source.bias.copy_(torch.tensor([0.5, 0.0, -1.0]))
    given = {name: Tensor(value.numpy()) for name, value in source.state_dict().items()}
    assert "num_batches_tracked" in given
    model = nn.BatchNorm(3, track_running_stats=False)
    load_state_dict(model, given)
    np.testing.assert_array_equal(model.weight.numpy(), source.weight.detach().numpy())
    np.testing.assert_array_equal(model.bias.numpy(), source.bias.detach().numpy())


def test_load_state_dict_into_a_sharded_model_shards_the_values() -> None:
    devices = ("CPU", "CPU:1")
    model = nn.Linear(3, 4)
    model.weight.shard_(devices, 0)
    assert model.bias is not None
    model.bias.shard_(devices, None)
    weight = np.arange(12, dtype=np.float32).reshape(4, 3)
    load_state_dict(model, {"weight": Tensor(weight), "bias": Tensor([1.0, 2.0, 3.0, 4.0])})
    assert model.weight.device == devices and model.weight.uop.axis == 0
    assert model.bias.device == devices and model.bias.uop.axis is None
    np.testing.assert_array_equal(model.weight.to("CPU:1").numpy(), weight)
    x = np.array([[1.0, 0.0, -1.0]], dtype=np.float32)
    np.testing.assert_allclose(model(Tensor(x).shard(devices)).numpy(),
                               x @ weight.T + [1.0, 2.0, 3.0, 4.0])


ALL_DTYPES = sorted(set(dtype_module.ALL_DTYPES.values()), key=lambda d: d.name)


def test_every_dtype_round_trips() -> None:
    """The round trips below cover every dtype tinyteach has (dtype.ALL_DTYPES), each at its
    extremes, and safetensors has a name for each."""
    assert {d.name for d in ALL_DTYPES} >= {"float16", "int16", "uint16", "uint64", "bool"}
    assert all(d in nn.state._NAME_OF_DTYPE for d in ALL_DTYPES)


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {}
    for dtype in ALL_DTYPES:
        if dtype == dtypes.bfloat16:
            continue  # no numpy type to compare with: tests/test_bfloat16.py round-trips it
        if dtype == dtypes.bool:
            arrays[dtype.name] = rng.uniform(size=(2, 3)) > 0.5
        elif dtypes.is_float(dtype):
            values = rng.uniform(-100, 100, size=(2, 3)).astype(dtype.np)
            values.flat[:3] = [np.finfo(dtype.np).max, np.finfo(dtype.np).tiny, -0.0]
            arrays[dtype.name] = values
        else:
            info = np.iinfo(dtype.np)
            values = rng.integers(info.min, info.max, size=(2, 3), dtype=dtype.np,
                                  endpoint=True)
            values.flat[:2] = [info.min, info.max]
            arrays[dtype.name] = values
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
        "unsupported dtype": {"w": {**entry, "dtype": "F8_E4M3"}},
        "needs 8": {"w": {**entry, "data_offsets": [0, 4]}},
        "lists of ints": {"w": {**entry, "shape": [-2]}},
        "needs 'dtype'": {"w": {"shape": [2]}},
        "JSON object": [1, 2],
    }
    for message, header in bad_headers.items():
        with pytest.raises(SafetensorsError, match=message):
            safe_load(write_file(tmp_path / "bad.safetensors", header, b"\x00" * 8))


# ---- torch_load: PyTorch's zip checkpoints, without running what a pickle asks for ----

def test_torch_load_reads_a_real_state_dict(tmp_path: Path) -> None:
    """torch.save of a real model's state_dict (trained BatchNorm included), plus the storage
    tricks torch uses: a transposed view, a slice of a larger storage, two tensors sharing one
    storage, every dtype torch and tinyteach share, bfloat16 and an empty tensor."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3),
                                torch.nn.Flatten(), torch.nn.Linear(12, 4))
    model.train()
    model(torch.randn(5, 2, 4, 4))
    state = model.state_dict()
    base = torch.arange(12, dtype=torch.float32)
    extra = {"transposed": torch.arange(6.0).reshape(2, 3).T, "slice": base[3:9],
             "shares_storage": base.reshape(3, 4), "empty": torch.zeros(0, 3),
             "bfloat16": torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16)}
    for name in ["float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                 "uint32", "uint64", "bool"]:
        extra[name] = (torch.arange(-3, 3) * 7).to(getattr(torch, name))
    path = tmp_path / "model.pt"
    torch.save({"model": state, "extra": extra, "epoch": 7, "tag": b"v1"}, path)
    loaded = torch_load(path)
    assert loaded["epoch"] == 7 and loaded["tag"] == b"v1"
    for group in ("model", "extra"):
        expected = {"model": state, "extra": extra}[group]
        assert list(loaded[group]) == list(expected)
        for name, tensor in expected.items():
            ours = loaded[group][name]
            assert isinstance(ours, Tensor) and ours.shape == tuple(tensor.shape), name
            theirs = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=name)
    assert loaded["model"]["1.num_batches_tracked"].item() == 1


def test_torch_load_into_a_tinyteach_model(tmp_path: Path) -> None:
    """A torch BatchNorm's state dict, num_batches_tracked included (int64, shape ()), loads
    into nn.BatchNorm2d; so does tinygrad's (1,)-shaped counter; eval outputs then agree."""
    torch = pytest.importorskip("torch")
    theirs = torch.nn.BatchNorm2d(3)
    theirs.train()
    for seed in range(3):
        theirs(torch.randn(4, 3, 2, 2, generator=torch.Generator().manual_seed(seed)))
    torch.save(theirs.state_dict(), tmp_path / "bn.pt")
    ours = nn.BatchNorm2d(3)
    load_state_dict(ours, torch_load(tmp_path / "bn.pt"))
    assert ours.num_batches_tracked.item() == 3
    theirs.eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                               atol=1e-5)
    tinygrad_style = dict(get_state_dict(ours), num_batches_tracked=Tensor([5]))
    load_state_dict(ours, tinygrad_style)
    assert ours.num_batches_tracked.item() == 5
    with pytest.raises(KeyError, match="mis-shaped"):
        load_state_dict(ours, dict(tinygrad_style, num_batches_tracked=Tensor([1, 2])))


class WouldRunACommand:
    """What an attacker pickles: unpickling calls os.system(command)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


class WouldWriteAFile:
    """Unpickling calls open(path, 'w'), which creates the file."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def zip_checkpoint(path: Path, payload: bytes) -> Path:
    """A file laid out as torch.save writes it, with `payload` as its data.pkl."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return path


@pytest.mark.parametrize("make", ["command", "file", "torch.save"])
def test_torch_load_refuses_a_pickle_that_would_run_code(tmp_path: Path, make: str) -> None:
    """A checkpoint whose pickle would call os.system (creating a file) or open() (creating
    another) is refused with a clear error naming the call; neither file appears."""
    planted = tmp_path / "planted"
    command = f"touch {planted}"
    if make == "torch.save":
        torch = pytest.importorskip("torch")
        path = tmp_path / "evil.pt"
        torch.save({"weight": torch.ones(2), "payload": WouldRunACommand(command)}, path)
    else:
        evil = WouldRunACommand(command) if make == "command" else WouldWriteAFile(str(planted))
        path = zip_checkpoint(tmp_path / "evil.pt", pickle.dumps({"x": evil}, protocol=2))
    with pytest.raises(TorchLoadError, match="not on the allow-list") as error:
        torch_load(path)
    assert ("system" in str(error.value)) or ("open" in str(error.value))
    assert "refused" in str(error.value)
    assert not planted.exists()
    pickle.loads(pickle.dumps(WouldWriteAFile(str(planted))))  # the same pickle, unchecked:
    assert planted.exists()  # it does write the file, so the check above can fail


def test_torch_load_refuses_other_files_and_broken_checkpoints(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pt"
    plain.write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(TorchLoadError, match="not a zip file"):
        torch_load(plain)
    empty = tmp_path / "empty.pt"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("archive/version", "3")
    with pytest.raises(TorchLoadError, match="data.pkl"):
        torch_load(empty)
    torch = pytest.importorskip("torch")
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(4)}, good)
    broken = tmp_path / "broken.pt"
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(broken, "w") as target:
        for name in source.namelist():
            data = source.read(name)
            target.writestr(name, data[:8] if name.endswith("data/0") else data)
    with pytest.raises(TorchLoadError, match="fewer than 4 elements"):
        torch_load(broken)


# ---- tar_extract: every file of a tar archive, and nothing outside its folder ----

def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def file_member(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def link_member(name: str, target: str, hard: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info


def test_tar_extract_returns_every_file_and_writes_them_inside_target(tmp_path: Path) -> None:
    files = {"a/weights.bin": bytes(range(256)) * 3, "readme.txt": b"hello", "empty": b"",
             "very/" * 30 + "long_name.txt": b"pax"}
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (file_member(name), data) for name, data in files.items()]
    members.append((link_member("a/link", "weights.bin"), None))  # inside: allowed
    path = make_tar(tmp_path / "ok.tar", members)
    loaded = tar_extract(path, tmp_path / "out")
    assert sorted(loaded) == sorted(files)
    for name, data in files.items():
        assert loaded[name].dtype == dtypes.uint8
        assert bytes(loaded[name].numpy().tobytes()) == data
        assert (tmp_path / "out" / name).read_bytes() == data
    assert (tmp_path / "out" / "a" / "link").read_bytes() == files["a/weights.bin"]


@pytest.mark.parametrize("member, reason", [
    (("../escaped.txt", None), "climbs out"),
    (("a/../../escaped.txt", None), "climbs out"),
    (("/tmp/absolute.txt", None), "absolute"),
    (("evil_link", "../../outside"), "link to"),
    (("evil_link", "/etc/passwd"), "link to"),
    (("hard_link", "../outside"), "link to"),
])
def test_tar_extract_refuses_paths_that_escape(tmp_path: Path, member: tuple[str, str | None],
                                               reason: str) -> None:
    """The whole archive is refused, naming the member, and nothing at all is written."""
    name, link = member
    info = file_member(name) if link is None else link_member(name, link,
                                                              hard=name == "hard_link")
    path = make_tar(tmp_path / "evil.tar", [(file_member("fine.txt"), b"ok"),
                                            (info, b"bad" if link is None else None)])
    target = tmp_path / "deep" / "target"
    with pytest.raises(UnsafeArchiveError, match=reason) as error:
        tar_extract(path, target)
    assert repr(name) in str(error.value)
    assert not target.exists() and not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "deep" / "escaped.txt").exists()


def test_tar_extract_refuses_special_files(tmp_path: Path) -> None:
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    path = make_tar(tmp_path / "fifo.tar", [(fifo, None)])
    with pytest.raises(UnsafeArchiveError, match="special file"):
        tar_extract(path)

"""Issue 26, group 8: what tinygrad's documentation shows, run on tinyteach — tinygrad's device
names (`DEV=CL`), Python ints wrapping into an integer dtype, a tensor made from a file's
`pathlib.Path`, `load_state_dict`'s keyword arguments, dtypes printed by their short names, an
out-of-range tensor index giving 0, and `from_blob` of a torch tensor (`_from_torch_dtype`).
Where tinygrad's docs print a value, that value is the expected one here."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from helpers import PRINT_DEFAULT_DEVICE, python_with_env, skip_unless_supported

from tinyteach import Device, Tensor, dtypes, nn
from tinyteach.engine.schedule import is_contiguous_buffer
from tinyteach.settings import Context

# ---- tinygrad's device names: CL is OPENCL ----

DEFAULT = PRINT_DEFAULT_DEVICE
needs_opencl = pytest.mark.skipif(not Device.is_available("OPENCL"),
                                  reason="OPENCL is not available here")


@needs_opencl
@pytest.mark.parametrize("env", [{"DEV": "CL"}, {"DEV": "cl"}, {"CL": "1"}, {"GPU": "1"}])
def test_tinygrads_opencl_name_chooses_the_default_device(env):
    # env_vars.md's first example is `DEV=CL`; the tensor's device prints the canonical name
    result = python_with_env(DEFAULT, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["OPENCL", "OPENCL"]


def test_tinygrads_old_cpu_name_is_the_cpu():
    result = python_with_env(DEFAULT, DEV="CLANG")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CPU", "CPU"]


@needs_opencl
def test_cl_names_the_opencl_device():
    assert Device["CL"] is Device["OPENCL"] and Device["cl"] is Device["OPENCL"]
    assert Device.canonicalize("CL") == "OPENCL" and Device.canonicalize("CL:0") == "OPENCL"
    x = Tensor([1.0, 2.0], device="CL")
    assert x.device == "OPENCL"
    assert (x * 3).tolist() == [3.0, 6.0]
    assert Tensor([1.0], device="NUMPY").to("CL").device == "OPENCL"


def test_an_unknown_device_name_is_still_a_clear_error():
    with pytest.raises(ValueError, match="unknown device 'CLX'.*OPENCL.*CL"):
        Tensor([1.0], device="CLX")
    result = python_with_env(DEFAULT, DEV="CLX")
    assert result.returncode != 0 and "CLX" in result.stderr and "OPENCL" in result.stderr


def test_an_alias_cannot_be_registered_as_a_new_device():
    with pytest.raises(ValueError, match="CL is a built-in device"):
        Device.register("cl", lambda: Device["NUMPY"])


# ---- Python ints outside an integer dtype's range wrap, as tinygrad stores them ----

# (value, dtype, what tinygrad stores): the value modulo 2**bits, as C's cast to the unsigned
# type of as many bits (and numpy's cast of an int64 array) gives it
WRAPPED = [
    ([255], "int8", [-1]),
    ([256], "uint8", [0]),
    ([-1], "uint32", [4294967295]),
    ([-129, 128, 127], "int8", [127, -128, 127]),
    ([-1, 65536], "uint16", [65535, 0]),
    ([2**31, -2**31 - 1], "int32", [-2**31, 2**31 - 1]),
    ([2**63], "int64", [-2**63]),
    ([-1, 2**64 + 3], "uint64", [2**64 - 1, 3]),
    ([[1, 300], [-300, 2]], "uint8", [[1, 44], [212, 2]]),
    ([1.5, 300], "int8", [1, 44]),  # a float in the list converts as it does alone
]


def numpy_wrap(values: list, dtype: str) -> list:
    """numpy's own wrap: the ints as int64 words (Python's arbitrary-precision ints reduced modulo
    2**64 first), cast to the narrower type (an integer cast keeps the low bits)."""
    flat = np.array(values, dtype=object).reshape(-1)
    words = np.array([int(value) % 2**64 for value in flat], dtype=np.uint64)
    return words.astype(np.dtype(dtype)).reshape(np.shape(values)).tolist()


@pytest.mark.parametrize("values, dtype, expected", WRAPPED)
def test_out_of_range_python_ints_wrap(device, values, dtype, expected):
    skip_unless_supported(device, dtype)
    if not any(isinstance(value, float) for value in np.array(values, dtype=object).flat):
        assert numpy_wrap(values, dtype) == expected
    x = Tensor(values, dtype=dtype, device=device)
    assert x.dtype == dtypes.as_dtype(dtype) and x.device == device
    assert x.tolist() == expected
    assert (x + 0).tolist() == expected  # a kernel on the device reads the same words
    assert x.numpy().tolist() == expected


@pytest.mark.parametrize("dtype", ["int8", "uint8", "uint32", "int32"])
def test_a_list_wraps_as_a_constant_does(device, dtype):
    skip_unless_supported(device, dtype)
    for value in (-1, 255, 256, 2**32 + 5, -2**40):
        from_list = Tensor([value], dtype=dtype, device=device).tolist()[0]
        assert Tensor(value, dtype=dtype, device=device).tolist() == from_list
        assert Tensor.full((1,), value, dtype=dtype, device=device).tolist() == [from_list]


def test_an_int_list_without_a_dtype_wraps_into_the_default_int():
    x = Tensor([2**32 + 7, -2**31 - 1])  # tinygrad: dtypes.int32, so the low 32 bits
    assert x.dtype == dtypes.int32 and x.tolist() == [7, 2**31 - 1]


def test_wrapping_keeps_the_other_errors():
    with pytest.raises(ValueError):  # ragged lists stay an error
        Tensor([[1, 300], [2]], dtype="int8")
    assert Tensor([True, 300], dtype="bool").tolist() == [True, True]
    assert Tensor([255, 1], dtype="float32").tolist() == [255.0, 1.0]


# ---- Tensor(pathlib.Path(...)): a tensor of a file's bytes ----

FILE_BYTES = bytes([104, 101, 108, 108, 111, 0, 255, 1, 128])  # b"hello", then 0, 255, 1, 128


@pytest.fixture
def file_path(tmp_path) -> pathlib.Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(FILE_BYTES)
    return path


def test_a_path_gives_the_files_bytes_as_uint8(device, file_path):
    # tinygrad: a 1-D uint8 tensor as long as the file (on its DISK device; here on `device`)
    x = Tensor(file_path, device=device)
    assert x.dtype == dtypes.uint8 and x.shape == (len(FILE_BYTES),) and x.device == device
    assert x.tolist() == list(FILE_BYTES)
    assert (x[:5].cast("int32") + 1).tolist() == [105, 102, 109, 109, 112]


def test_a_path_lands_on_the_default_device(file_path):
    assert Tensor(file_path).device == Device.DEFAULT


def test_a_path_with_a_dtype_reads_the_bytes_as_it(file_path):
    for dtype in ("uint16", "int32", "float32"):
        x = Tensor(file_path, dtype=dtype, device="NUMPY")
        whole = len(FILE_BYTES) // np.dtype(dtype).itemsize  # a shorter tail is left out
        expected = np.frombuffer(FILE_BYTES[:whole * np.dtype(dtype).itemsize], dtype=dtype)
        assert x.dtype == dtypes.as_dtype(dtype) and x.shape == (whole,)
        np.testing.assert_array_equal(x.numpy(), expected)


def test_an_empty_file_is_an_empty_tensor(tmp_path):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    x = Tensor(path)
    assert x.shape == (0,) and x.dtype == dtypes.uint8 and x.tolist() == []


def test_a_path_replicated_over_devices(file_path):
    x = Tensor(file_path, device=("CPU", "CPU:1"))
    assert x.device == ("CPU", "CPU:1") and x.tolist() == list(FILE_BYTES)


def test_a_missing_file_is_named(tmp_path):
    missing = tmp_path / "no_such_file.bin"
    with pytest.raises(FileNotFoundError, match="no_such_file.bin"):
        Tensor(missing)
    with pytest.raises(IsADirectoryError, match="folder"):
        Tensor(tmp_path)


# ---- load_state_dict(model, state_dict, strict, verbose, consume, realize) ----

class Net:  # the docstring's example model
    def __init__(self) -> None:
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 6)


def state_of(seed: int) -> dict[str, Tensor]:
    rng = np.random.default_rng(seed)
    shapes = {"l1.weight": (5, 4), "l1.bias": (5,), "l2.weight": (6, 5), "l2.bias": (6,)}
    return {name: Tensor(rng.standard_normal(shape).astype(np.float32))
            for name, shape in shapes.items()}


def test_the_docstrings_example_loads_and_returns_the_tensors():
    net, state = Net(), state_of(0)
    expected = {name: value.numpy() for name, value in state.items()}
    loaded = nn.state.load_state_dict(net, state)
    assert loaded == [net.l1.weight, net.l1.bias, net.l2.weight, net.l2.bias]
    for name, value in nn.state.get_state_dict(net).items():
        np.testing.assert_array_equal(value.numpy(), expected[name])
    assert set(state) == set(expected)  # consume=False keeps the keys


def test_consume_deletes_the_loaded_keys():
    net, state = Net(), state_of(1)
    state["extra"] = Tensor([1.0])
    expected = state["l2.bias"].numpy()
    nn.state.load_state_dict(net, state, strict=False, consume=True)
    assert list(state) == ["extra"]  # what was not loaded stays
    np.testing.assert_array_equal(net.l2.bias.numpy(), expected)


def test_consume_needs_a_mutable_mapping():
    import types
    proxy = types.MappingProxyType(state_of(2))
    with pytest.raises(TypeError, match="consume=True.*must be a dict"):
        nn.state.load_state_dict(Net(), proxy, consume=True)
    nn.state.load_state_dict(Net(), proxy)  # without consume a read-only mapping is fine


def test_realize_false_leaves_the_loads_lazy():
    net, state = Net(), state_of(3)
    expected = state["l1.weight"].numpy()
    loaded = nn.state.load_state_dict(net, state, realize=False)
    assert not is_contiguous_buffer(net.l1.weight.uop)  # an assign waits for the next realize
    Tensor.realize(*loaded)
    assert is_contiguous_buffer(net.l1.weight.uop)
    np.testing.assert_array_equal(net.l1.weight.numpy(), expected)


def test_verbose_prints_tinygrads_line(capsys):
    nn.state.load_state_dict(Net(), state_of(4), verbose=True)
    printed = capsys.readouterr().out
    # tinygrad: Timing("loaded weights in ", ", {GB:.2f} GB loaded at {GB/s:.2f} GB/s")
    pattern = r"loaded weights in +\d+\.\d\d ms, \d+\.\d\d GB loaded at \d+\.\d\d GB/s\n"
    assert re.fullmatch(pattern, printed), printed
    nn.state.load_state_dict(Net(), state_of(4))
    assert capsys.readouterr().out == ""  # tinyteach's default is quiet (the docstring says why)


def test_debug_warns_about_what_is_not_loaded(capsys):
    state = state_of(5)
    del state["l2.bias"]
    state["a"], state["b"] = Tensor([1.0]), Tensor([2.0])
    with Context(DEBUG=1):
        nn.state.load_state_dict(Net(), state, strict=False)
    printed = capsys.readouterr().out
    assert "WARNING: unused weights in state_dict ['a', 'b']" in printed
    assert "WARNING: not loading l2.bias" in printed


# ---- dtypes print as tinygrad prints them: C's short names ----

# what tinygrad 0.14 prints for each dtype (repr and str alike)
TINYGRAD_PRINTS = {
    "bool": "dtypes.bool", "int8": "dtypes.char", "uint8": "dtypes.uchar",
    "int16": "dtypes.short", "uint16": "dtypes.ushort", "int32": "dtypes.int",
    "uint32": "dtypes.uint", "int64": "dtypes.long", "uint64": "dtypes.ulong",
    "float16": "dtypes.half", "bfloat16": "dtypes.bfloat16", "float32": "dtypes.float",
    "float64": "dtypes.double",
}


@pytest.mark.parametrize("name", sorted(TINYGRAD_PRINTS))
def test_a_dtype_prints_as_tinygrad_prints_it(name):
    dtype = getattr(dtypes, name)
    assert repr(dtype) == str(dtype) == f"{dtype}" == TINYGRAD_PRINTS[name]
    assert eval(repr(dtype), {"dtypes": dtypes}) is dtype  # the printed name is the dtype
    assert dtype.name == name  # the name itself is unchanged (numpy's and safetensors' word)


def test_tensors_print_their_dtype_as_tinygrad_does(capsys):
    # mnist.md's fourth block prints the shape and dtype of uint8 images and labels
    images, labels = Tensor.zeros(6, 1, 28, 28, dtype=dtypes.uint8), Tensor([1, 2], dtype="uint8")
    print(images.shape, images.dtype, labels.shape, labels.dtype)
    print(Tensor([1, 2, 3]).dtype, Tensor([1.0]).dtype, Tensor([1.0]).half().dtype)
    assert capsys.readouterr().out.splitlines() == [
        "(6, 1, 28, 28) dtypes.uchar (2,) dtypes.uchar", "dtypes.int dtypes.float dtypes.half"]
    assert "dtype=dtypes.float " in repr(Tensor([1.0]))


def test_a_vector_dtype_prints_as_tinygrad_does():
    assert repr(dtypes.float32.vec(4)) == "dtypes.float.vec(4)"
    assert repr(dtypes.uint8.vec(16)) == "dtypes.uchar.vec(16)"


# ---- an out-of-range tensor index gives 0 (Tensor.__getitem__'s docstring) ----

def test_the_docstrings_out_of_bounds_example(device):
    # tinygrad prints [0 0 3] for this example
    t = Tensor([1, 2, 3], device=device)
    np.testing.assert_array_equal(t[Tensor([4, 3, 2], device=device)].numpy(), [0, 0, 3])


def test_out_of_range_tensor_indices_give_0_in_every_position(device):
    # tinygrad 0.14's values: -4 and 5 are outside a 3-element axis, -1 and -3 inside it
    t = Tensor([1, 2, 3], device=device)
    np.testing.assert_array_equal(t[Tensor([-4, -1, 5, -3], device=device)].numpy(), [0, 3, 0, 1])
    m = Tensor.arange(12, device=device).reshape(3, 4)
    np.testing.assert_array_equal(m[Tensor([2, 5], device=device), Tensor([1, 2], device=device)]
                                  .numpy(), [9, 0])
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 0 with size 3"):
        m[[0, 3]]  # a list's values are on the host: checked, as PyTorch checks them


def test_an_out_of_range_python_int_index_still_raises():
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 3"):
        Tensor([1, 2, 3])[5]
    with pytest.raises(IndexError, match="out of bounds"):  # gather keeps PyTorch's check
        Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[0, 2], [1, 1]]))


# ---- runtime.md: a tensor from a torch tensor's memory, with _from_torch_dtype ----

TORCH_DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "uint16",
                "int32", "uint32", "int64", "uint64", "bool"]


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_from_torch_dtype_names_the_same_dtype(name):
    torch = pytest.importorskip("torch")
    from tinyteach.dtype import _from_torch_dtype, _to_torch_dtype
    assert _from_torch_dtype(getattr(torch, name)) is getattr(dtypes, name)
    assert _to_torch_dtype(getattr(dtypes, name)) == getattr(torch, name)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int64", "uint8", "bool"])
def test_runtime_md_from_blob_of_a_torch_tensor(device, name):
    torch = pytest.importorskip("torch")
    from tinyteach.dtype import _from_torch_dtype
    dtype = getattr(dtypes, name)
    skip_unless_supported(device, dtype)
    source = (torch.arange(12) % 5 * 3 - 4).reshape(3, 4).to(getattr(torch, name))
    tensor = Tensor.from_blob(source.data_ptr(), source.shape,
                              dtype=_from_torch_dtype(source.dtype), device=device)
    assert tensor.shape == (3, 4) and tensor.dtype is dtype and tensor.device == device
    assert tensor.tolist() == source.tolist()


def test_from_torch_dtype_refuses_what_has_no_dtype():
    torch = pytest.importorskip("torch")
    from tinyteach.dtype import _from_torch_dtype
    with pytest.raises(TypeError, match="torch.complex64 has no tinyteach dtype"):
        _from_torch_dtype(torch.complex64)

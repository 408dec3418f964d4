"""The bad-input catalogue: each mistake a student is likely to make raises an exception whose
message names the problem (the shapes, the axis, the devices), on every device, and nothing
crashes the interpreter or quietly returns a wrong number.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from helpers import default_device

from tinyteach import Device, Tensor, dtypes, nn
from tinyteach.device import CompileError
from tinyteach.ir.uop import Ops


@pytest.fixture(params=["NUMPY", "CPU"])
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The reference interpreter and the compiled C backend."""
    with default_device(request.param):
        yield request.param


def ones(*shape: int, device: str) -> Tensor:
    return Tensor(np.ones(shape, dtype=np.float32), device=device)


# ---- shapes ----

def test_broadcasting_incompatible_shapes(device):
    a, b = ones(2, 3, device=device), ones(4, 3, device=device)
    with pytest.raises(ValueError, match=r"broadcast.*\(2, 3\).*\(4, 3\)"):
        a + b
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 3\)"):
        (a > 0).where(a, b)


def test_reshape_to_a_different_size(device):
    a = ones(2, 3, device=device)
    with pytest.raises(ValueError, match=r"reshape \(2, 3\) \(6 elements\) to \(4, 2\)"):
        a.reshape(4, 2)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, -1\)"):
        a.reshape(4, -1)
    with pytest.raises(ValueError, match="only one -1"):
        a.reshape(-1, -1)


def test_matmul_inner_dimensions(device):
    with pytest.raises(ValueError, match=r"\(2, 3\) @ \(4, 5\).*3 != 4"):
        ones(2, 3, device=device) @ ones(4, 5, device=device)
    with pytest.raises(ValueError, match=r"\(3,\) @ \(4,\)"):
        ones(3, device=device).dot(ones(4, device=device))
    with pytest.raises(ValueError, match=r"\(2, 3\) @ \(4, 5\)"):
        ones(2, 3, device=device).linear(ones(4, 5, device=device))


@pytest.mark.parametrize("call", [
    lambda a: a.sum(2), lambda a: a.sum(-3), lambda a: a.max((0, 5)), lambda a: a.mean(2),
    lambda a: a.softmax(2), lambda a: a.log_softmax(-3), lambda a: a.transpose(0, 2),
    lambda a: a.squeeze(2), lambda a: a.unsqueeze(4), lambda a: Tensor.cat(a, a, dim=2),
    lambda a: a.flip(2), lambda a: a.argmax(2), lambda a: a.cumsum(2), lambda a: a.layernorm(2),
], ids=["sum", "sum_negative", "max", "mean", "softmax", "log_softmax", "transpose", "squeeze",
        "unsqueeze", "cat", "flip", "argmax", "cumsum", "layernorm"])
def test_axis_out_of_range(device, call):
    with pytest.raises(IndexError, match=r"axis -?\d+ is out of range.*dimensions"):
        call(ones(2, 3, device=device))


def test_cat_and_stack_shape_mismatch(device):
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 3\).*dim 1"):
        Tensor.cat(ones(2, 3, device=device), ones(4, 3, device=device), dim=1)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 3\)"):
        Tensor.stack(ones(2, 3, device=device), ones(4, 3, device=device))


def test_permute_that_is_not_a_permutation(device):
    a = ones(2, 3, 4, device=device)
    with pytest.raises(ValueError, match=r"\(0, 0, 1\) is not a permutation.*\(2, 3, 4\)"):
        a.permute(0, 0, 1)
    with pytest.raises(ValueError, match=r"\(1, 0\) is not a permutation"):
        a.permute(1, 0)
    with pytest.raises(IndexError, match="axis 3 is out of range"):
        a.permute(0, 1, 3)


def test_other_movement_mistakes(device):
    a = ones(2, 3, device=device)
    with pytest.raises(ValueError, match=r"expand shape \(2, 3\) to \(4, 3\)"):
        a.expand(4, 3)
    with pytest.raises(ValueError, match=r"shrink bounds.*\(2, 3\)"):
        a.shrink(((0, 3), (0, 3)))
    with pytest.raises(ValueError, match=r"split sizes \[1, 2\].*2"):
        a.split([1, 2])
    with pytest.raises(ValueError, match="negative size"):
        Tensor.ones(-1, 2, device=device)


def test_pad_with_the_wrong_length(device):
    a = ones(2, 3, device=device)
    with pytest.raises(ValueError, match=r"one \(before, after\) pair per axis \(2\)"):
        a.pad(((1, 1),))
    with pytest.raises(ValueError, match=r"flat padding \(1, 1, 1\)"):
        a.pad((1, 1, 1))
    with pytest.raises(ValueError, match=r"flat padding \(1, 1, 1, 1, 1, 1\)"):
        a.pad((1, 1, 1, 1, 1, 1))


# ---- values ----

def test_item_needs_one_element(device):
    with pytest.raises(ValueError, match=r"exactly one element.*\(2, 3\)"):
        ones(2, 3, device=device).item()
    assert ones(1, 1, device=device).item() == 1.0


def test_truth_value_and_len(device):
    with pytest.raises(TypeError, match="ambiguous"):
        bool(ones(2, device=device))
    with pytest.raises(TypeError, match="0-d"):
        len(Tensor(1.0, device=device))


def test_bad_data_and_dtypes(device):
    with pytest.raises(TypeError, match="unknown dtype 'complex64'"):
        Tensor([1], device=device, dtype="complex64")
    with pytest.raises(TypeError, match="cannot make a Tensor from str"):
        Tensor("abc", device=device)
    with pytest.raises(ValueError):
        Tensor([[1, 2], [3]], device=device)  # ragged


# ---- autograd ----

def test_backward_on_a_non_scalar(device):
    x = Tensor(np.ones((2, 3)), device=device, requires_grad=True)
    with pytest.raises(ValueError, match=r"scalar.*shape \(2, 3\).*gradient="):
        (x * 2).backward()
    with pytest.raises(ValueError, match=r"gradient shape \(4,\).*\(2, 3\)"):
        (x * 2).backward(Tensor(np.ones(4), device=device))


def test_backward_without_any_parameter(device):
    """tinygrad's rule: every float tensor backward reaches gets a gradient, unless it is a
    constant or requires_grad=False; when none is left, the error says what is needed."""
    data = Tensor([1.0, 2.0, 3.0], device=device, requires_grad=False)
    with pytest.raises(RuntimeError, match="nothing in this graph can have a gradient"):
        data.sum().backward()


def test_requires_grad_needs_a_float_tensor(device):
    with pytest.raises(TypeError, match=r"only float tensors.*dtypes\.int\b"):
        Tensor([1, 2], device=device, requires_grad=True)
    t = Tensor([1, 2], device=device)
    with pytest.raises(TypeError, match=r"dtypes\.int\b"):
        t.requires_grad = True


# ---- devices ----

def test_unknown_device():
    with pytest.raises(ValueError, match=r"unknown device 'TPU'.*NUMPY.*CPU"):
        Tensor([1], device="TPU")
    with pytest.raises(ValueError, match="'TPU'"):
        Tensor([1.0]).to("TPU")


def test_mixing_devices(device):
    here = ones(2, 3, device=device)
    other = "CPU" if device == "NUMPY" else "NUMPY"
    there = ones(2, 3, device=other)
    calls = [lambda: here + there, lambda: here * there, lambda: here @ there.T,
             lambda: (here > 0).where(here, there), lambda: here.maximum(there),
             lambda: Tensor.cat(here, there)]
    for call in calls:
        with pytest.raises(RuntimeError, match=f"different devices: {device} and {other}"):
            call()
    np.testing.assert_array_equal((here + there.to(device)).numpy(), 2 * np.ones((2, 3)))


# ---- indexing ----

def test_index_out_of_range(device):
    a = Tensor(np.arange(6.0).reshape(2, 3), device=device)
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 2"):
        a[5]
    with pytest.raises(IndexError, match="index -3 is out of bounds for axis 0 with size 2"):
        a[-3]
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 1 with size 3"):
        a[0, 3]
    with pytest.raises(IndexError, match="too many indices: 3.*2 dimensions"):
        a[0, 0, 0]
    with pytest.raises(IndexError, match="cannot index with float"):
        a[1.5]


def test_tensor_index_out_of_range(device):
    # a tensor index outside the axis picks 0 (tinygrad's documented rule); gather raises
    a = Tensor(np.arange(6.0).reshape(2, 3), device=device)
    np.testing.assert_array_equal(a[Tensor([0, 2], device=device)].numpy(), [[0, 1, 2], [0, 0, 0]])
    np.testing.assert_array_equal(a[:, Tensor([[3]], device=device)].numpy(), [[[0]], [[0]]])
    np.testing.assert_array_equal(a[1, Tensor([-4, -1], device=device)].numpy(), [0, 5])
    with pytest.raises(IndexError, match="must be integer"):
        a[Tensor([0.0], device=device)]
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 1 with size 3"):
        a.gather(1, Tensor([[0, 5], [1, 1]], device=device))
    picked = a.gather(1, Tensor([[-1, 0], [2, -3]], device=device))  # negative: from the end
    np.testing.assert_array_equal(picked.numpy(), [[2.0, 0.0], [5.0, 3.0]])


# ---- layers and losses ----

def test_conv2d_mismatches(device):
    x = ones(1, 3, 5, 5, device=device)
    with pytest.raises(ValueError, match=r"input has 3 channels.*\(2, 4, 3, 3\).*expects 4"):
        x.conv2d(ones(2, 4, 3, 3, device=device))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\).*\(3, 5, 5\)"):
        ones(3, 5, 5, device=device).conv2d(ones(2, 3, 3, 3, device=device))
    with pytest.raises(ValueError, match="window of 7.*size 5"):
        x.conv2d(ones(2, 3, 7, 7, device=device))
    with pytest.raises(ValueError, match="window of 7.*size 5"):
        x.max_pool2d(7)


def test_conv_transpose2d_mismatches(device):
    x = ones(1, 4, 3, 3, device=device)
    with pytest.raises(ValueError, match=r"\(N, C_in, H, W\).*\(4, 2, 3\)"):
        x.conv_transpose2d(ones(4, 2, 3, device=device))
    with pytest.raises(ValueError, match=r"input has 4 channels.*\(2, 4, 3, 3\).*expects 2"):
        x.conv_transpose2d(ones(2, 4, 3, 3, device=device))
    with pytest.raises(ValueError, match=r"6 input channels.*groups=4"):
        ones(1, 6, 3, 3, device=device).conv_transpose2d(ones(6, 1, 3, 3, device=device),
                                                         groups=4)
    with pytest.raises(ValueError, match=r"output_padding \(2, 2\).*stride \(2, 2\).*"
                                         r"dilation \(1, 1\)"):
        x.conv_transpose2d(ones(4, 2, 3, 3, device=device), stride=2, output_padding=2)
    with pytest.raises(ValueError, match=r"bias of shape \(3,\).*2 output channels"):
        x.conv_transpose2d(ones(4, 2, 3, 3, device=device), ones(3, device=device))
    with pytest.raises(ValueError, match=r"empty output \(-1, -1\)"):
        x.conv_transpose2d(ones(4, 2, 1, 1, device=device), padding=2)
    with pytest.raises(ValueError, match=r"pair of ints, got \(1, 2, 3\)"):
        x.conv_transpose2d(ones(4, 2, 3, 3, device=device), stride=(1, 2, 3))
    with pytest.raises(ValueError, match=r"\(N, C_in, L\).*\(1, 4, 3, 3\)"):
        nn.conv_transpose1d(x, ones(4, 2, 3, device=device))


def test_integer_pow_negative_constant(device):
    with pytest.raises(ValueError, match=r"negative integer powers.*int32 \*\* -2"):
        Tensor([1, 2], device=device) ** -2
    with pytest.raises(TypeError, match="bool"):
        Tensor([True], device=device) ** Tensor([True], device=device)


def test_cross_entropy_label_mismatch(device):
    logits = ones(4, 10, device=device)
    with pytest.raises(ValueError, match=r"labels of shape \(3,\).*logits \(4, 10\)"):
        logits.sparse_categorical_crossentropy(Tensor([1, 2, 3], device=device))
    with pytest.raises(ValueError, match="reduction must be.*'avg'"):
        logits.sparse_categorical_crossentropy(Tensor([1, 2, 3, 4], device=device),
                                               reduction="avg")
    with pytest.raises(TypeError, match="integer class indices"):
        Tensor([1.0], device=device).one_hot(3)


def test_assign_mismatch(device):
    with pytest.raises(ValueError, match=r"assign: \(4,\).*\(3,\)"):
        ones(3, device=device).assign(ones(4, device=device))


# ---- kernels that must not crash the process ----

INT_MIN = {dtypes.int32: -(2 ** 31), dtypes.int64: -(2 ** 63)}


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64], ids=["int32", "int64"])
def test_integer_division_by_zero_and_overflow(device, dtype):
    """As documented in runtime/numpy.py: x // 0 and x % 0 give 0, INT_MIN // -1 wraps to
    INT_MIN (and INT_MIN % -1 is 0). C would trap (SIGFPE) on both: the kernels guard them."""
    low = INT_MIN[dtype]
    x = Tensor([7, -7, 0, low, low], device=device, dtype=dtype)
    y = Tensor([0, 0, 0, -1, 0], device=device, dtype=dtype)
    assert (x // y).tolist() == [0, 0, 0, low, 0]
    assert (x % y).tolist() == [0, 0, 0, 0, 0]
    assert (x // -1).tolist() == [-7, 7, 0, low, low]  # a constant divisor takes another path
    assert (x % -1).tolist() == [0, 0, 0, 0, 0]
    assert (x // 0).tolist() == [0, 0, 0, 0, 0]
    assert (x % 0).tolist() == [0, 0, 0, 0, 0]


def test_integer_division_agrees_across_devices():
    values = np.array([7, -7, 5, -5, 0, -(2 ** 31), 2 ** 31 - 1], dtype=np.int32)
    divisors = np.array([0, 2, -3, -1, 3, -1, 0], dtype=np.int32)
    results = {}
    for name in ("NUMPY", "CPU"):
        x, y = Tensor(values, device=name), Tensor(divisors, device=name)
        results[name] = ((x // y).numpy(), (x % y).numpy())
    for ours, theirs in zip(results["NUMPY"], results["CPU"]):
        np.testing.assert_array_equal(ours, theirs)
    nonzero = divisors != 0
    safe = values.astype(np.int64)[nonzero]  # Python semantics where they are defined
    np.testing.assert_array_equal(results["CPU"][0][nonzero][:-1],
                                  (safe // divisors[nonzero])[:-1])


def test_kernel_that_fails_to_compile_shows_the_message_and_line(monkeypatch):
    """Break the C renderer's ADD so that it writes invalid C: the error carries gcc's (or
    clang's) message and the offending source line, and the process carries on."""
    renderer = Device["CPU"].renderer
    monkeypatch.setitem(renderer.code_for_op, Ops.ADD,
                        lambda renderer, operands, operand_dtypes, dtype:
                        "({} +* {} @)".format(*operands))
    a = Tensor(np.arange(7.0, dtype=np.float32), device="CPU")
    with pytest.raises(CompileError) as info:
        (a + 3.25).exp2().numpy()  # a kernel no other test builds, so it is not cached
    message = str(info.value)
    assert "failed to compile" in message and "error" in message
    assert "+*" in message and "line" in message  # the source line is shown
    monkeypatch.undo()
    np.testing.assert_allclose((a + 3.25).exp2().numpy(), 2.0 ** (np.arange(7.0) + 3.25),
                               rtol=1e-6)


def test_compiler_error_from_source():
    source = "void broken(float* data0) {\n  data0[0] = undefined_name;\n}\n"
    with pytest.raises(CompileError, match=r"undefined_name(.|\n)*line 2: data0\[0\] ="):
        Device["CPU"].compiler.compile(source)


def test_unavailable_device_is_reported():
    unavailable = [name for name in ("CUDA", "OPENCL", "WEBGPU")
                   if not Device.is_available(name)]
    if not unavailable:
        pytest.skip("every device is available here")
    name = unavailable[0]
    with pytest.raises(RuntimeError, match=f"{name} is not available.*NUMPY"):
        (Tensor([1.0], device=name) + 1).numpy()

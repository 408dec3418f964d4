"""Movement ops and indexing, forward and backward, against numpy and PyTorch on every device."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import check, compare

from tinyteach import Tensor

torch = pytest.importorskip("torch")
F = torch.nn.functional

# ---- movement ops ----

MOVEMENT = {  # name: (ours, theirs, input shape)
    "reshape": (lambda x: x.reshape(6, 4), lambda x: x.reshape(6, 4), (2, 3, 4)),
    "reshape_minus_one": (lambda x: x.reshape(-1, 3), lambda x: x.reshape(-1, 3), (2, 3, 4)),
    "reshape_tuple": (lambda x: x.reshape((4, -1)), lambda x: x.reshape((4, -1)), (2, 3, 4)),
    "view": (lambda x: x.view(3, 8), lambda x: x.view(3, 8), (2, 3, 4)),
    "permute": (lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1), (2, 3, 4)),
    "permute_negative": (lambda x: x.permute((-1, 1, 0)), lambda x: x.permute(-1, 1, 0),
                         (2, 3, 4)),
    "transpose": (lambda x: x.transpose(0, 2), lambda x: x.transpose(0, 2), (2, 3, 4)),
    "transpose_negative": (lambda x: x.transpose(-1, -2), lambda x: x.transpose(-1, -2),
                           (2, 3, 4)),
    "T": (lambda x: x.T, lambda x: x.T, (3, 4)),
    "expand": (lambda x: x.expand(2, 3, 4), lambda x: x.expand(2, 3, 4), (3, 1)),
    "expand_minus_one": (lambda x: x.expand(5, -1, 4), lambda x: x.expand(5, -1, 4), (3, 1)),
    "flatten": (lambda x: x.flatten(), lambda x: x.flatten(), (2, 3, 4)),
    "flatten_range": (lambda x: x.flatten(1), lambda x: x.flatten(1), (2, 3, 4)),
    "flatten_middle": (lambda x: x.flatten(0, 1), lambda x: x.flatten(0, 1), (2, 3, 4)),
    "unflatten": (lambda x: x.unflatten(1, (2, 6)), lambda x: x.unflatten(1, (2, 6)),
                  (2, 12)),
    "squeeze": (lambda x: x.squeeze(), lambda x: x.squeeze(), (1, 3, 1, 4)),
    "squeeze_dim": (lambda x: x.squeeze(2), lambda x: x.squeeze(2), (1, 3, 1, 4)),
    "squeeze_negative": (lambda x: x.squeeze(-3), lambda x: x.squeeze(-3), (1, 3, 1, 4)),
    "squeeze_not_one": (lambda x: x.squeeze(1), lambda x: x.squeeze(1), (1, 3, 1, 4)),
    "unsqueeze": (lambda x: x.unsqueeze(1), lambda x: x.unsqueeze(1), (3, 4)),
    "unsqueeze_negative": (lambda x: x.unsqueeze(-1), lambda x: x.unsqueeze(-1), (3, 4)),
    "flip": (lambda x: x.flip(1), lambda x: x.flip(1), (2, 3, 4)),
    "flip_many": (lambda x: x.flip((0, -1)), lambda x: x.flip((0, -1)), (2, 3, 4)),
    "shrink": (lambda x: x.shrink(((1, 3), None, (0, 2))), lambda x: x[1:3, :, 0:2],
               (4, 3, 4)),
    "repeat": (lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 3), (2, 3)),
    "repeat_same": (lambda x: x.repeat(2, 2), lambda x: x.repeat(2, 2), (2, 3)),
}


@pytest.mark.one_case_on_opencl("name")
@pytest.mark.parametrize("name", list(MOVEMENT))
def test_movement(device, name):
    ours, theirs, shape = MOVEMENT[name]
    check(ours, theirs, [shape], device)


PADS = {  # name: (our padding, torch's flat padding)
    "pairs": (((1, 2), (0, 1)), (0, 1, 1, 2)),
    "pairs_with_none": ((None, (2, 0)), (2, 0)),
    "flat": ((1, 2), (1, 2)),
    "flat_all": ((1, 0, 2, 3), (1, 0, 2, 3)),
    "negative": (((-1, 1), (1, -2)), (1, -2, -1, 1)),
}


@pytest.mark.one_case_on_opencl("name")
@pytest.mark.parametrize("name", list(PADS))
def test_pad(device, name):
    ours, theirs = PADS[name]
    check(lambda x: x.pad(ours), lambda x: F.pad(x, theirs), [(3, 4)], device)
    check(lambda x: x.pad(ours, value=-1.5), lambda x: F.pad(x, theirs, value=-1.5),
          [(3, 4)], device)


def test_pad_integers(device):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    compare(Tensor(x, device=device).pad(((1, 0), (0, 2)), value=7),
            np.pad(x, ((1, 0), (0, 2)), constant_values=7), 0, 0)


# ---- __getitem__, compared with numpy ----

BASIC_INDICES = {
    "int": 1, "negative_int": -1, "two_ints": (2, -3), "three_ints": (0, 1, 2),
    "slice": slice(1, 3), "slice_step": (slice(None), slice(None, None, 2)),
    "slice_step3": (slice(None), slice(1, None, 3)),
    "negative_step": (slice(None, None, -1),),
    "negative_step2": (slice(None), slice(None, None, -2)),
    "negative_step_bounds": (slice(3, 0, -2), slice(-1, -5, -1)),
    "slice_out_of_range": (slice(-10, 10), slice(4, 2)),
    "none": (None, 1), "none_middle": (slice(None), None, 0, None),
    "ellipsis": (Ellipsis, 1), "ellipsis_middle": (1, Ellipsis, slice(2, 4)),
    "ellipsis_none": (Ellipsis, None), "mixed": (-2, slice(None, None, -1), slice(1, 5, 2)),
    "empty_slice": (slice(2, 2),),
}


def check_index_gradient(index, our_index, device):
    """The gradient of sum(x[index] * c) is c scattered back (summed where repeated): numpy's
    np.add.at computes it for any index, negative steps included (which torch lacks)."""
    x = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    t = Tensor(x, device=device, requires_grad=True)
    out = t[our_index]
    cotangent = np.random.default_rng(1).uniform(0.5, 1.5, out.shape).astype(np.float32)
    (out * Tensor(cotangent, device=device)).sum().backward()
    expected = np.zeros_like(x)
    np.add.at(expected, index, cotangent.reshape(x[index].shape))
    compare(t.grad, expected, 1e-6, 1e-6, "gradient")


@pytest.mark.one_case_on_opencl("name")
@pytest.mark.parametrize("name", list(BASIC_INDICES))
def test_basic_indexing(device, name):
    index = BASIC_INDICES[name]
    x = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    compare(Tensor(x, device=device)[index], x[index], 0, 0)
    check_index_gradient(index, index, device)


ADVANCED_INDICES = {  # numpy's rules for where the index axes go
    "list": ([0, 3, 1],),
    "negative_list": ([-1, 0, -4],),
    "tensor_2d": (np.array([[0, 1], [3, 3]]),),
    "second_axis": (slice(None), [4, 0, 2]),
    "two_adjacent": (slice(None), [0, 4], [1, 5]),
    "two_separated": ([0, 3], slice(None), [1, 5]),
    "broadcast_pair": (np.array([[0], [2]]), slice(None), np.array([1, 2, 3])),
    "with_int": (1, [0, 4, 2]),
    "with_int_after": ([1, 2], 3),
    "with_slice_step": (slice(None, None, -2), [1, 0]),
    "with_none": (None, [2, 1]),
    "with_ellipsis": (Ellipsis, [5, 0]),
    "repeated": ([1, 1, 1],),
}


def _as_tensor_index(index, device):
    """numpy arrays in the index become integer Tensors; lists stay lists."""
    items = index if isinstance(index, tuple) else (index,)
    return tuple(Tensor(i.astype(np.int32), device=device) if isinstance(i, np.ndarray) else i
                 for i in items)


@pytest.mark.one_case_on_opencl("name")
@pytest.mark.parametrize("name", list(ADVANCED_INDICES))
def test_advanced_indexing(device, name):
    index = ADVANCED_INDICES[name]
    x = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    ours = _as_tensor_index(index, device)
    compare(Tensor(x, device=device)[ours], x[index], 0, 0)
    check_index_gradient(index, ours, device)


def test_index_with_integer_tensor_dtypes(device):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = Tensor(x, device=device)
    compare(t[Tensor([2, 0], device=device)], x[[2, 0]], 0, 0)
    compare(t[:, Tensor(np.array([3, -1], dtype=np.int8), device=device)], x[:, [3, -1]], 0, 0)
    compare(t[Tensor(1, device=device)], x[1], 0, 0)  # a 0-d index drops the axis


def test_indexing_views_and_scalars(device):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = Tensor(x, device=device)
    compare(t.T[1:, ::2][[0, 2]], x.T[1:, ::2][[0, 2]], 0, 0)
    compare(t[2, 3], x[2, 3], 0, 0)
    assert t[2, 3].item() == x[2, 3]
    compare(Tensor(5.0, device=device)[None], np.array([5.0], np.float32), 0, 0)
    compare(Tensor(5.0, device=device)[...], np.array(5.0, np.float32), 0, 0)


def test_index_errors(device):
    t = Tensor.zeros(3, 4, device=device)
    with pytest.raises(IndexError, match="out of (range|bounds)"):
        t[3]
    with pytest.raises(IndexError, match="out of (range|bounds)"):
        t[:, -5]
    with pytest.raises(IndexError, match="too many"):
        t[0, 0, 0]
    # a tensor index out of range picks 0 instead (tinygrad's rule): test_tinygrad_docs_behaviour
    with pytest.raises(IndexError):
        t[Tensor([0.5], device=device)]


# ---- gather, cat, stack, split, chunk ----

def test_gather(device):
    index = np.array([[0, 2, 1], [3, 3, 0]], dtype=np.int64)
    for dim, shape in ((1, (2, 4)), (0, (4, 3)), (-1, (2, 5))):
        check(lambda x, d=dim: x.gather(d, Tensor(index.astype(np.int32), device=device)),
              lambda x, d=dim: torch.gather(x, d, torch.tensor(index)), [shape], device)
    index3 = np.array([[[1], [0]], [[0], [1]]], dtype=np.int64)
    check(lambda x: x.gather(1, Tensor(index3.astype(np.int32), device=device)),
          lambda x: torch.gather(x, 1, torch.tensor(index3)), [(2, 3, 2)], device)


@pytest.mark.one_case_on_opencl("dim")
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_stack(device, dim):
    shapes = [(2, 3), (2, 3), (2, 3)]
    check(lambda *ts: Tensor.cat(*ts, dim=dim), lambda *ts: torch.cat(ts, dim=dim), shapes,
          device)
    check(lambda *ts: Tensor.stack(list(ts), dim=dim), lambda *ts: torch.stack(ts, dim=dim),
          shapes, device)
    uneven = [(2, 3), (1, 3)] if dim == 0 else [(2, 1), (2, 4)]
    check(lambda a, b: a.cat(b, dim=dim), lambda a, b: torch.cat((a, b), dim=dim), uneven,
          device)


def test_cat_mixed_dtypes(device):
    ints = Tensor(np.array([1, 2], dtype=np.int32), device=device)
    floats = Tensor(np.array([0.5], dtype=np.float32), device=device)
    result = Tensor.cat(ints, floats)
    expected = torch.cat((torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0.5])))
    assert result.dtype.name == str(expected.dtype).replace("torch.", "")
    compare(result, expected, 0, 0)


SPLITS = {  # name: (ours, theirs)
    "split_int": (lambda x: x.split(2), lambda x: x.split(2)),
    "split_uneven": (lambda x: x.split(3, dim=1), lambda x: x.split(3, dim=1)),
    "split_sizes": (lambda x: x.split([1, 4], dim=1), lambda x: x.split([1, 4], dim=1)),
    "chunk": (lambda x: x.chunk(2), lambda x: x.chunk(2)),
    "chunk_uneven": (lambda x: x.chunk(3, dim=1), lambda x: x.chunk(3, dim=1)),
    "chunk_more_than_size": (lambda x: x.chunk(6, dim=0), lambda x: x.chunk(6, dim=0)),
}


@pytest.mark.one_case_on_opencl("name")
@pytest.mark.parametrize("name", list(SPLITS))
def test_split_chunk(device, name):
    ours, theirs = SPLITS[name]
    check(ours, theirs, [(4, 5)], device)


def test_movement_errors(device):
    t = Tensor.zeros(2, 3, device=device)
    with pytest.raises(ValueError, match="reshape"):
        t.reshape(4, 2)
    with pytest.raises(ValueError, match="permutation"):
        t.permute(0, 0)
    with pytest.raises(ValueError, match="expand"):
        t.expand(4, 3)
    with pytest.raises(IndexError, match="axis"):
        t.flip(2)
    with pytest.raises(ValueError, match="shrink"):
        t.shrink(((0, 3), None))

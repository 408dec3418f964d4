"""Chapter 4: every movement op's index map, checked by evaluating the index expressions for every
output element and comparing with numpy's own reshape/transpose/broadcast_to/pad/slicing/flip of
an arange."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tinyteach.dtype import dtypes
from tinyteach.ir.rewrite import PYTHON_ALU, graph_rewrite, symbolic
from tinyteach.ir.uop import Ops, UOp
from tinyteach.ir.view import contiguous_strides, index_into_buffer, linear_index, view_index


def buffer_of_shape(shape: tuple[int, ...]) -> UOp:
    size = int(np.prod(shape))
    return UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (1, size)).reshape(shape)


def evaluate(expr: UOp, env: dict[UOp, int]) -> int | bool:
    """Evaluate an index expression with Python integers (C semantics for // and %)."""
    values: dict[UOp, int | bool] = {}
    for n in expr.toposort:
        if n.op is Ops.RANGE:
            values[n] = env[n]
        elif n.op is Ops.CONST:
            values[n] = n.arg
        else:
            values[n] = PYTHON_ALU[n.op](*(values[s] for s in n.src))
    return values[expr]


def ranges_for(shape: tuple[int, ...]) -> tuple[UOp, ...]:
    return tuple(UOp(Ops.RANGE, dtypes.int32, (), ("g", axis, size))
                 for axis, size in enumerate(shape))


def check_view(view: UOp, expected: np.ndarray, simplify: bool = False) -> None:
    """For every output element: the buffer position the index math reads (or 'padding') must
    be what numpy puts there. `expected` is numpy's result on arange(size) + 1 (0 = padding)."""
    assert view.shape == expected.shape
    index = ranges_for(view.shape)
    _, position, valid = index_into_buffer(view, index)
    if simplify:
        position = graph_rewrite(position, symbolic)
        valid = None if valid is None else graph_rewrite(valid, symbolic)
    for out in itertools.product(*(range(s) for s in view.shape)):
        env = dict(zip(index, out))
        is_valid = True if valid is None else bool(evaluate(valid, env))
        if expected[out] == 0:
            assert not is_valid, f"{out} is padding"
        else:
            assert is_valid, f"{out} is not padding"
            assert evaluate(position, env) + 1 == expected[out], out


def numbered(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(1, int(np.prod(shape)) + 1).reshape(shape)


SHAPES = [(3,), (2, 3), (4, 1, 3), (2, 3, 4)]


# ---- one op at a time ----

@pytest.mark.parametrize("shape, new_shape", [
    ((2, 3), (6,)), ((2, 3), (3, 2)), ((2, 3, 4), (4, 6)), ((2, 3, 4), (2, 1, 12)),
    ((6,), (1, 2, 1, 3)), ((4, 1, 3), (12,)), ((1,), ()),
])
def test_reshape(shape, new_shape):
    check_view(buffer_of_shape(shape).reshape(new_shape), numbered(shape).reshape(new_shape))


@pytest.mark.parametrize("shape", SHAPES)
def test_permute_every_order(shape):
    for order in itertools.permutations(range(len(shape))):
        check_view(buffer_of_shape(shape).permute(order), numbered(shape).transpose(order))


@pytest.mark.parametrize("shape, new_shape", [
    ((1,), (4,)), ((2, 1), (2, 3)), ((1, 3), (4, 3)), ((1, 1, 2), (3, 2, 2)),
])
def test_expand(shape, new_shape):
    check_view(buffer_of_shape(shape).expand(new_shape),
               np.broadcast_to(numbered(shape), new_shape))


@pytest.mark.parametrize("shape, padding", [
    ((3,), ((1, 2),)), ((2, 3), ((0, 1), (2, 0))), ((2, 3), ((1, 1), (1, 1))),
    ((2, 1, 3), ((0, 0), (1, 0), (0, 2))),
])
def test_pad(shape, padding):
    check_view(buffer_of_shape(shape).pad(padding), np.pad(numbered(shape), padding))


@pytest.mark.parametrize("shape, bounds", [
    ((5,), ((1, 4),)), ((3, 4), ((1, 3), (0, 2))), ((2, 3, 4), ((1, 2), (0, 3), (1, 4))),
])
def test_shrink(shape, bounds):
    slices = tuple(slice(start, end) for start, end in bounds)
    check_view(buffer_of_shape(shape).shrink(bounds), numbered(shape)[slices])


@pytest.mark.parametrize("shape", SHAPES)
def test_flip_every_axis_set(shape):
    for count in range(1, len(shape) + 1):
        for axes in itertools.combinations(range(len(shape)), count):
            check_view(buffer_of_shape(shape).flip(axes), np.flip(numbered(shape), axes))


# ---- chains ----

def random_movement(rng: np.random.Generator, view: UOp, array: np.ndarray):
    """Apply one random movement op to both the UOp view and the numpy array."""
    shape = array.shape
    kind = rng.choice(["reshape", "permute", "expand", "pad", "shrink", "flip"])
    if kind == "reshape":
        size = array.size
        divisors = [d for d in range(1, size + 1) if size % d == 0]
        first = int(rng.choice(divisors))
        new_shape = (first, size // first)
        return view.reshape(new_shape), array.reshape(new_shape)
    if kind == "permute":
        order = tuple(int(i) for i in rng.permutation(len(shape)))
        return view.permute(order), array.transpose(order)
    if kind == "expand":
        ones = [axis for axis, size in enumerate(shape) if size == 1]
        if not ones:
            view, array = view.reshape((1, *shape)), array.reshape((1, *shape))
            ones, shape = [0], (1, *shape)
        new_shape = tuple(3 if axis in ones else size for axis, size in enumerate(shape))
        return view.expand(new_shape), np.broadcast_to(array, new_shape)
    if kind == "pad":
        padding = tuple((int(rng.integers(0, 2)), int(rng.integers(0, 2))) for _ in shape)
        return view.pad(padding), np.pad(array, padding)
    if kind == "shrink":
        bounds = []
        for size in shape:
            start = int(rng.integers(0, size))
            bounds.append((start, int(rng.integers(start + 1, size + 1))))
        return view.shrink(tuple(bounds)), array[tuple(slice(s, e) for s, e in bounds)]
    axes = tuple(axis for axis in range(len(shape)) if rng.random() < 0.5) or (0,)
    return view.flip(axes), np.flip(array, axes)


@pytest.mark.parametrize("seed", range(30))
def test_random_chains_of_movement_ops(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(1, 4, size=int(rng.integers(1, 4))))
    view, array = buffer_of_shape(shape), numbered(shape)
    for _ in range(int(rng.integers(2, 6))):
        view, array = random_movement(rng, view, array)
        if array.size > 400:
            break
    check_view(view, array)
    check_view(view, array, simplify=True)  # the simplifier keeps every address


def test_chain_transpose_reshape_slice():
    # x.T.reshape(...)[1:, ::-1] on a 3x4: the classic non-contiguous view
    base = buffer_of_shape((3, 4))
    view = base.permute((1, 0)).reshape((2, 6)).shrink(((1, 2), (0, 6))).flip((1,))
    expected = numbered((3, 4)).T.reshape(2, 6)[1:, ::-1]
    check_view(view, expected)


# ---- the pad validity condition ----

def test_pad_condition_is_exactly_the_inside():
    view = buffer_of_shape((3,)).pad(((2, 1),))
    (i,) = ranges_for(view.shape)
    (shifted,), valid = view_index(view, (i,))
    assert valid is not None and valid.dtype == dtypes.bool
    inside = [bool(evaluate(valid, {i: k})) for k in range(6)]
    assert inside == [False, False, True, True, True, False]
    assert [evaluate(shifted, {i: k}) for k in range(2, 5)] == [0, 1, 2]


def test_views_without_padding_have_no_condition():
    view = buffer_of_shape((2, 3)).permute((1, 0)).reshape((6,)).flip((0,))
    _, _, valid = index_into_buffer(view, ranges_for(view.shape))
    assert valid is None


def test_pad_conditions_combine_over_axes():
    view = buffer_of_shape((1, 1)).pad(((1, 0), (0, 1)))
    _, _, valid = index_into_buffer(view, ranges_for(view.shape))
    index = ranges_for(view.shape)
    truth = [[bool(evaluate(valid, dict(zip(index, (a, b))))) for b in range(2)]
             for a in range(2)]
    assert truth == [[False, False], [True, False]]


# ---- helpers ----

def test_contiguous_strides_match_numpy():
    for shape in [(2, 3, 4), (5,), (1, 3), (4, 1, 2)]:
        itemsize = 8
        assert contiguous_strides(shape) == tuple(
            s // itemsize for s in np.zeros(shape, dtype=np.int64).strides)


def test_linear_index_is_row_major():
    shape = (2, 3, 4)
    index = ranges_for(shape)
    position = linear_index(index, shape)
    for out in itertools.product(*(range(s) for s in shape)):
        assert evaluate(position, dict(zip(index, out))) == np.ravel_multi_index(out, shape)

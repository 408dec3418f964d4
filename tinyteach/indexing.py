"""Chapter 1 (part 3): indexing — `t[1, ::2, None, ..., idx]` from movement ops.

What this teaches:
- basic indexing is movement: an int is a shrink to one element (then the axis is dropped), a
  slice is a shrink, a negative step is a flip, a step of k is a reshape that keeps every k-th
  element, None is a reshape that adds an axis of size 1;
- indexing with an integer tensor ("advanced indexing") selects with a comparison: each index
  becomes a one-hot row (`index == arange(n)`), and a sum over the axis picks the element. It
  costs n times more arithmetic than a real gather, but needs no new primitive op.

`TensorIndexing` is the last part of chapter 1: a mixin with `__getitem__`, on top of all the
others (it needs arange, comparisons and sums), which tensor.py assembles into Tensor.

Builds on: tensor_nn.py and the parts below it. Used by: tensor.py (`Tensor.__getitem__`).
"""
from __future__ import annotations

from typing import Any, Self, TypeVar

from tinyteach.dtype import dtypes
from tinyteach.tensor_core import CoreTensor, broadcast_shape
from tinyteach.tensor_movement import check_index_range
from tinyteach.tensor_nn import TensorNN

T = TypeVar("T", bound="TensorIndexing")  # the helper functions return what they were given


class TensorIndexing(TensorNN):
    """`t[...]`: ints, slices, None, ..., and lists and tensors of indices (part 3)."""

    def __getitem__(self, index: Any) -> Self:
        """Ints, slices, None, ..., and (fancy indexing) lists and tensors of indices: `t[[0, 2]]`,
        `t[rows, cols]`. Lists become index tensors on this tensor's device."""
        if isinstance(index, tuple):
            return getitem(self, tuple(self._index_tensor(item) for item in index))
        return getitem(self, self._index_tensor(index))

    def _index_tensor(self, item: Any) -> Any:
        if not isinstance(item, list):
            return item
        if any(isinstance(part, CoreTensor) for part in item):
            parts: list[Any] = [part if isinstance(part, CoreTensor) else
                                type(self)(part, self.device) for part in item]
            return parts[0].stack(*parts[1:]).cast(dtypes.int32)
        return type(self)(item, self.device, dtype=dtypes.int32)


def _normalize(tensor: TensorIndexing, index: Any) -> list[Any]:
    items = list(index) if isinstance(index, tuple) else [index]
    items = [type(tensor)(i, tensor.device, dtype=dtypes.int32) if isinstance(i, list) else i
             for i in items]
    ndim = tensor.ndim
    if sum(i is Ellipsis for i in items) > 1:
        raise IndexError("an index can only have a single ellipsis (...)")
    used = sum(1 for i in items if i is not None and i is not Ellipsis)
    if used > ndim:
        raise IndexError(f"too many indices: {used} for a tensor with {ndim} dimensions")
    # (`in` and .index() would compare with ==, which builds graphs for tensors: use `is`)
    at = next((k for k, item in enumerate(items) if item is Ellipsis), None)
    if at is not None:
        return items[:at] + [slice(None)] * (ndim - used) + items[at + 1:]
    return items + [slice(None)] * (ndim - used)


def _take_slice(x: T, axis: int, item: slice) -> T:
    size = x.shape[axis]
    start, stop, step = item.indices(size)
    if step < 0:
        x = x.flip(axis)
        start, stop, step = size - 1 - start, size - 1 - stop, -step
    stop = max(stop, start)
    bounds: list[tuple[int, int] | None] = [None] * x.ndim
    bounds[axis] = (start, stop)
    x = x.shrink(bounds)
    if step == 1:
        return x
    length = stop - start
    kept = -(-length // step)
    pads = [(0, 0)] * x.ndim
    pads[axis] = (0, kept * step - length)
    x = x.pad(pads)
    x = x.reshape(*x.shape[:axis], kept, step, *x.shape[axis + 1:])
    bounds = [None] * x.ndim
    bounds[axis + 1] = (0, 1)
    return x.shrink(bounds).reshape(*x.shape[:axis], kept, *x.shape[axis + 2:])


def getitem(tensor: T, index: Any) -> T:
    items = _normalize(tensor, index)
    x, axis = tensor, 0
    out_shape_ops: list[tuple[str, int]] = []  # ("drop" | "new", axis in x)
    advanced: list[tuple[int, Any]] = []
    for item in items:
        if item is None:
            out_shape_ops.append(("new", axis))
            continue
        size = x.shape[axis]
        if isinstance(item, CoreTensor):
            if dtypes.is_float(item.dtype) or item.dtype == dtypes.bool:
                raise IndexError(f"tensors used as indices must be integer, not {item.dtype}")
            check_index_range(item, size, axis)
            advanced.append((axis, item))
        elif isinstance(item, slice):
            x = _take_slice(x, axis, item)
        elif isinstance(item, int):
            if not -size <= item < size:
                raise IndexError(f"index {item} is out of range for axis {axis} with size {size}")
            bounds: list[tuple[int, int] | None] = [None] * x.ndim
            bounds[axis] = (item % size, item % size + 1)
            x = x.shrink(bounds)
            out_shape_ops.append(("drop", axis))
        else:
            raise IndexError(f"cannot index with {type(item).__name__}: use ints, slices, None, "
                             "..., or integer tensors")
        axis += 1
    x, positions = _reshape_after(x, out_shape_ops, [a for a, _ in advanced])
    if advanced:
        x = _advanced(x, positions, [t for _, t in advanced])
    return x


def _reshape_after(x: T, ops: list[tuple[str, int]],
                   advanced_axes: list[int]) -> tuple[T, list[int]]:
    """Drop the int-indexed axes and insert the None axes; track where advanced axes land."""
    dropped = {a for kind, a in ops if kind == "drop"}
    new_before: dict[int, int] = {}
    for kind, a in ops:
        if kind == "new":
            new_before[a] = new_before.get(a, 0) + 1
    shape: list[int] = []
    positions: dict[int, int] = {}
    for a in range(x.ndim + 1):
        shape.extend([1] * new_before.get(a, 0))
        if a < x.ndim and a not in dropped:
            positions[a] = len(shape)
            shape.append(x.shape[a])
    return x.reshape(shape), [positions[a] for a in advanced_axes]


def _advanced(x: T, positions: list[int], indices: list[T]) -> T:
    """Select with integer tensors by one-hot masks, with numpy's rules for where the
    broadcast index axes go (in place if the indexed axes are adjacent, else in front)."""
    batch = broadcast_shape(*(t.shape for t in indices))
    sizes = [x.shape[p] for p in positions]
    rest = [i for i in range(x.ndim) if i not in positions]
    moved = x.permute(rest + positions)
    mask: T | None = None
    for k, (index, size) in enumerate(zip(indices, sizes)):
        index = (index < 0).where(index + size, index).expand(batch)
        shape = batch + (1,) * k + (size,) + (1,) * (len(sizes) - k - 1)
        arange = type(x).arange(size, device=x.device).reshape(shape[len(batch):])
        one_hot = index.reshape(batch + (1,) * len(sizes)) == arange
        mask = one_hot if mask is None else mask & one_hot
        del shape
    assert mask is not None
    lead = len(rest)
    values = moved.reshape(*moved.shape[:lead], *(1,) * len(batch), *sizes)
    full_mask = mask.reshape((1,) * lead + mask.shape)
    axes = tuple(range(lead + len(batch), lead + len(batch) + len(sizes)))
    picked = full_mask.where(values, 0).sum(axes, dtype=x.dtype)  # (rest..., batch...)
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    if not adjacent or not batch:
        if adjacent:
            return picked
        return picked.permute(list(range(lead, lead + len(batch))) + list(range(lead)))
    first = positions[0]
    order = list(range(first)) + list(range(lead, lead + len(batch))) + list(range(first, lead))
    return picked.permute(order)

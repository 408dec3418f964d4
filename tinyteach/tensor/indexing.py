"""Chapter 1 (part 3): indexing — `t[1, ::2, None, ..., idx]` from movement ops.

What this teaches:
- basic indexing is movement: an int is a shrink to one element (then the axis is dropped), a
  slice is a shrink, a negative step is a flip, a step of k is a reshape that keeps every k-th
  element, None is a reshape that adds an axis of size 1;
- indexing with an integer tensor ("advanced indexing") selects with a comparison: each index
  becomes a one-hot row (`index == arange(n)`), and a sum over the axis picks the element. It
  costs n times more arithmetic than a real gather, but needs no new primitive op. An index
  outside the axis matches no row, so it picks 0, as tinygrad documents (`t[Tensor([4])]` of
  a 3-element t is [0]). Checking would mean reading the index back to the host before
  anything runs; an int, or a list of ints, out of range is an IndexError (its values are on
  the host already);

- scatter is the same one-hot run backwards: `index == arange(n)` says which source element
  lands where, and a masked sum (or product, max, min) over the sources combines them;
- a data-dependent shape (`masked_select`, `nonzero`) realizes the count first: one number
  comes back to the host, then the selection is a masked sum into that many slots.

`TensorIndexing` is the last part of chapter 1: a mixin with `__getitem__`, on top of all the
others (it needs arange, comparisons and sums), which tensor/__init__.py assembles into Tensor.

Builds on: tensor/nn.py and the parts below it. Used by: tensor/__init__.py (`Tensor.__getitem__`).
"""
from __future__ import annotations

from typing import Any, Literal, Self, TypeVar

import numpy as np

from tinyteach.dtype import dtypes
from tinyteach.ir.uop import UOp, sint
from tinyteach.tensor.core import ArgumentError, CoreTensor, DTypeError, ShapeError, broadcast_shape
from tinyteach.tensor.movement import check_index_range
from tinyteach.tensor.nn import TensorNN

T = TypeVar("T", bound="TensorIndexing")  # the helper functions return what they were given


class TensorIndexing(TensorNN):
    """`t[...]`: ints, slices, None, ..., and lists and tensors of indices (part 3)."""

    def __getitem__(self, index: Any) -> Self:
        """Ints, slices, None, ..., and (fancy indexing) lists and tensors of indices: `t[[0, 2]]`,
        `t[rows, cols]`. Lists become index tensors on this tensor's device."""
        if isinstance(index, tuple):
            return getitem(self, tuple(self._index_tensor(item) for item in index))
        return getitem(self, self._index_tensor(index))

    # ---- scatter: the one-hot of gather, summed the other way ----

    def scatter(self, dim: int, index: Self, src: Self | float | int,
                reduce: Literal["add", "multiply"] | None = None) -> Self:
        """A copy with src's values written along `dim` where `index` points (PyTorch's and
        tinygrad's): for dim=1, out[i][index[i][j]] = src[i][j]. Where two sources hit one
        place the last one wins (as PyTorch on the CPU); `reduce` adds or multiplies them into
        the value there instead. `src` may be a number; with `reduce` it must be one (a tensor
        src with reduce is refused, as tinygrad refuses it and PyTorch deprecates it:
        scatter_reduce does that)."""
        if reduce not in (None, "add", "multiply"):
            raise ValueError(f"scatter: reduce must be 'add' or 'multiply', not {reduce!r}")
        if reduce is not None and isinstance(src, CoreTensor):
            names = {"add": "sum", "multiply": "prod"}
            raise TypeError(f"scatter: a tensor src with reduce={reduce!r} is not supported (as "
                            f"in tinygrad; PyTorch deprecates it): use scatter_reduce(dim, "
                            f"index, src, {names[reduce]!r})")
        scatter_ = _Scatter(self, dim, index, src)
        if reduce == "add":
            return scatter_.put(scatter_.region + scatter_.combine("sum"))
        if reduce == "multiply":
            return scatter_.put(scatter_.region * scatter_.combine("prod"))
        return scatter_.put(scatter_.hit.where(scatter_.combine("last"), scatter_.region))

    def scatter_reduce(self, dim: int, index: Self, src: Self,
                       reduce: Literal["sum", "prod", "mean", "amax", "amin"],
                       include_self: bool = True) -> Self:
        """A copy with the sources that `index` sends to each place combined by `reduce`,
        with the value already there when `include_self` (PyTorch's and tinygrad's). Places
        no source reaches keep their value. An integer mean rounds down, as PyTorch."""
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise ArgumentError(f"scatter_reduce: reduce must be one of sum, prod, mean, amax, "
                             f"amin, not {reduce!r}")
        scatter_ = _Scatter(self, dim, index, src)
        region, hit = scatter_.region, scatter_.hit
        if reduce == "mean":
            total = scatter_.combine("sum") + (region if include_self else region.zeros_like())
            count = scatter_.count + int(include_self)
            mean = total.div(count.maximum(1), rounding_mode="floor") if \
                dtypes.is_int(self.dtype) else (total / count.maximum(1)).cast(self.dtype)
            return scatter_.put(hit.where(mean, region))
        combined = scatter_.combine(reduce)
        if include_self:
            together = {"sum": region + combined, "prod": region * combined,
                        "amax": region.maximum(combined), "amin": region.minimum(combined)}
            combined = together[reduce]
        return scatter_.put(hit.where(combined, region))

    # ---- data-dependent shapes: the count is realized first ----

    def masked_select(self, mask: Self) -> Self:
        """The elements where `mask` is True, in order, as a 1-d tensor (PyTorch's); mask and
        tensor broadcast together. Its length depends on the data: the count of True is
        computed first, then each selected element goes to its slot, slot = (running count of
        True) - 1, by a masked sum."""
        shape = broadcast_shape(self.shape, mask.shape)
        values, chosen = self.expand(shape).flatten(), mask.cast(dtypes.bool).expand(shape)
        chosen = chosen.flatten()
        count = int(chosen.sum().item())
        if count == 0:
            return values.shrink(((0, 0),))
        slot = chosen.cast(dtypes.int32).cumsum() - 1
        lands = chosen.unsqueeze(1) & (slot.unsqueeze(1) ==
                                       type(self).arange(count, device=self.device))
        return lands.where(values.unsqueeze(1), 0).sum(0, dtype=self.dtype)

    def nonzero(self) -> Self:
        """The index of every nonzero element, one row of `ndim` coordinates each, in row-major
        order: shape (count, ndim), as PyTorch's `nonzero()` (int32 here: tinyteach's index
        dtype). Each axis's coordinate is an arange broadcast over the tensor, then
        `masked_select` picks those of the nonzero elements."""
        nonzero = self != 0
        if self.ndim == 0:
            count = int(nonzero.cast(dtypes.int32).item())
            return type(self).zeros(count, 0, dtype=dtypes.int32, device=self.device)
        columns = []
        for axis, size in enumerate(self.shape):
            shape = [1] * self.ndim
            shape[axis] = size
            coordinate = type(self).arange(size, device=self.device).reshape(shape)
            columns.append(coordinate.expand(self.shape).masked_select(nonzero))
        return columns[0].stack(*columns[1:], dim=1)

    def _index_tensor(self, item: Any) -> Any:
        """A list (or a tuple inside the index, as numpy reads `t[(1, 0), 2]`) of ints: an
        index tensor. Floats are refused, and so is a list of bools only (numpy would read it
        as a mask; tinygrad refuses it too); True and False among ints are 1 and 0."""
        if not isinstance(item, (list, tuple)):
            return item
        item = _as_lists(item)
        if any(isinstance(part, CoreTensor) for part in item):
            parts: list[Any] = [part if isinstance(part, CoreTensor) else
                                type(self)(part, self.device) for part in item]
            return parts[0].stack(*parts[1:]).cast(dtypes.int32)
        leaves = _leaves(item)
        if any(isinstance(leaf, float) for leaf in leaves):
            raise IndexError(f"list indices must be integers, not floats: {item}")
        if leaves and all(isinstance(leaf, bool) for leaf in leaves):
            raise IndexError(f"a list of only bools is not an index (use a bool tensor's "
                             f"nonzero() or masked_select): {item}")
        return _ListIndex(item, self)


def _as_lists(item: Any) -> Any:
    """Nested tuples as nested lists (tensors and numbers as they are)."""
    if isinstance(item, (list, tuple)):
        return [_as_lists(part) for part in item]
    return item


def _leaves(item: Any) -> list[Any]:
    if isinstance(item, list):
        return [leaf for part in item for leaf in _leaves(part)]
    return [item]


def _normalize(tensor: TensorIndexing, index: Any) -> list[Any]:
    items = list(index) if isinstance(index, tuple) else [index]
    items = [_ListIndex(i, tensor) if isinstance(i, list) else i for i in items]
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


class _ListIndex:
    """A list of ints in an index: a tensor index whose values are on the host already, so
    an out-of-range one is an IndexError (as PyTorch and numpy), at no cost."""

    def __init__(self, values: list, tensor: TensorIndexing):
        self.values = values
        self.tensor = type(tensor)(values, tensor.device, dtype=dtypes.int32)

    def checked(self, size: int, axis: int) -> Any:
        flat = np.asarray(self.values).reshape(-1)
        outside = flat[(flat < -size) | (flat >= size)] if flat.dtype.kind in "iu" else flat[:0]
        if outside.size:
            raise IndexError(f"index {outside[0]} is out of bounds for axis {axis} with size "
                             f"{size}")
        return self.tensor


def _take_symbolic_slice(x: T, axis: int, item: slice) -> T:
    """`x[:n]`, `x[2:n]`, `x[:2]` where a bound or the axis's size is a Variable (chapter 4b):
    a shrink, which checks that it fits for every value of the variable. Negative bounds and
    steps need the size's value, which differs from run to run, so they are refused."""
    start = 0 if item.start is None else item.start
    stop = x.shape[axis] if item.stop is None else item.stop
    for bound in (start, stop):
        if isinstance(bound, bool) or not isinstance(bound, (int, UOp)):
            raise IndexError(f"slice bounds must be ints or Variables, not {bound!r}")
    if item.step not in (None, 1) or any(isinstance(b, int) and b < 0 for b in (start, stop)):
        raise IndexError(f"a slice over a symbolic size takes bounds >= 0 and step 1, not "
                         f"{item}: its length is known only when the variable is bound")
    bounds: list[tuple[sint, sint] | None] = [None] * x.ndim
    bounds[axis] = (start, stop)
    return x.shrink(bounds)


def _take_slice(x: T, axis: int, item: slice) -> T:
    size = x.shape[axis]
    if any(isinstance(part, UOp) for part in (item.start, item.stop, size)):
        return _take_symbolic_slice(x, axis, item)
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
        if isinstance(item, _ListIndex):
            item = item.checked(size, axis)
        if isinstance(item, CoreTensor):
            if dtypes.is_float(item.dtype) or item.dtype == dtypes.bool:
                raise IndexError(f"tensors used as indices must be integer, not {item.dtype}")
            advanced.append((axis, item))  # out of range picks 0 (tinygrad's rule)
        elif isinstance(item, slice):
            x = _take_slice(x, axis, item)
        elif isinstance(item, int):
            if not -size <= item < size:
                raise IndexError(f"index {item} is out of bounds for axis {axis} with size {size}")
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


class _Scatter:
    """What every scatter needs, with `dim` moved last: the part of the tensor that `index`
    covers (`region`: index's size on the other axes, the whole `dim`), the one-hot `lands`
    (..., k, n) of each source element on its place, the sources (..., k, 1), which places
    are reached (`hit`) and by how many (`count`)."""

    def __init__(self, target: TensorIndexing, dim: int, index: TensorIndexing,
                 src: TensorIndexing | float | int):
        self.target, self.axis = target, target._axis(dim)
        if index.ndim != target.ndim or dtypes.is_float(index.dtype):
            raise ArgumentError(f"scatter: index must be an integer tensor with {target.ndim} "
                             f"dims, not {index.dtype.name} with {index.ndim}")
        if not isinstance(src, CoreTensor):
            src = type(target).full(index.shape, src, dtype=target.dtype, device=target.device)
        elif src.dtype != target.dtype:  # torch and tinygrad refuse too: no silent cast
            raise DTypeError(f"scatter: src is {src.dtype.name}, the tensor {target.dtype.name}; "
                             "cast one of them first")
        if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape)) or \
                any(i > t for a, (i, t) in enumerate(zip(index.shape, target.shape))
                    if a != self.axis):
            raise ShapeError(f"scatter: index {index.shape} must fit in src {src.shape} and, "
                             f"outside dim {self.axis}, in the tensor {target.shape}")
        n = target.shape[self.axis]
        check_index_range(index, n, self.axis)
        index = (index < 0).where(index + n, index)
        self.bounds = [(0, size) if a != self.axis else (0, n)
                       for a, size in enumerate(index.shape)]
        self.region = target.shrink(self.bounds)
        sources = src.cast(target.dtype).shrink([(0, size) for size in index.shape])
        places = index.transpose(self.axis, -1).unsqueeze(-1)              # (..., k, 1)
        self.lands = places == type(target).arange(n, device=target.device)  # (..., k, n)
        self.sources = sources.transpose(self.axis, -1).unsqueeze(-1)       # (..., k, 1)
        self.count = self._back(self.lands.cast(dtypes.int32).sum(-2))
        self.hit = self.count > 0

    def _back(self, values: Any) -> Any:
        """(..., n) with dim last -> the region's layout."""
        return values.transpose(self.axis, -1)

    def combine(self, how: str) -> Any:
        """The sources at each place, summed, multiplied, maxed, mined, or the last one."""
        lands, sources, dtype = self.lands, self.sources, self.target.dtype
        if how == "sum":
            return self._back(lands.where(sources, 0).sum(-2, dtype=dtype))
        if how == "prod":
            return self._back(lands.where(sources, 1).prod(-2, dtype=dtype))
        if how in ("amax", "amin"):
            lowest = dtype.min if how == "amax" else dtype.max
            picked = lands.where(sources, lowest)
            return self._back(picked.max(-2) if how == "amax" else picked.min(-2))
        # "last": a place takes the last source that lands on it (no later one does)
        later = lands.cast(dtypes.int32).flip(-2).cumsum(-2).flip(-2) - lands.cast(dtypes.int32)
        return self._back((lands & (later == 0)).where(sources, 0).sum(-2, dtype=dtype))

    def put(self, region: Any) -> Any:
        """The whole tensor, with `region` in the part that index covers."""
        target = self.target
        padding = [(0, size - end) for size, (_, end) in zip(target.shape, self.bounds)]
        if not any(after for _, after in padding):
            return region
        inside = type(target).ones(*region.shape, dtype=dtypes.bool, device=target.device)
        return inside.pad(padding).where(region.pad(padding), target)

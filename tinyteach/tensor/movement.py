"""Chapter 1 (part 5): movement, composed — transpose, squeeze, cat, split, repeat, gather.

What this teaches:
- tensor/core.py has six primitive movement ops (reshape, permute, expand, pad, shrink, flip);
  every other change of shape is one or two of them: transpose is a permute,
  flatten/squeeze/unsqueeze are reshapes, split and chunk are shrinks, repeat is reshape + expand +
  reshape;
- joining needs no new op either: `cat` pads each piece to the full length, zeros elsewhere, and
  adds them up (the scheduler fuses it into one kernel), `stack` is unsqueeze + cat;
- `gather` selects with a comparison, as tensor/indexing.py does: `index == arange(n)` is a one-hot
  mask, and a sum over the axis picks the element; pad's "reflect", "replicate" and
  "circular" modes are shrinks, flips and expands of the edges joined with cat; `triu`
  and `tril` are windows of one padded constant row (no arange, so the mask costs no kernel),
  `diag` is a mask from two aranges, `roll` is a split and a cat, and
  `diagonal` reads a flattened square with a stride of n + 1 (pad by one row, reshape to
  (n, n + 1), keep the first column).

Builds on: tensor/create.py (part 4; `arange` for gather) and the core's six movement ops.
Used by: tensor/math.py and everything above.

>>> from tinyteach import Tensor
>>> a, b = Tensor([[1, 2]]), Tensor([[3, 4]])
>>> a.cat(b).tolist(), Tensor.stack(a, b).shape
([[1, 2], [3, 4]], (2, 1, 2))
>>> Tensor.arange(6).split(4)[1].tolist()
[4, 5]
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Self, TypeVar

from tinyteach.dtype import dtypes, least_upper_dtype
from tinyteach.ir.uop import sint, sym_add, sym_sub
from tinyteach.tensor.core import (
    ArgumentError,
    CoreTensor,
    Scalar,
    ShapeError,
    padding_pairs,
    pool,
)
from tinyteach.tensor.create import TensorCreation, _shape_from

M = TypeVar("M", bound="TensorMovement")  # the helper functions return what they were given


class PadModeError(ArgumentError, NotImplementedError):
    """A pad mode that does not exist, or negative circular padding: tinygrad raises
    NotImplementedError, torch RuntimeError; tinyteach's class was ValueError."""


class TensorMovement(TensorCreation):
    """Movement ops composed from the six primitive ones, and joining and splitting (part 5)."""

    def view(self, *shape: Any) -> Self:
        return self.reshape(*shape)

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Self:
        order = list(range(self.ndim))
        a, b = self._axis(dim0), self._axis(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Self:
        return self.permute(tuple(reversed(range(self.ndim))))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Self:
        if self.ndim == 0:
            return self.reshape(1)
        start, end = self._axis(start_dim), self._axis(end_dim)
        return self.reshape(*self.shape[:start], -1, *self.shape[end + 1:])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Self:
        axis = self._axis(dim)
        return self.reshape(*self.shape[:axis], *sizes, *self.shape[axis + 1:])

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Self:
        """Drop axes of size 1: all of them, or those of `dim` (an axis or, as PyTorch 2, a
        tuple of axes) that have size 1."""
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        if not self.shape:
            self._axis(dim if isinstance(dim, int) else 0)  # a 0-d tensor takes only dim 0 / -1
            return self
        axes = self._axes(dim)
        return self.reshape(tuple(s for i, s in enumerate(self.shape)
                                  if not (i in axes and s == 1)))

    def unsqueeze(self, dim: int) -> Self:
        axis = self._axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    # ---- selecting, joining and splitting ----

    def gather(self, dim: int, index: Self) -> Self:
        """out[i][j] = self[i][index[i][j]] for dim=1 (PyTorch's gather)."""
        axis = self._axis(dim)
        if index.ndim != self.ndim:
            raise ShapeError(f"gather: index has {index.ndim} dims, tensor has {self.ndim}")
        if any(i > s for a, (i, s) in enumerate(zip(index.shape, self.shape)) if a != axis):
            raise ShapeError(f"gather: index {index.shape} is larger than the tensor "
                             f"{self.shape} outside dim {axis}")
        check_index_range(index, self.shape[axis], axis)
        index = (index < 0).where(index + self.shape[axis], index)  # -1 is the last, as numpy
        bounds = [(0, i) if a != axis else None for a, i in enumerate(index.shape)]
        source = self.shrink(bounds).transpose(axis, -1)  # (..., n)
        picked = index.transpose(axis, -1).unsqueeze(-1)   # (..., k, 1)
        n = self.shape[axis]
        one_hot = picked == type(self).arange(n, device=self.device)
        return one_hot.where(source.unsqueeze(-2), 0).sum(-1, dtype=self.dtype).transpose(axis, -1)

    def cat(self, *others: Any, dim: int = 0) -> Self:
        """Join along `dim`: `a.cat(b, c)`, `Tensor.cat(a, b, c)` or `Tensor.cat([a, b, c])`
        (a plain method, so that `a.cat(b)` passes `a` too, as in tinygrad)."""
        items = _tensor_list(self, others)
        return items[0].cat_with(*items[1:], dim=dim)

    def cat_with(self, *others: Self, dim: int = 0) -> Self:
        axis = self._axis(dim)
        for other in others:
            if other.ndim != self.ndim or any(a != b for i, (a, b) in
                                              enumerate(zip(self.shape, other.shape)) if i != axis):
                raise ValueError(f"cat: shapes {self.shape} and {other.shape} differ outside "
                                 f"dim {axis}")
        tensors = [self, *others]
        dtype = least_upper_dtype(*(t.dtype for t in tensors))
        total: sint = 0
        for t in tensors:
            total = sym_add(total, t.shape[axis])
        result: Self | None = None
        offset: sint = 0
        for t in tensors:  # (sym_add and sym_sub: a size may be symbolic)
            pairs: list[tuple[sint, sint]] = [(0, 0)] * self.ndim
            pairs[axis] = (offset, sym_sub(sym_sub(total, offset), t.shape[axis]))
            piece = t.cast(dtype).pad(pairs)
            result = piece if result is None else result + piece
            offset = sym_add(offset, t.shape[axis])
        assert result is not None
        return result

    def stack(self, *others: Any, dim: int = 0) -> Self:
        """Join along a new axis `dim`: `a.stack(b)`, `Tensor.stack(a, b)` or a list."""
        items = _tensor_list(self, others)
        for item in items[1:]:
            if item.shape != items[0].shape:
                raise ValueError(f"stack needs tensors of one shape, got {items[0].shape} and "
                                 f"{item.shape}")
        axis = items[0]._axis(dim, items[0].ndim + 1)
        first, *rest = [t.unsqueeze(axis) for t in items]
        return first.cat(*rest, dim=axis)

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> list[Self]:
        axis = self._axis(dim)
        length = self.shape[axis]
        if isinstance(sizes, int):
            if sizes <= 0:
                raise ValueError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, length - start) for start in range(0, length, sizes)] or [0]
        if sum(sizes) != length:
            raise ValueError(f"split sizes {list(sizes)} do not add up to {length} (dim {axis})")
        pieces, start = [], 0
        for size in sizes:
            bounds: list[tuple[int, int] | None] = [None] * self.ndim
            bounds[axis] = (start, start + size)
            pieces.append(self.shrink(bounds))
            start += size
        return pieces

    def chunk(self, chunks: int, dim: int = 0) -> list[Self]:
        if chunks <= 0:
            raise ValueError(f"chunk needs a positive number of chunks, got {chunks}")
        length = self.shape[self._axis(dim)]
        return self.split(max(1, math.ceil(length / chunks)), dim)

    def repeat(self, *repeats: Any) -> Self:
        counts = _shape_from(repeats)
        if len(counts) < self.ndim:
            raise ValueError(f"repeat needs at least {self.ndim} counts, got {counts}")
        base = self.reshape((1,) * (len(counts) - self.ndim) + self.shape)
        interleaved = [d for s in base.shape for d in (1, s)]
        expanded = [d for c, s in zip(counts, base.shape) for d in (c, s)]
        return base.reshape(interleaved).expand(expanded).reshape(
            tuple(c * s for c, s in zip(counts, base.shape)))

    # ---- more movement: padding, rolling, diagonals, grids (tinygrad's names) ----

    def pad2d(self, padding: Sequence[int], value: float = 0.0) -> Self:
        """PyTorch's flat padding (left, right, top, bottom, ...) from the last axis."""
        return self.pad(list(padding), value=value)

    def pad(self, padding: Sequence[Any], mode: str = "constant", value: Scalar = 0) -> Self:
        """The core's pad, plus PyTorch's modes that pad from the tensor's own edges:
        "reflect", "replicate" and "circular" (`_pad_edges`)."""
        if isinstance(mode, str) and mode != "constant":
            if value != 0:
                raise ValueError(f"pad mode {mode!r} takes no fill value (got value={value})")
            return self._pad_edges(padding_pairs(padding, self.ndim), mode)
        return super().pad(padding, mode, value)

    def _pad_edges(self, pairs: Sequence[tuple[int, int]], mode: str) -> Self:
        """Pad from the tensor's own edges, one axis at a time (PyTorch's F.pad modes):
        "reflect" mirrors without repeating the edge (d c b | a b c d | c b a), "replicate"
        repeats the edge element, "circular" wraps around. Each side is a shrink (and a flip
        or an expand) joined with `cat`, so gradients need nothing new."""
        if mode not in _EDGE_PADS:
            raise PadModeError(f"pad mode must be 'constant', 'reflect', 'replicate' or "
                               f"'circular', not {mode!r}")
        if mode == "circular" and any(b < 0 or a < 0 for b, a in pairs):
            raise PadModeError(f"pad mode 'circular' takes no negative padding, got {pairs}")
        x = self
        for axis, (before, after) in enumerate(pairs):
            if before > 0 or after > 0:
                x = _EDGE_PADS[mode](x, axis, max(before, 0), max(after, 0))
        # a negative amount crops that side after padding (PyTorch's rule: the edges padded
        # from are those of the whole input)
        crops = [(max(-b, 0), x.shape[axis] - max(-a, 0)) for axis, (b, a) in enumerate(pairs)]
        if any(start > end for start, end in crops):
            raise ArgumentError(f"padding {pairs} crops more than the shape {x.shape} holds")
        return x.shrink(crops) if any(b < 0 or a < 0 for b, a in pairs) else x

    def rearrange(self, formula: str, **sizes: int) -> Self:
        """einops' rearrange (tinygrad's): `x.rearrange("b c (h p) -> b (h c) p", p=2)`. Three
        movement ops: a reshape that splits the left side's groups into single axes (sizes
        from `sizes`, one unknown per group), a permute into the right side's order, and a
        reshape that merges the right side's groups. `...` stands for the axes not named;
        `1` or `()` is an axis of size 1."""
        if formula.count("->") != 1:
            raise ValueError(f"rearrange needs exactly one '->' in {formula!r}")
        left, right = (_parse_side(side) for side in formula.split("->"))
        named = sum(1 for group in left if group != ["..."])
        if named > self.ndim or (named < self.ndim and ["..."] not in left):
            raise ValueError(f"rearrange: {formula!r} names {named} axes, the tensor has "
                             f"{self.ndim}")
        rest = self.ndim - named
        left, right = _expand_ellipsis(left, rest), _expand_ellipsis(right, rest)
        atoms = [name for group in left for name in group]
        if sorted(atoms) != sorted(name for group in right for name in group) or \
                len(set(atoms)) != len(atoms):
            raise ValueError(f"rearrange: the two sides of {formula!r} must name the same "
                             f"axes, each once")
        size_of: dict[str, int] = {}
        for group, size in zip(left, self.shape):
            size_of.update(_group_sizes(group, size, sizes))
        x = self.reshape([size_of[name] for name in atoms])
        order = [name for group in right for name in group]
        x = x.permute([atoms.index(name) for name in order])
        return x.reshape([math.prod(size_of[name] for name in group) for group in right])

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Self:
        """Shift elements along `dims`, wrapping around: the last `s` move to the front (a
        shrink of each part and a cat). Without dims, the flattened tensor is rolled."""
        if dims is None:
            if not isinstance(shifts, int) and len(shifts) != 1:
                raise ArgumentError(f"roll without dims takes one shift, got {shifts}")
            shift = shifts if isinstance(shifts, int) else shifts[0]
            return self.flatten().roll(shift, 0).reshape(self.shape)
        shift_list = [shifts] if isinstance(shifts, int) else list(shifts)
        dim_list = [dims] if isinstance(dims, int) else list(dims)
        if len(shift_list) != len(dim_list):
            raise ArgumentError(f"roll: {len(shift_list)} shifts for {len(dim_list)} dims")
        result = self
        for shift, dim in zip(shift_list, dim_list):
            result = result._roll_one(shift, result._axis(dim))
        return result

    def _roll_one(self, shift: int, axis: int) -> Self:
        size = self.shape[axis]
        if size == 0 or shift % size == 0:
            return self
        cut = size - shift % size
        head, tail = self.split([cut, size - cut], axis)
        return tail.cat(head, dim=axis)

    def triu(self, diagonal: int = 0) -> Self:
        """Keep the elements on and above the `diagonal`-th diagonal of the last two axes
        (column - row >= diagonal), zero the rest."""
        return self._triangle("triu", diagonal, upper=True)

    def tril(self, diagonal: int = 0) -> Self:
        """Keep the elements on and below the `diagonal`-th diagonal (column - row <= diagonal)."""
        return self._triangle("tril", diagonal, upper=False)

    def _triangle(self, name: str, diagonal: int, upper: bool) -> Self:
        if self.ndim < 2:
            raise ValueError(f"{name} needs a tensor with at least 2 dimensions, got shape "
                             f"{self.shape}")
        rows, columns = self.shape[-2:]
        if isinstance(rows, int) and isinstance(columns, int):
            keep = self._triangle_mask(rows, columns, diagonal, upper)
        else:  # symbolic sizes: the mask from two aranges
            row = type(self).arange(rows, device=self.device).reshape(rows, 1)
            column = type(self).arange(columns, device=self.device).reshape(1, columns)
            keep = (column - row >= diagonal) if upper else (column - row <= diagonal)
        return keep.where(self, self.zeros_like())  # zeros of self's dtype, bool too

    def _triangle_mask(self, rows: int, columns: int, diagonal: int, upper: bool) -> Self:
        """The (rows, columns) bool mask of triu/tril as windows of one padded constant row,
        with movement ops only: no arange, so no kernel of its own. Window i of
        B = [False]*start + [True]*rest is B[i : i + columns]; it holds True from position
        start - i on. Flipped, the windows' columns make tril (column - row <= diagonal, for
        start = columns - 1 - diagonal); flipped, their rows make triu (start = rows - 1 +
        diagonal). The kernel that reads the mask computes it from the indices: the view's
        pad becomes a comparison of the row and the column."""
        if rows == 0 or columns == 0:
            return type(self).ones(rows, columns, dtype=dtypes.bool, device=self.device)
        length = rows + columns - 1
        start = (rows - 1 + diagonal) if upper else (columns - 1 - diagonal)
        start = min(max(start, 0), length)
        row = type(self).ones(length - start, dtype=dtypes.bool, device=self.device)
        windows = pool(row.pad([(start, 0)]), (columns,))
        return windows.flip(0) if upper else windows.flip(-1)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Self:
        """The elements (i, i + offset) of axes dim1 and dim2, which are removed; the diagonal
        becomes the last axis (PyTorch's). The square block that holds it is flattened,
        padded by one row's worth and read with a stride of n + 1: a reshape and a shrink."""
        a, b = self._axis(dim1), self._axis(dim2)
        if a == b:
            raise ArgumentError(f"diagonal: dim1 and dim2 are the same axis ({a})")
        others = [i for i in range(self.ndim) if i not in (a, b)]
        x = self.permute(others + [a, b])
        rows, columns = x.shape[-2:]
        start_row, start_column = min(max(-offset, 0), rows), min(max(offset, 0), columns)
        length = max(0, min(rows - start_row, columns - start_column))
        lead = list(x.shape[:-2])
        square = x.shrink([None] * len(lead) + [(start_row, start_row + length),
                                                (start_column, start_column + length)])
        flat = square.reshape(*lead, length * length).pad([(0, 0)] * len(lead) + [(0, length)])
        strided = flat.reshape(*lead, length, length + 1)
        return strided.shrink([None] * len(lead) + [None, (0, 1)]).reshape(*lead, length)

    def diag(self, diagonal: int = 0) -> Self:
        """1-d: a square matrix with these values on the `diagonal`-th diagonal (tinygrad's
        diag, which has no offset); 2-d: that diagonal, as a 1-d tensor (PyTorch's)."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ValueError(f"diag needs a 1-d or 2-d tensor, got shape {self.shape}")
        n = self.shape[0]
        eye = type(self).eye(n, dtype=dtypes.bool, device=self.device)
        row = self.reshape(1, n)
        square = eye.where(row, row.zeros_like())  # column j holds x[j] on the diagonal
        k = abs(diagonal)
        return square.pad([(0, k), (k, 0)] if diagonal >= 0 else [(k, 0), (0, k)])

    def meshgrid(self, *others: Self, indexing: str = "ij") -> tuple[Self, ...]:
        """Coordinate grids from 1-d tensors: the i-th result varies along axis i ("ij") and
        is broadcast along the others; "xy" swaps the first two axes (numpy's default)."""
        if indexing not in ("ij", "xy"):
            raise ArgumentError(f"meshgrid indexing must be 'ij' or 'xy', not {indexing!r}")
        tensors = [self, *others]
        for t in tensors:
            if t.ndim > 1:
                raise ValueError(f"meshgrid needs 0-d or 1-d tensors, got shape {t.shape}")
        sizes = [t.numel() for t in tensors]
        if indexing == "xy" and len(tensors) >= 2:
            sizes[0], sizes[1] = sizes[1], sizes[0]
        grids = []
        for i, t in enumerate(tensors):
            axis = {0: 1, 1: 0}.get(i, i) if indexing == "xy" and len(tensors) >= 2 else i
            shape = [1] * len(tensors)
            shape[axis] = sizes[axis]
            grids.append(t.reshape(shape).expand(sizes))
        return tuple(grids)

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Self:
        """Repeat each element `repeats` times along dim (flattened first when dim is None):
        [1, 2] -> [1, 1, 2, 2]. An unsqueeze, an expand and a reshape."""
        if not isinstance(repeats, int) or isinstance(repeats, bool):
            raise TypeError(f"repeat_interleave takes an int number of repeats, got "
                            f"{type(repeats).__name__}")
        if repeats < 0:
            raise ValueError(f"repeat_interleave needs repeats >= 0, got {repeats}")
        x = self.flatten() if dim is None else self
        axis = 0 if dim is None else x._axis(dim)
        expanded = list(x.shape[:axis + 1]) + [repeats] + list(x.shape[axis + 1:])
        moved = x.unsqueeze(axis + 1).expand(expanded)
        return moved.reshape(*x.shape[:axis], x.shape[axis] * repeats, *x.shape[axis + 1:])

    def masked_fill(self, mask: Self, value: Any) -> Self:
        """`value` where the bool `mask` is True (broadcast), self elsewhere."""
        if mask.dtype != dtypes.bool:
            raise TypeError(f"masked_fill needs a bool mask, not {mask.dtype.name}")
        return mask.where(value, self)


def _slice(x: M, axis: int, start: int, end: int) -> M:
    bounds: list[tuple[int, int] | None] = [None] * x.ndim
    bounds[axis] = (start, end)
    return x.shrink(bounds)


def _check_edge_pad(x: M, axis: int, before: int, after: int, mode: str,
                    limit: int) -> None:
    if before < 0 or after < 0:
        raise ValueError(f"pad mode {mode!r} takes no negative padding, got {(before, after)}")
    if max(before, after) > limit:
        raise ValueError(f"pad mode {mode!r}: padding {(before, after)} of axis {axis} must be "
                         f"at most {limit} for its size {x.shape[axis]}")


def _reflect(x: M, axis: int, before: int, after: int) -> M:
    n = x.shape[axis]
    _check_edge_pad(x, axis, before, after, "reflect", n - 1)
    head = _slice(x, axis, 1, before + 1).flip(axis)
    tail = _slice(x, axis, n - 1 - after, n - 1).flip(axis)
    return head.cat(x, tail, dim=axis)


def _replicate(x: M, axis: int, before: int, after: int) -> M:
    n = x.shape[axis]
    if n == 0:
        raise ValueError(f"pad mode 'replicate' cannot pad axis {axis} of size 0")
    _check_edge_pad(x, axis, before, after, "replicate", max(before, after))
    sizes = list(x.shape)
    sizes[axis] = before
    head = _slice(x, axis, 0, 1).expand(*sizes)
    sizes[axis] = after
    tail = _slice(x, axis, n - 1, n).expand(*sizes)
    return head.cat(x, tail, dim=axis)


def _circular(x: M, axis: int, before: int, after: int) -> M:
    n = x.shape[axis]
    _check_edge_pad(x, axis, before, after, "circular", n)
    return _slice(x, axis, n - before, n).cat(x, _slice(x, axis, 0, after), dim=axis)


_EDGE_PADS = {"reflect": _reflect, "replicate": _replicate, "circular": _circular}


def _tensor_list(first: Any, rest: tuple[Any, ...]) -> list[Any]:
    """The tensors of `f(a, b, c)` or of `f([a, b, c])` (then `first` is the list)."""
    if not rest and isinstance(first, (list, tuple)):
        return list(first)
    if any(isinstance(item, (list, tuple)) for item in (first, *rest)):
        raise ValueError("give the tensors one by one or as one list, not both")
    return [first, *rest]


def _parse_side(side: str) -> list[list[str]]:
    """'b (h w) 1 ...' -> [['b'], ['h', 'w'], [], ['...']]: each axis is a group of names."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for token in re.findall(r"\.\.\.|…|\(|\)|[^\s()]+", side):
        if token == "(":
            if current is not None:
                raise ValueError(f"rearrange: nested parentheses in {side!r}")
            current = []
        elif token == ")":
            if current is None:
                raise ValueError(f"rearrange: unbalanced parentheses in {side!r}")
            groups.append(current)
            current = None
        else:
            name = "..." if token == "…" else token
            if name != "..." and name != "1" and not name.isidentifier():
                raise ValueError(f"rearrange: {name!r} is not an axis name")
            if current is not None:
                current.extend([] if name == "1" else [name])
            else:
                groups.append([] if name == "1" else [name])
    if current is not None:
        raise ValueError(f"rearrange: unbalanced parentheses in {side!r}")
    return groups


def _expand_ellipsis(groups: list[list[str]], count: int) -> list[list[str]]:
    """'...' becomes `count` axes with names of their own (inside a group too)."""
    names = [f"...{k}" for k in range(count)]
    expanded: list[list[str]] = []
    for group in groups:
        if group == ["..."]:
            expanded.extend([name] for name in names)
        else:
            expanded.append([part for name in group
                             for part in (names if name == "..." else [name])])
    return expanded


def _group_sizes(group: list[str], size: int, given: dict[str, int]) -> dict[str, int]:
    """The size of each name in a group that has `size` elements in all."""
    unknown = [name for name in group if name not in given]
    known = math.prod(given[name] for name in group if name in given)
    if len(unknown) > 1:
        raise ValueError(f"rearrange: give the sizes of all but one of {group}")
    if unknown:
        if known == 0 or size % known:
            raise ValueError(f"rearrange: an axis of size {size} cannot split into {group} "
                             f"with sizes {given}")
        return {name: given.get(name, size // known) for name in group}
    if known != size:
        raise ValueError(f"rearrange: {group} has {known} elements, the axis {size}")
    return {name: given[name] for name in group}


def check_index_range(index: CoreTensor, size: int, axis: int) -> None:
    """Out-of-range indices would select nothing (a silent 0), so they are an error."""
    values = index.numpy()
    if values.size and (values.min() < -size or values.max() >= size):
        bad = values[(values < -size) | (values >= size)].reshape(-1)[0]
        raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {size}")

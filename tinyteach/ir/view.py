"""Chapter 4: shapes without copies — movement ops are index arithmetic.

What this teaches:
- reshape, permute, expand, pad, shrink and flip never move data. Each one is a small function
  from an index into its *output* to an index into its *input* (plus, for pad, a condition that
  says whether the element exists at all);
- composing those functions down a chain of movement ops gives, for any output element, the
  address to read in the underlying buffer: `index_into_buffer`;
- the resulting expressions (`(i*8 + j) // 8 % 4`) look clumsy, and the rewrite chapter
  simplifies them (`i`) using what is known about each index's range.

Here, an index is a tuple of integer UOps, one per axis; a condition is a bool UOp or None
(always valid).

Builds on: ir/uop.py. Used by: codegen/lower.py (loads and stores in generated code).

>>> from tinyteach.ir.uop import UOp, Ops
>>> from tinyteach.dtype import dtypes
>>> i, j = (UOp(Ops.RANGE, dtypes.int32, (), ("g", n, 4)) for n in range(2))
>>> square = UOp.const(dtypes.float32, 0.0).reshape((1, 1)).expand((4, 4))
>>> [x.arg for x in view_index(square.permute((1, 0)), (i, j))[0]]
[('g', 1, 4), ('g', 0, 4)]
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from tinyteach.dtype import dtypes
from tinyteach.helpers import memo
from tinyteach.ir.uop import Ops, UOp, sint, sym_mul

Index = tuple[UOp, ...]
Valid = UOp | None
IndexMap = Callable[[UOp, Index], tuple[Index, Valid]]


def index_const(value: int) -> UOp:
    return UOp.const(dtypes.int32, value)


def and_valid(a: Valid, b: Valid) -> Valid:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def below(index: UOp, size: int) -> Valid:
    """`index < size`, or None (always true) when the index never reaches `size`."""
    return None if index.vmax < size else index.lt(size)


def guarded(value: UOp, condition: Valid) -> UOp:
    """The value where `condition` holds, 0 elsewhere (padding)."""
    return value if condition is None else condition.where(value, UOp.const(value.dtype, 0))


# what lowering (codegen/lower.py) computes: a node's value at an index, where it is valid;
# a Combine builds a node's lowered form from its sources' lowered values
Task = tuple[UOp, Index, Valid]  # lower this node at this index, under this condition
Combine = Callable[[list[UOp]], UOp]


@memo("view.contiguous_strides")
@functools.lru_cache(maxsize=4096)  # (every index into a view of this shape asks again)
def contiguous_strides(shape: tuple[sint, ...]) -> tuple[sint, ...]:
    """Row-major strides in elements: the last axis moves by 1. (A symbolic size makes the
    strides before it symbolic: (i, 4) has strides (4, 1), (4, i) has (i, 1).)"""
    strides: list[sint] = []
    running: sint = 1
    for size in reversed(shape):
        strides.append(running)
        running = sym_mul(running, size)
    return tuple(reversed(strides))


def linear_index(index: Index, shape: tuple[sint, ...]) -> UOp:
    """The position of `index` in a row-major buffer of `shape`."""
    total = index_const(0)
    for idx, size, stride in zip(index, shape, contiguous_strides(shape)):
        if size != 1:
            total = index_add(total, index_mul(idx, stride))
    return total


# ---- index arithmetic without terms that change nothing ----
# The views below build their indices with these four instead of `+ * // %`: a term such as
# `i + 0`, `i * 1`, `i // 1` or `i % 8` (where 0 <= i < 8 always) is left out where it would
# be made. The rewrite chapter's rules would remove it anyway, but one node at a time: in the
# first step of an MLP's training they did so 1,300 times, two thirds of all their rewrites.
# Each leaves out only what those rules would, so the simplified index is the same.

def _is_const(node: UOp, value: int) -> bool:
    return node.op is Ops.CONST and node.arg == value


def index_add(a: UOp, b: UOp) -> UOp:
    """a + b; a itself when b is 0 (and b when a is), one constant for two."""
    if _is_const(b, 0):
        return a
    if _is_const(a, 0):
        return b
    if a.op is Ops.CONST and b.op is Ops.CONST:
        return index_const(a.arg + b.arg)
    return UOp(Ops.ADD, a.dtype, (a, b))


def index_mul(a: UOp, factor: sint) -> UOp:
    """a * factor; a itself when the factor is 1, 0 when either is 0."""
    if isinstance(factor, UOp):  # a symbolic stride
        return a * factor
    if factor == 1:
        return a
    if factor == 0 or _is_const(a, 0):
        return index_const(0)
    if a.op is Ops.CONST:
        return index_const(a.arg * factor)
    return UOp(Ops.MUL, a.dtype, (a, index_const(factor)))


def _below(a: UOp, bound: int) -> bool:
    """0 <= a < bound always, and a is one term (the rules for // and % rebuild a sum)."""
    return a.op is not Ops.ADD and 0 <= a.vmin and a.vmax < bound


def index_div(a: UOp, divisor: sint) -> UOp:
    """a // divisor; a itself for 1, 0 when 0 <= a < divisor always."""
    if isinstance(divisor, UOp):
        return a // divisor
    if divisor == 1:
        return a
    if _below(a, divisor):
        return index_const(0)
    return UOp(Ops.IDIV, a.dtype, (a, index_const(divisor)))


def index_mod(a: UOp, modulus: sint) -> UOp:
    """a % modulus; 0 for 1, and a itself when 0 <= a < modulus always."""
    if isinstance(modulus, UOp):
        return a % modulus
    if modulus == 1:
        return index_const(0)
    if _below(a, modulus):
        return a
    return UOp(Ops.MOD, a.dtype, (a, index_const(modulus)))


# ---- one function per movement op: output index -> (input index, condition) ----

def _reshape(node: UOp, index: Index) -> tuple[Index, Valid]:
    """Flatten the output index and unflatten it into the input shape — one group of axes at
    a time: (a, b*c) -> (a, b, c) only needs arithmetic on the last two axes."""
    in_index: list[UOp] = []
    for out_axes, out_sizes, in_sizes in _reshape_plan(node.shape, node.src[0].shape):
        if out_sizes == in_sizes:  # this group is unchanged: pass the indices through
            in_index.extend(index[a] for a in out_axes)
            continue
        flat = linear_index(tuple(index[a] for a in out_axes), out_sizes)
        if len(in_sizes) == 1 and isinstance(in_sizes[0], UOp):
            in_index.append(flat)  # one symbolic axis: the flat position is its index
            continue
        in_index.extend(index_const(0) if size == 1 else
                        index_mod(index_div(flat, stride), size)
                        for size, stride in zip(in_sizes, contiguous_strides(in_sizes)))
    return tuple(in_index), None


ReshapeGroup = tuple[tuple[int, ...], tuple[sint, ...], tuple[sint, ...]]


@memo("view.reshape_plans")
@functools.lru_cache(maxsize=4096)
def _reshape_plan(out_shape: tuple[int, ...],
                  in_shape: tuple[int, ...]) -> tuple[ReshapeGroup, ...]:
    """reshape_groups as (output axes, their sizes, the input sizes they become), worked out
    once per pair of shapes: a kernel maps many indices through the same reshape."""
    return tuple((tuple(out_axes), tuple(out_shape[a] for a in out_axes),
                  tuple(in_shape[a] for a in in_axes))
                 for out_axes, in_axes in reshape_groups(out_shape, in_shape))


def reshape_groups(out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> list[
        tuple[list[int], list[int]]]:
    """Split both shapes into runs of axes with equal products: (2, 6, 5) and (2, 3, 2, 5)
    give [([0], [0]), ([1], [1, 2]), ([2], [3])]. Falls back to one group if sizes are 0."""
    if any(isinstance(s, UOp) for s in (*out_shape, *in_shape)):
        return _symbolic_reshape_groups(out_shape, in_shape)
    if 0 in out_shape or 0 in in_shape or not out_shape or not in_shape:
        return [(list(range(len(out_shape))), list(range(len(in_shape))))]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(out_shape) or j < len(in_shape):
        out_axes, in_axes = [], []
        out_size = in_size = 1
        while True:
            if out_size <= in_size and i < len(out_shape):
                out_size *= out_shape[i]
                out_axes.append(i)
                i += 1
            elif j < len(in_shape):
                in_size *= in_shape[j]
                in_axes.append(j)
                j += 1
            else:
                out_axes.extend(range(i, len(out_shape)))
                i = len(out_shape)
                break
            if out_size == in_size and (i == len(out_shape) or out_shape[i] != 1) \
                    and (j == len(in_shape) or in_shape[j] != 1):
                break
        groups.append((out_axes, in_axes))
    return groups


def _symbolic_reshape_groups(out_shape: tuple[sint, ...], in_shape: tuple[sint, ...]) -> list[
        tuple[list[int], list[int]]]:
    """Groups when a size is symbolic: the same sizes at the start and at the end of both
    shapes pass through one by one (the same node is the same size);
    whatever is left in the middle is one group (flattened, then unflattened)."""
    i, j, head = 0, 0, []
    while i < len(out_shape) and j < len(in_shape) and _same_size(out_shape[i], in_shape[j]):
        head.append(([i], [j]))
        i, j = i + 1, j + 1
    k, m, tail = len(out_shape), len(in_shape), []
    while k > i and m > j and _same_size(out_shape[k - 1], in_shape[m - 1]):
        tail.append(([k - 1], [m - 1]))
        k, m = k - 1, m - 1
    middle = [(list(range(i, k)), list(range(j, m)))] if k > i or m > j else []
    return head + middle + tail[::-1]


def _same_size(a: sint, b: sint) -> bool:
    return a is b if isinstance(a, UOp) or isinstance(b, UOp) else a == b


def _permute(node: UOp, index: Index) -> tuple[Index, Valid]:
    in_index: list[UOp | None] = [None] * len(index)
    for out_axis, in_axis in enumerate(node.arg):
        in_index[in_axis] = index[out_axis]
    return tuple(i for i in in_index if i is not None), None


def _expand(node: UOp, index: Index) -> tuple[Index, Valid]:
    # a broadcast axis (size 1 in the input) always reads element 0
    in_shape = node.src[0].shape
    return tuple(index_const(0) if s == 1 else i for i, s in zip(index, in_shape)), None


def _pad(node: UOp, index: Index) -> tuple[Index, Valid]:
    in_shape, valid = node.src[0].shape, None
    in_index = []
    for idx, size, (before, _after) in zip(index, in_shape, node.arg):
        shifted = idx - before if isinstance(before, UOp) else index_add(idx, index_const(-before))
        if (before, _after) != (0, 0):
            # 0 <= shifted < size, written with the one comparison op we have: <
            inside = (shifted.lt(0)).ne(True) & shifted.lt(size)
            valid = and_valid(valid, inside)
        in_index.append(shifted)
    return tuple(in_index), valid


def _shrink(node: UOp, index: Index) -> tuple[Index, Valid]:
    return tuple(i + start if isinstance(start, UOp) else index_add(i, index_const(start))
                 for i, (start, _) in zip(index, node.arg)), None


def _flip(node: UOp, index: Index) -> tuple[Index, Valid]:
    shape = node.shape
    return tuple((shape[axis] - 1) - i if axis in node.arg else i
                 for axis, i in enumerate(index)), None


INDEX_MAPS: dict[Ops, IndexMap] = {
    Ops.RESHAPE: _reshape, Ops.PERMUTE: _permute, Ops.EXPAND: _expand,
    Ops.PAD: _pad, Ops.SHRINK: _shrink, Ops.FLIP: _flip,
}


def view_index(node: UOp, index: Index) -> tuple[Index, Valid]:
    """Map an index into a movement op's output to an index into its input."""
    return INDEX_MAPS[node.op](node, index)


def index_into_buffer(node: UOp, index: Index) -> tuple[UOp, UOp, Valid]:
    """Follow a chain of movement ops down to a buffer: (buffer node, linear index, condition)."""
    valid: Valid = None
    while node.op in INDEX_MAPS:
        index, condition = view_index(node, index)
        valid = and_valid(valid, condition)
        node = node.src[0]
    return node, linear_index(index, node.shape), valid

"""Chapter 3: the IR — one node type, UOp, and the primitive op set.

What this teaches:
- every stage of the compiler speaks one language: `UOp(op, dtype, src, arg)`. A Tensor is a
  graph of UOps; a kernel is a graph of UOps; the loops and loads of a lowered kernel are UOps;
- the ops a backend must implement are few and pinned here: `PRIMITIVE_OPS` (29 of them:
  load/const/copy, 7 unary, 11 binary, 1 ternary, 1 reduce, 6 movement). Everything the Tensor
  API offers — softmax, conv2d, cross-entropy — is built from them. A CAST converts a value;
  with the arg BITCAST it reads the same bits as another dtype (`UOp.bitcast`);
- UOps are hash-consed: building the same node twice gives the same object, so equal
  subgraphs are shared for free (common-subexpression elimination by construction);
- every node knows its shape (derived from its sources and arg), and the integer nodes of index
  arithmetic know their smallest and largest value (`vmin`, `vmax`), which the simplifier uses.
- GPU kernels add four nodes (chapter 8b): `DEFINE_LOCAL` (a work-group's shared memory),
  `SPECIAL` (a thread's index within its group), `BARRIER` (the group waits until every
  thread is there) and `WMMA` (a tensor core: a warp's small matrix multiply, codegen/wmma.py);
  `load_parts` and `store_parts` name the sources of a LOAD and a STORE;
- a graph may be 100,000 ops deep, and Python allows only ~1,000 nested calls: every walk over
  a graph keeps its own stack of nodes (`toposort_of`, `fill_sources_first`), never recursion.

Builds on: dtype.py. Used by: every later chapter.

>>> a = UOp.const(dtypes.int32, 3)
>>> (a + 4) is (a + 4)
True
>>> UOp(Ops.RESHAPE, dtypes.float32, (UOp.const(dtypes.float32, 1.0),), (1, 1)).shape
(1, 1)
"""
from __future__ import annotations

import enum
import functools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from tinyteach.dtype import DType, dtypes, truncate_to
from tinyteach.helpers import cached_property, register_memo


class Ops(enum.Enum):
    """Every kind of node, at every stage. The backend contract is `PRIMITIVE_OPS` below."""

    # each op is one object, so it hashes by identity: Enum's own __hash__ is a Python call,
    # and every node built or looked up hashes its op
    __hash__ = object.__hash__

    # load / const / copy: where values come from
    BUFFER = enum.auto()      # a realized buffer on a device (arg: the Buffer)
    CONST = enum.auto()       # a scalar constant (arg: the value)
    COPY = enum.auto()        # copy to another device (arg: the device name)
    # unary
    NEG = enum.auto()
    EXP2 = enum.auto()
    LOG2 = enum.auto()
    SIN = enum.auto()
    SQRT = enum.auto()
    RECIPROCAL = enum.auto()
    CAST = enum.auto()        # convert to this node's dtype (a float to an integer: toward
                              # zero, saturated to its range, NaN -> 0; dtype.float_to_int);
                              # with arg BITCAST, reinterpret the same bits as it (a dtype of
                              # the same size)
    # binary
    ADD = enum.auto()
    MUL = enum.auto()
    IDIV = enum.auto()        # integer division, truncating toward zero (as C does)
    FDIV = enum.auto()        # float division, correctly rounded (IEEE 754: x/0 is +-inf)
    MOD = enum.auto()         # remainder with the sign of the dividend (as C does)
    MAX = enum.auto()
    CMPLT = enum.auto()       # a < b, gives bool
    CMPNE = enum.auto()       # a != b, gives bool
    AND = enum.auto()
    OR = enum.auto()
    XOR = enum.auto()
    # ternary
    WHERE = enum.auto()       # cond ? a : b
    # reduce
    REDUCE_AXIS = enum.auto()  # arg: (Ops.ADD or Ops.MAX, axes); reduced axes keep size 1
    # movement: views of the same memory, no copies
    RESHAPE = enum.auto()     # arg: new shape
    PERMUTE = enum.auto()     # arg: axis order
    EXPAND = enum.auto()      # arg: new shape (size-1 axes broadcast)
    PAD = enum.auto()         # arg: ((before, after), ...) zero padding
    SHRINK = enum.auto()      # arg: ((start, end), ...)
    FLIP = enum.auto()        # arg: axes to reverse

    # --- graph structure, not computed by a backend ---
    CONTIGUOUS = enum.auto()  # realize here: the user asked for a fresh, contiguous buffer
    DETACH = enum.auto()      # the same value, but gradients stop here
    ASSIGN = enum.auto()      # write src[1]'s value into src[0]'s existing buffer (in place)

    # --- inside a kernel (chapters 6-8) ---
    SINK = enum.auto()        # the root of a kernel: its stores
    DEFINE_GLOBAL = enum.auto()  # a kernel parameter (arg: (index, size))
    STORE = enum.auto()       # src: (DEFINE_GLOBAL, index, value)
    LOAD = enum.auto()        # src: (DEFINE_GLOBAL, index) or (DEFINE_GLOBAL, index, valid)
    RANGE = enum.auto()       # a loop counter (arg: (kind, number, size)); 0 <= r < size
    REDUCE = enum.auto()      # a lowered reduction: src (value, *ranges), arg Ops.ADD or Ops.MAX
    END_RANGE = enum.auto()   # closes a loop
    DEFINE_ACC = enum.auto()  # an accumulator (arg: number, src: (initial value,))
    ACCUMULATE = enum.auto()  # src: (acc, value); arg: Ops.ADD or Ops.MAX

    # --- GPU kernels: work-groups and shared memory (the GPU chapter) ---
    DEFINE_LOCAL = enum.auto()  # a work-group's shared memory (arg: (number, size)); LOAD and
                                # STORE use it as they use a DEFINE_GLOBAL
    SPECIAL = enum.auto()     # this thread's index in its work-group along a dimension
                              # (arg: ('l', dimension, size)); 0 <= id < size
    BARRIER = enum.auto()     # every thread of the group waits here; src: the shared-memory
                              # accesses before it. A LOAD or STORE after it lists it as its
                              # last source
    WMMA = enum.auto()        # a tensor core: the threads of a warp multiply small matrices
                              # held in pieces (fragments) across them (codegen/wmma.py). src: this
                              # thread's elements of A, then of B; the value is one element of
                              # its part of A @ B (arg: wmma.WMMAArg: shape, dtypes, layout,
                              # which element). WMMAs with the same sources are one instruction

    # --- symbolic sizes (a size that is a variable: one kernel for every length) ---
    DEFINE_VAR = enum.auto()  # an integer variable (arg: (name, min, max)); in a kernel, an
                              # `int name` parameter
    BIND = enum.auto()        # a variable with its value for this run: src (DEFINE_VAR, CONST)


UNARY = (Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.CAST)
BINARY = (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.FDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE,
          Ops.AND, Ops.OR, Ops.XOR)
TERNARY = (Ops.WHERE,)
ALU = UNARY + BINARY + TERNARY
MOVEMENT = (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP)
REDUCE_OPS = (Ops.REDUCE_AXIS,)
SOURCES = (Ops.BUFFER, Ops.CONST, Ops.COPY)
COMPARISONS = (Ops.CMPLT, Ops.CMPNE)

# The backend contract: an interpreter backend implements exactly these (tests pin the count).
PRIMITIVE_OPS: tuple[Ops, ...] = SOURCES + UNARY + BINARY + TERNARY + REDUCE_OPS + MOVEMENT

# The arg of a CAST that reinterprets bits instead of converting the value: a plain CAST turns
# 1.0 into 1, a bitcast keeps the bits, 1.0 -> 1065353216 (numpy's `view`). It is a kind of
# CAST, not a primitive op of its own (tinygrad's CAST once carried a bitcast flag the same
# way): every stage that looks at a CAST asks `is_bitcast` first, and never folds one as a
# conversion of the value.
BITCAST = "bitcast"


def is_bitcast(node: UOp) -> bool:
    """Is `node` a CAST that keeps the bits (arg BITCAST)?"""
    return node.op is Ops.CAST and node.arg == BITCAST


def _arg_key(arg: Any) -> Any:
    """A dict key for an arg that keeps 0.0 and -0.0 (and 1 and True) apart."""
    if isinstance(arg, float):
        return (type(arg), repr(arg))  # the text tells -0.0 from 0.0, and one nan equals another
    if isinstance(arg, int):
        return (type(arg), arg)
    return arg


class UOpMetaClass(type):
    """Hash-consing: `UOp(...)` returns the existing node when an identical one is alive.

    The table maps each key to a weak reference (it keeps no node alive); a node's reference
    removes its entry when the node dies. (This is what weakref.WeakValueDictionary does, but
    its lookup is a Python function call, and every node built is looked up first. The
    reference's callback is a `functools.partial` holding the key: made in C, where a
    weakref.KeyedRef runs two Python functions for every new node.)"""

    cache: dict[tuple, weakref.ref] = {}

    def __call__(cls, op: Ops, dtype: DType, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        arg_key = arg
        if isinstance(arg, (int, float)):  # tested in C: most args are None, a buffer or a tuple
            arg_key = _arg_key(arg)
        key = (op, dtype, src, arg_key)
        reference = UOpMetaClass.cache.get(key)
        if reference is not None:
            existing = reference()
            if existing is not None:
                return existing
        # the fields are set in one C call: the frozen dataclass's __init__ is a Python call
        # that sets them one by one through object.__setattr__ (what it does, done at once)
        node = UOp.__new__(UOp)  # (the table is UOp's: UOp has no subclasses)
        object.__setattr__(node, "__dict__", {"op": op, "dtype": dtype, "src": src, "arg": arg})
        UOpMetaClass.cache[key] = weakref.ref(node, functools.partial(_forget_node, key))
        return node


# each constant's value as its dtype stores it (truncate_to rounds through numpy: slow next to
# the lookup of an existing node, and the same few constants, 0 and 1, come back all the time)
_TRUNCATED: dict[tuple[DType, Any], Any] = register_memo("uop.truncated", {})


def _forget_node(key: tuple, reference: weakref.ref,
                 cache: dict[tuple, weakref.ref] = UOpMetaClass.cache) -> None:
    """A node died: drop its entry, unless a new node with the same key has taken it. (The
    table is bound as a default: while the interpreter exits, module globals such as
    UOpMetaClass may already be None when the last nodes die.)"""
    if cache.get(key) is reference:
        cache.pop(key, None)


@dataclass(frozen=True, eq=False)
class UOp(metaclass=UOpMetaClass):
    """One node of the graph: an op, the dtype it produces, its sources and an op-specific arg."""

    op: Ops
    dtype: DType
    src: tuple[UOp, ...] = ()
    arg: Any = None

    def __repr__(self) -> str:
        return sym_str(self) if is_symbolic_int(self) else pretty(self)

    # ---- building nodes ----

    @staticmethod
    def const(dtype: DType, value: Any) -> UOp:
        key = (dtype, _arg_key(value))
        stored = _TRUNCATED.get(key)
        if stored is None:
            if len(_TRUNCATED) > 4096:  # a bound: a loop over many values makes many
                _TRUNCATED.clear()
            stored = _TRUNCATED[key] = truncate_to(dtype, value)
        return UOp(Ops.CONST, dtype, (), stored)

    def const_like(self, value: Any) -> UOp:
        """A constant with this node's dtype and shape (broadcast from a scalar)."""
        scalar = UOp.const(self.dtype, value)
        shape = self.shape
        if not shape:
            return scalar
        return scalar.reshape((1,) * len(shape)).expand(shape)

    def alu(self, op: Ops, *others: UOp) -> UOp:
        sources = (self, *others)
        shapes = {s.shape for s in sources}
        if len(shapes) > 1:
            raise ValueError(f"{op.name} needs equal shapes, got {[s.shape for s in sources]}")
        if op in COMPARISONS:
            dtype = dtypes.bool
        elif op is Ops.WHERE:
            dtype = others[0].dtype
        else:
            dtype = self.dtype
        return UOp(op, dtype, sources)

    def _operand(self, other: UOp | int | float | bool) -> UOp:
        return other if isinstance(other, UOp) else self.const_like(other)

    def __add__(self, other: UOp | int | float) -> UOp:
        return self.alu(Ops.ADD, self._operand(other))

    def __radd__(self, other: int | float) -> UOp:
        return self._operand(other).alu(Ops.ADD, self)

    def __mul__(self, other: UOp | int | float) -> UOp:
        return self.alu(Ops.MUL, self._operand(other))

    def __rmul__(self, other: int | float) -> UOp:
        return self._operand(other).alu(Ops.MUL, self)

    def __neg__(self) -> UOp:
        return self.alu(Ops.NEG)

    def __sub__(self, other: UOp | int | float) -> UOp:
        return self + (-self._operand(other))

    def __rsub__(self, other: int | float) -> UOp:
        return self._operand(other) + (-self)

    def __floordiv__(self, other: UOp | int) -> UOp:
        return self.alu(Ops.IDIV, self._operand(other))

    def __mod__(self, other: UOp | int) -> UOp:
        return self.alu(Ops.MOD, self._operand(other))

    def __and__(self, other: UOp | bool) -> UOp:
        return self.alu(Ops.AND, self._operand(other))

    def __or__(self, other: UOp | bool) -> UOp:
        return self.alu(Ops.OR, self._operand(other))

    def __xor__(self, other: UOp | bool | int) -> UOp:
        return self.alu(Ops.XOR, self._operand(other))

    def lt(self, other: UOp | int | float) -> UOp:
        return self.alu(Ops.CMPLT, self._operand(other))

    def ne(self, other: UOp | int | float) -> UOp:
        return self.alu(Ops.CMPNE, self._operand(other))

    def maximum(self, other: UOp | int | float) -> UOp:
        return self.alu(Ops.MAX, self._operand(other))

    def where(self, if_true: UOp | int | float, if_false: UOp | int | float) -> UOp:
        template = if_true if isinstance(if_true, UOp) else if_false
        if not isinstance(template, UOp):
            raise TypeError("where needs at least one UOp branch")
        return self.alu(Ops.WHERE, template._operand(if_true), template._operand(if_false))

    def cast(self, dtype: DType) -> UOp:
        return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        """The same bits read as `dtype`, which must have the same size (a CAST with arg
        BITCAST): float32 1.0 -> int32 1065353216."""
        if dtype.itemsize != self.dtype.itemsize:
            raise ValueError(f"a bitcast keeps the size: {self.dtype.name} has "
                             f"{self.dtype.itemsize} bytes, {dtype.name} {dtype.itemsize}")
        return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,), BITCAST)

    # ---- symbolic sizes: a Variable and its value ----

    def bind(self, value: int) -> UOp:
        """This variable with a value for one run (a BIND node): `Variable("i", 1, 64).bind(7)`.
        The value must lie in the variable's range."""
        if self.op is not Ops.DEFINE_VAR:
            raise TypeError(f"only a Variable can be bound, not a {self.op.name} node")
        name, low, high = self.arg
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"Variable {name!r} takes an int, not {value!r}")
        if not low <= value <= high:
            raise ValueError(f"Variable {name!r} is bound to {value}, outside its range "
                             f"[{low}, {high}]")
        return UOp(Ops.BIND, dtypes.int32, (self, UOp.const(dtypes.int32, value)))

    def unbind(self) -> tuple[UOp, int]:
        """(the variable, its value) of a bound variable."""
        if self.op is not Ops.BIND:
            raise TypeError(f"unbind() needs a bound Variable, not a {self.op.name} node")
        return self.src[0], int(self.src[1].arg)

    @property
    def expr(self) -> str:
        """A bound or unbound variable's name (tinygrad's `Variable.expr`)."""
        var = self.src[0] if self.op is Ops.BIND else self
        if var.op is not Ops.DEFINE_VAR:
            raise TypeError(f"a {self.op.name} node has no variable name")
        return str(var.arg[0])

    # ---- movement and reduction (shapes are checked by the Tensor layer) ----

    def reshape(self, shape: tuple[sint, ...]) -> UOp:
        shape = tuple(shape)
        return self if shape == self.shape else UOp(Ops.RESHAPE, self.dtype, (self,), shape)

    def permute(self, order: tuple[int, ...]) -> UOp:
        order = tuple(order)
        if order == tuple(range(len(order))):
            return self
        return UOp(Ops.PERMUTE, self.dtype, (self,), order)

    def expand(self, shape: tuple[sint, ...]) -> UOp:
        shape = tuple(shape)
        return self if shape == self.shape else UOp(Ops.EXPAND, self.dtype, (self,), shape)

    def pad(self, padding: tuple[tuple[sint, sint], ...]) -> UOp:
        padding = tuple((as_sint(b), as_sint(a)) for b, a in padding)
        if all(p == (0, 0) for p in padding):
            return self
        return UOp(Ops.PAD, self.dtype, (self,), padding)

    def shrink(self, bounds: tuple[tuple[sint, sint], ...]) -> UOp:
        bounds = tuple((as_sint(s), as_sint(e)) for s, e in bounds)
        if all(b == (0, s) for b, s in zip(bounds, self.shape)):
            return self
        return UOp(Ops.SHRINK, self.dtype, (self,), bounds)

    def flip(self, axes: tuple[int, ...]) -> UOp:
        return self if not axes else UOp(Ops.FLIP, self.dtype, (self,), tuple(sorted(axes)))

    def reduce(self, op: Ops, axes: tuple[int, ...]) -> UOp:
        if not axes:
            return self
        return UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, tuple(sorted(axes))))

    # ---- what a node knows about itself ----

    @cached_property
    def shape(self) -> tuple[int, ...]:
        """The sizes of the value. A symbolic size is an integer UOp over Variables (`sint`);
        the type says int, which almost every size is, so that code over int shapes
        type-checks. Code that may meet a symbolic size uses the sym_* helpers below."""
        fill_sources_first(self, "shape")
        return cast(tuple[int, ...], SHAPE_RULES.get(self.op, _same_shape)(self))

    @property
    def size(self) -> int:
        return cast(int, sym_prod(self.shape))

    @cached_property
    def has_symbols(self) -> bool:
        """Does this graph hold a Variable anywhere, as a node or in a size?"""
        fill_sources_first(self, "has_symbols")
        return _has_symbols(self)

    @property
    def toposort(self) -> list[UOp]:
        """Every node this one depends on, sources before users, each once (itself last)."""
        return [*self._ancestors, self]

    @cached_property
    def _ancestors(self) -> tuple[UOp, ...]:
        # the cache leaves the node itself out: a node holding itself would be a reference
        # cycle, freed only by Python's cycle collector, and the buffers of dead tensors would
        # linger until it runs. (It holds every ancestor: a pass that wants the order of many
        # nodes of one graph calls `toposort_of` once, not `.toposort` on each of them.)
        if all(not s.src or "_ancestors" in s.__dict__ for s in self.src):
            # each source's order is known, or it has no sources (as for `x + 1` on an eager
            # loop's fresh input): their union in source order, first appearance kept, is the
            # order the walk gives
            merged = dict.fromkeys(node for s in self.src for node in (*s._ancestors, s))
            return tuple(merged)
        return tuple(toposort_of([self])[:-1])

    @property
    def vmin(self) -> float | int:
        return self.bounds[0]

    @property
    def vmax(self) -> float | int:
        return self.bounds[1]

    @cached_property
    def bounds(self) -> tuple[float | int, float | int]:
        """(vmin, vmax): the smallest and largest value this node can take."""
        fill_sources_first(self, "bounds", _bounds_inputs)
        return value_bounds(self)

    def replace(self, **changes: Any) -> UOp:
        fields = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg}
        return UOp(**{**fields, **changes})

    def substitute(self, replacements: dict[UOp, UOp]) -> UOp:
        """This graph with some nodes swapped for others (the nodes above them rebuilt)."""
        done: dict[UOp, UOp] = {}
        for node in self.toposort:
            if node in replacements:
                done[node] = replacements[node]
            else:
                sources = tuple(done[s] for s in node.src)
                done[node] = node if sources == node.src else node.replace(src=sources)
        return done[self]


# ---- walking a graph without recursion ----
# A 100,000-op chain is an ordinary graph, and Python allows only ~1,000 nested calls: every
# walk over a graph keeps its own stack of nodes to visit.

def toposort_of(roots: list[UOp]) -> list[UOp]:
    """Every node the roots depend on, sources before users, each once (the roots included,
    each after its sources). Nothing is cached on the nodes."""
    order: dict[UOp, None] = {}
    stack: list[tuple[UOp, bool]] = [(root, False) for root in reversed(roots)]
    while stack:
        node, sources_done = stack.pop()
        if node in order:
            continue
        if sources_done:
            order[node] = None
            continue
        stack.append((node, True))
        stack.extend((s, False) for s in reversed(node.src) if s not in order)
    return list(order)


def all_sources(node: UOp) -> tuple[UOp, ...]:
    return node.src


def fill_sources_first(node: UOp, name: str,
                       inputs: Callable[[UOp], tuple[UOp, ...]] = all_sources) -> None:
    """Compute the cached property `name` of everything below `node` that lacks it, deepest
    first: a property whose rule reads its sources' values then never recurses more than one
    level (asked at the top of a 100,000-deep chain, it would otherwise recurse 100,000 deep).
    `inputs(n)`: the sources whose value n's rule reads."""
    stack = [s for s in inputs(node) if name not in s.__dict__]
    while stack:
        current = stack[-1]
        missing = [s for s in inputs(current) if name not in s.__dict__]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        getattr(current, name)  # its inputs are known: computing it is one shallow step


# ---- shapes: each op's rule for the shape it produces ----

def _same_shape(node: UOp) -> tuple[int, ...]:
    return node.src[0].shape if node.src else ()


def _reduce_shape(node: UOp) -> tuple[int, ...]:
    axes = node.arg[1]
    return tuple(1 if i in axes else s for i, s in enumerate(node.src[0].shape))


def _permute_shape(node: UOp) -> tuple[int, ...]:
    return tuple(node.src[0].shape[i] for i in node.arg)


def _pad_shape(node: UOp) -> tuple[sint, ...]:
    return tuple(sym_add(sym_add(s, b), a) for s, (b, a) in zip(node.src[0].shape, node.arg))


def _shrink_shape(node: UOp) -> tuple[sint, ...]:
    return tuple(sym_sub(end, start) for start, end in node.arg)


SHAPE_RULES = {
    Ops.BUFFER: lambda node: (node.arg.size,),
    Ops.DEFINE_GLOBAL: lambda node: (node.arg[1],),
    Ops.CONST: lambda node: (),
    Ops.RESHAPE: lambda node: tuple(node.arg),
    Ops.EXPAND: lambda node: tuple(node.arg),
    Ops.PERMUTE: _permute_shape,
    Ops.PAD: _pad_shape,
    Ops.SHRINK: _shrink_shape,
    Ops.REDUCE_AXIS: _reduce_shape,
    Ops.WHERE: lambda node: node.src[1].shape,
}
SHAPE_RULES[Ops.DEFINE_LOCAL] = lambda node: (node.arg[1],)
for _op in (Ops.RANGE, Ops.LOAD, Ops.STORE, Ops.SINK, Ops.DEFINE_ACC, Ops.ACCUMULATE, Ops.REDUCE,
            Ops.END_RANGE, Ops.SPECIAL, Ops.BARRIER, Ops.WMMA):
    SHAPE_RULES[_op] = lambda node: ()  # inside a lowered kernel every value is a scalar


# ---- value bounds of integer index arithmetic (used by the simplifier) ----

def _bounds_inputs(node: UOp) -> tuple[UOp, ...]:
    """The sources whose bounds `node`'s rule reads (a LOAD's index says nothing about it)."""
    return node.src if node.op in BOUNDS_FROM_SOURCES else ()


def value_bounds(node: UOp) -> tuple[float | int, float | int]:
    """The smallest and largest value `node` can take, or the dtype's limits if unknown."""
    rule = BOUNDS_RULES.get(node.op)
    if rule is not None:
        bounds = rule(node)
        if bounds is not None:
            return bounds
    return node.dtype.min, node.dtype.max


def _bounds_mul(node: UOp) -> tuple[float | int, float | int]:
    a, b = node.src
    corners = [x * y for x in (a.vmin, a.vmax) for y in (b.vmin, b.vmax)
               if not (math.isinf(x) or math.isinf(y))]
    if len(corners) < 4:
        return node.dtype.min, node.dtype.max
    return min(corners), max(corners)


def _bounds_idiv(node: UOp) -> tuple[float | int, float | int] | None:
    a, b = node.src
    if b.op is Ops.CONST and b.arg > 0 and a.vmin >= 0:
        return a.vmin // b.arg, a.vmax // b.arg
    return None


def _bounds_mod(node: UOp) -> tuple[float | int, float | int] | None:
    a, b = node.src
    if b.op is Ops.CONST and b.arg > 0 and a.vmin >= 0:
        return (0, b.arg - 1) if a.vmax >= b.arg else (a.vmin, a.vmax)
    return None


def float_divide(a: float, b: float) -> float:
    """FDIV on Python floats, as IEEE 754 defines it (Python raises ZeroDivisionError for
    x/0): x/0 is inf with the sign of x times the sign of the zero, 0/0 and nan/0 are NaN.
    A float32 quotient computed in float64 and then rounded to float32 is the correctly rounded
    float32 quotient (float64 has more than 2*24+2 bits), so constant folding agrees with the
    devices bit for bit."""
    if b != 0:
        return a / b
    if a != a or a == 0:
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _bounds_fdiv(node: UOp) -> tuple[float | int, float | int] | None:
    """A float divided by a finite nonzero constant: the ends divided (swapped if negative)."""
    a, b = node.src
    if b.op is not Ops.CONST or b.arg == 0 or not math.isfinite(b.arg):
        return None
    low, high = float_divide(a.vmin, b.arg), float_divide(a.vmax, b.arg)
    return (low, high) if b.arg > 0 else (high, low)


BOUNDS_RULES = {
    Ops.CONST: lambda node: (node.arg, node.arg),
    Ops.RANGE: lambda node: (0, sym_max(node.arg[2]) - 1),
    Ops.DEFINE_VAR: lambda node: (node.arg[1], node.arg[2]),
    Ops.BIND: lambda node: node.src[0].bounds,
    Ops.SPECIAL: lambda node: (0, node.arg[2] - 1),
    Ops.ADD: lambda node: (node.src[0].vmin + node.src[1].vmin,
                           node.src[0].vmax + node.src[1].vmax),
    Ops.NEG: lambda node: (-node.src[0].vmax, -node.src[0].vmin),
    Ops.MUL: _bounds_mul,
    Ops.IDIV: _bounds_idiv,
    Ops.FDIV: _bounds_fdiv,
    Ops.MOD: _bounds_mod,
    Ops.MAX: lambda node: (max(node.src[0].vmin, node.src[1].vmin),
                           max(node.src[0].vmax, node.src[1].vmax)),
    Ops.CMPLT: lambda node: (False, True),
    Ops.CMPNE: lambda node: (False, True),
}
BOUNDS_FROM_SOURCES = (Ops.ADD, Ops.NEG, Ops.MUL, Ops.IDIV, Ops.FDIV, Ops.MOD, Ops.MAX,
                       Ops.BIND)


# ---- the parts of a LOAD and a STORE ----
# LOAD:  (buffer, index), then an optional guard (a bool: where it is false the load reads nothing
#        and gives 0), then, for shared memory, the BARRIER it must wait for.
# STORE: (buffer, index, value), then an optional gate (a bool: where it is false nothing is
#        written), then the BARRIER it must wait for, if any. A buffer is a DEFINE_GLOBAL (a
#        kernel parameter) or a DEFINE_LOCAL. A barrier in a LOAD or STORE orders, it is no
#        operand: the access comes after every thread of the group passed it.

@dataclass(frozen=True)
class LoadParts:
    buffer: UOp
    index: UOp
    valid: UOp | None
    barrier: UOp | None


@dataclass(frozen=True)
class StoreParts:
    buffer: UOp
    index: UOp
    value: UOp
    gate: UOp | None
    barrier: UOp | None


def load_parts(load: UOp) -> LoadParts:
    """A LOAD's buffer, index, guard (or None) and barrier (or None)."""
    rest = load.src[2:]
    barrier = rest[-1] if rest and rest[-1].op is Ops.BARRIER else None
    guards = rest[:-1] if barrier is not None else rest
    return LoadParts(load.src[0], load.src[1], guards[0] if guards else None, barrier)


def store_parts(store: UOp) -> StoreParts:
    """A STORE's buffer, index, value, gate (or None) and barrier (or None)."""
    rest = store.src[3:]
    barrier = rest[-1] if rest and rest[-1].op is Ops.BARRIER else None
    gates = rest[:-1] if barrier is not None else rest
    return StoreParts(store.src[0], store.src[1], store.src[2], gates[0] if gates else None,
                      barrier)


# ---- printing ----

def pretty(root: UOp, max_nodes: int = 60) -> str:
    """Print a graph one node per line, sources first; repeated nodes are referred to by number."""
    nodes = root.toposort[-max_nodes:]
    number = {node: i for i, node in enumerate(nodes)}
    lines = []
    for node in nodes:
        sources = ", ".join(f"%{number[s]}" if s in number else "..." for s in node.src)
        arg = "" if node.arg is None else f" arg={_short_arg(node.arg)}"
        lines.append(f"%{number[node]} = {node.op.name}:{node.dtype.name}({sources}){arg}")
    return "\n".join(lines)


def _short_arg(arg: Any) -> str:
    if isinstance(arg, tuple) and arg and isinstance(arg[0], Ops):
        return f"({arg[0].name}, {arg[1]})"
    return str(arg)


# ---- the buffer under a tensor's reshapes ----

def base_buffer(node: UOp) -> UOp | None:
    """The BUFFER node that `node` is a chain of RESHAPEs of (`node` itself when it is one), or
    None when it is anything else. A reshape keeps row-major order, so such a node's values are
    exactly its buffer's memory: what realize() leaves in a tensor, what assign() writes into,
    what a JIT hands to its kernels. (The node, not the Buffer: device.py is a layer above.)"""
    while node.op is Ops.RESHAPE:
        node = node.src[0]
    if node.op is Ops.SHRINK and node.src[0].op is Ops.BUFFER and node.arg[0][0] == 0 and \
            isinstance(node.arg[0][1], UOp):
        node = node.src[0]  # a symbolic shape's buffer: sized for the largest value, its
        # values are the first elements (`symbolic_view`)
    return node if node.op is Ops.BUFFER else None


def symbolic_view(buffer_node: UOp, shape: tuple[sint, ...]) -> UOp:
    """A BUFFER node read as `shape`: reshaped, or, when the shape is symbolic (the buffer
    holds room for the largest value), its first prod(shape) elements, reshaped."""
    count = sym_prod(shape)
    if isinstance(count, UOp):
        buffer_node = buffer_node.shrink(((0, count),))
    return buffer_node.reshape(shape)


# ---- symbolic sizes: Variables, and arithmetic on sizes that may be variables ----
# A size is an int or an integer UOp over Variables (`sint`): `Variable("i", 1, 64)` is a
# DEFINE_VAR node, `.bind(7)` gives a BIND node (the variable and its value for one run), and
# `v * 4`, `v + 1` are ordinary ALU nodes. A shape may then be (i, 4). Shapes of plain ints stay
# plain ints: the helpers below fold ints as Python ints, and touch UOps only when one is there.

sint = int | UOp
SYMBOLIC_OPS = (Ops.DEFINE_VAR, Ops.BIND, Ops.CONST, Ops.ADD, Ops.MUL, Ops.NEG, Ops.IDIV,
                Ops.MOD, Ops.MAX)


def Variable(name: str, min_val: int, max_val: int) -> UOp:
    """An integer variable that takes values in [min_val, max_val] (tinygrad's `Variable`): a
    size it stands in is compiled once, for every value, and a buffer it sizes is allocated for
    `max_val`. Give it a value for one run with `.bind(value)`."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a Variable's name must be an identifier (it becomes a kernel "
                         f"parameter), not {name!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (min_val, max_val)):
        raise TypeError(f"Variable {name!r} needs int bounds, got {min_val!r}, {max_val!r}")
    if not 0 <= min_val <= max_val:
        raise ValueError(f"Variable {name!r} needs 0 <= min <= max, got [{min_val}, {max_val}]")
    return UOp(Ops.DEFINE_VAR, dtypes.int32, (), (name, min_val, max_val))


def as_sint(value: Any) -> sint:
    """A size as given: a UOp stays symbolic, anything else becomes an int."""
    return value if isinstance(value, UOp) else int(value)


def is_symbolic_int(node: UOp) -> bool:
    """Is `node` an integer expression over Variables (a symbolic size such as `i*4`)?"""
    if node.dtype != dtypes.int32 or node.op not in SYMBOLIC_OPS or node.op is Ops.CONST:
        return False
    nodes = node.toposort
    return all(n.op in SYMBOLIC_OPS for n in nodes) and \
        any(n.op is Ops.DEFINE_VAR for n in nodes)


def _split_const(x: UOp) -> tuple[UOp, int]:
    """x = base + c, for a base and an int c (c = 0 when x adds no constant)."""
    if x.op is Ops.ADD and x.src[1].op is Ops.CONST:
        return x.src[0], int(x.src[1].arg)
    return x, 0


def sym_add(a: sint, b: sint) -> sint:
    """a + b, folded: ints add as ints, (x + 1) + 2 is x + 3, x + 0 is x."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, int):
        a, b = b, a
    assert isinstance(a, UOp)
    if isinstance(b, int):
        base, c = _split_const(a)
        return base if c + b == 0 else base + (c + b)
    return a + b


def sym_sub(a: sint, b: sint) -> sint:
    """a - b, folded: (x + 1) - x is 1, x - x is 0."""
    if isinstance(b, int):
        return sym_add(a, -b)
    if isinstance(a, UOp):
        (base_a, ca), (base_b, cb) = _split_const(a), _split_const(b)
        if base_a is base_b:
            return ca - cb
    return sym_add(a, b * -1)


def sym_mul(a: sint, b: sint) -> sint:
    """a * b, folded: ints multiply as ints, x * 1 is x, (x * 2) * 3 is x * 6."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int):
        a, b = b, a
    assert isinstance(a, UOp)
    if isinstance(b, int):
        if b in (0, 1):
            return 0 if b == 0 else a
        if a.op is Ops.MUL and a.src[1].op is Ops.CONST:
            return a.src[0] * (int(a.src[1].arg) * b)
        return a * b
    return a * b


def sym_prod(sizes: Any) -> sint:
    """The product of sizes: the int factors first, as one int, times the symbolic ones in
    order (so (i, 4) and (4, i) both give i*4: equal counts are the same node)."""
    constant, symbols = 1, []
    for size in sizes:
        if isinstance(size, UOp):
            symbols.append(size)
        else:
            constant *= int(size)
    if not symbols:
        return constant
    total: sint = symbols[0]
    for symbol in symbols[1:]:
        total = sym_mul(total, symbol)
    return sym_mul(total, constant)


def sym_max(size: sint) -> int:
    """The largest value a size can take (its own value for an int)."""
    return size if isinstance(size, int) else int(size.vmax)


def sym_min(size: sint) -> int:
    return size if isinstance(size, int) else int(size.vmin)


def _c_div(a: int, b: int) -> int:
    return 0 if b == 0 else int(a / b) if abs(a) < 2 ** 52 else (abs(a) // abs(b)) * (
        1 if (a >= 0) == (b > 0) else -1)


_EVAL_RULES: dict[Ops, Callable[..., int]] = {
    Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.NEG: lambda a: -a,
    Ops.MAX: max, Ops.IDIV: _c_div, Ops.MOD: lambda a, b: 0 if b == 0 else a - _c_div(a, b) * b,
}


def sym_eval(size: sint, values: dict[str, int] | None = None) -> int:
    """The value of a size: a bound variable has its own value, an unbound one the value
    `values` gives its name (a clear error if none does)."""
    if isinstance(size, int):
        return size
    result: dict[UOp, int] = {}
    bound = {n.src[0]: int(n.src[1].arg) for n in size.toposort if n.op is Ops.BIND}
    for node in size.toposort:
        if node.op is Ops.BIND:
            result[node] = int(node.src[1].arg)
        elif node.op is Ops.DEFINE_VAR:
            name = node.arg[0]
            if values is not None and name in values:
                result[node] = int(values[name])
            elif node in bound:
                result[node] = bound[node]
            else:
                raise ValueError(f"Variable {name!r} has no value here: bind it "
                                 f"(`v.bind(n)`) before its size is needed")
        elif node.op is Ops.CONST:
            result[node] = int(node.arg)
        elif node.op in _EVAL_RULES:
            result[node] = _EVAL_RULES[node.op](*(result[s] for s in node.src))
        else:
            raise ValueError(f"a size cannot contain a {node.op.name} node")
    return result[size]


def sym_shape_eval(shape: tuple[sint, ...], values: dict[str, int] | None = None) -> tuple[
        int, ...]:
    """A shape with every size evaluated (see `sym_eval`)."""
    return tuple(sym_eval(s, values) for s in shape)


_SYMBOL = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%"}


def sym_str(size: sint) -> str:
    """A size as people write it: `4`, `i`, `(i+1)`, `(i*4)`; a bound variable prints as
    its name (`i`): the name is what stays the same from one run to the next."""
    if isinstance(size, int):
        return str(size)
    text: dict[UOp, str] = {}
    for node in size.toposort:
        if node.op in (Ops.DEFINE_VAR, Ops.BIND):
            text[node] = node.expr
        elif node.op is Ops.CONST:
            text[node] = str(node.arg)
        elif node.op is Ops.NEG:
            text[node] = f"(-{text[node.src[0]]})"
        elif node.op is Ops.MAX:
            text[node] = f"max({text[node.src[0]]}, {text[node.src[1]]})"
        elif node.op in _SYMBOL:
            a, b = (text[s] for s in node.src)
            text[node] = f"({a}{_SYMBOL[node.op]}{b})"
        else:
            text[node] = node.op.name
    return text[size]


def describe_size(size: sint) -> str:
    """A size with the ranges of its Variables, for error messages: `4`, `n in [1, 64]`,
    `(n*4) with n in [1, 64]` (two Variables may share a name and differ in range)."""
    if isinstance(size, int):
        return str(size)
    ranges = ", ".join(f"{v.arg[0]} in [{v.arg[1]}, {v.arg[2]}]" for v in variables_of([size]))
    if size.op in (Ops.DEFINE_VAR, Ops.BIND):
        return ranges
    return f"{sym_str(size)} with {ranges}"


def shape_str(shape: tuple[sint, ...]) -> str:
    """`(i, 4)`: a shape with its symbolic sizes by name."""
    inner = ", ".join(sym_str(s) for s in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def _arg_uops(arg: Any) -> list[UOp]:
    """The UOps inside a movement op's or a loop's arg (symbolic sizes), one level of tuples."""
    found: list[UOp] = []
    items = arg if isinstance(arg, tuple) else (arg,)
    for item in items:
        if isinstance(item, UOp):
            found.append(item)
        elif isinstance(item, tuple):
            found.extend(x for x in item if isinstance(x, UOp))
    return found


def _map_arg(arg: Any, change: Callable[[UOp], sint]) -> Any:
    if isinstance(arg, UOp):
        return change(arg)
    if isinstance(arg, tuple):
        return tuple(_map_arg(item, change) for item in arg)
    return arg


SIZED_OPS = MOVEMENT + (Ops.RANGE,)  # the ops whose arg may hold a symbolic size


def variables_of(roots: list[UOp]) -> list[UOp]:
    """The Variables (DEFINE_VAR nodes) a graph uses, as sources or inside its sizes, by name."""
    found: dict[UOp, None] = {}
    for node in toposort_of(roots):
        inner = _arg_uops(node.arg) if node.op in SIZED_OPS else []
        for n in [node, *(m for expr in inner for m in expr.toposort)]:
            if n.op is Ops.DEFINE_VAR:
                found[n] = None
    return sorted(found, key=lambda v: v.arg[0])


def substitute_symbols(roots: list[UOp], replace: dict[UOp, UOp]) -> list[UOp]:
    """The graphs of `roots` with some nodes replaced, as sources *and* inside the sizes of
    movement ops and loops; a size left with no Variable in it becomes an int again.
    (Unbinding a graph replaces each BIND by its variable; binding replaces each variable
    by a BIND or a CONST.)"""
    done: dict[UOp, UOp] = {}

    def change_size(expr: UOp) -> sint:
        new = expr.substitute(replace)
        if any(n.op in (Ops.DEFINE_VAR, Ops.BIND) for n in new.toposort):
            return new
        return sym_eval(new)
    for node in toposort_of(roots):
        if node in replace:
            done[node] = replace[node]
            continue
        sources = tuple(done[s] for s in node.src)
        arg = node.arg
        if node.op in SIZED_OPS and _arg_uops(arg):
            arg = _map_arg(arg, change_size)
        if sources == node.src and arg == node.arg:
            done[node] = node
        else:
            done[node] = node.replace(src=sources, arg=arg)
    return [done[r] for r in roots]


def binds_of(roots: list[UOp]) -> list[UOp]:
    """Every BIND node of a graph, as a source or inside a size."""
    found: dict[UOp, None] = {}
    for node in toposort_of(roots):
        inner = _arg_uops(node.arg) if node.op in SIZED_OPS else []
        for n in [node, *(m for expr in inner for m in expr.toposort)]:
            if n.op is Ops.BIND:
                found[n] = None
    return list(found)


def unbind_graph(roots: list[UOp]) -> tuple[list[UOp], dict[str, int]]:
    """The graph with each bound variable replaced by the variable itself, and the values
    (`var_vals`: name -> value). Kernels are built from the unbound graph, so every value of
    a variable gives the same kernels; the values are passed when they launch."""
    binds = binds_of(roots)
    if not binds:
        return roots, {}
    var_vals: dict[str, int] = {}
    for bind in binds:
        var, value = bind.unbind()
        name = var.arg[0]
        if var_vals.setdefault(name, value) != value:
            raise ValueError(f"Variable {name!r} is bound to both {var_vals[name]} and {value} "
                             "in one graph")
    return substitute_symbols(roots, {b: b.src[0] for b in binds}), var_vals


def _has_symbols(node: UOp) -> bool:
    if node.op in (Ops.DEFINE_VAR, Ops.BIND):
        return True
    if node.op in SIZED_OPS and _arg_uops(node.arg):
        return True
    return any(s.has_symbols for s in node.src)


# ---- loops and accumulators, as lowering (codegen/) writes them ----

def make_range(kind: str, number: int, size: sint) -> UOp:
    """A loop counter: `kind` is 'g' for an output axis, 'r' for a reduced one, 'v' for vector
    lanes, 'w' for an output axis whose every element is computed by a whole work-group (a
    group reduction: on a GPU, a loop over work-groups instead of threads), 'c' for the
    columns of a row that each thread of the row's work-group stores (a plain loop)."""
    return UOp(Ops.RANGE, dtypes.int32, (), (kind, number, size))


def identity_element(op: Ops, dtype: DType) -> float | int | bool:
    """What an accumulator starts from: 0 for a sum, the smallest value for a max."""
    return 0 if op is Ops.ADD else dtype.min

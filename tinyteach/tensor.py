"""Chapter 1 (part 1): Tensors — a PyTorch-like API built from the primitive ops.

What this teaches:
- a Tensor is a handle on a lazy UOp graph plus a device; building `(a + b).relu()` computes
  nothing. `realize()`, `numpy()`, `item()` or `tolist()` schedule the graph into kernels and run
  them (chapters 6-9);
- everything — softmax, conv2d, cross-entropy, random numbers, even `arange` — is composed
  from the 28 primitive ops of uop.py. No numpy call computes a result behind your back; numpy is
  only used to bring data in and take it out;
- broadcasting and dtype promotion happen here, once, before the graph is built, so every op
  below sees operands of equal shape and dtype;
- `requires_grad`, `backward()` and `.grad` work as in PyTorch (chapter 2 has the rules).

This file is the core: making a Tensor, running its graph, the primitive movement and
elementwise ops, reduction, and the entry to autograd. The rest of the API is composed from it,
one part per file, each a class that Tensor inherits from (a "mixin"), each building on the one
before: tensor_create.py (part 4: full, arange, random numbers), tensor_movement.py (part 5:
transpose, cat, split, gather), tensor_math.py (part 6: exp, activations, rounding, pow, sum,
mean, argmax, cumsum) and tensor_nn.py (part 7: matmul, conv2d, pooling, softmax, normalization,
losses). dtype.py (part 2) and indexing.py (part 3) complete the chapter.

Builds on: everything below (uop, gradient, realize). Used by: nn/, jit.py and every notebook.

>>> from tinyteach import Tensor
>>> a = Tensor([[1.0, 2.0], [3.0, 4.0]])
>>> (a @ a).tolist()
[[7.0, 10.0], [15.0, 22.0]]
>>> a.sum(axis=1).numpy().tolist()
[3.0, 7.0]
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from tinyteach.device import Buffer, Device
from tinyteach.dtype import DType, dtypes, least_upper_dtype, least_upper_float
from tinyteach.gradient import compute_gradient, graph_before_realize, reachable_by_gradient
from tinyteach.helpers import Context, prod
from tinyteach.realize import realize_uops
from tinyteach.schedule import device_of, is_contiguous_buffer
from tinyteach.tensor_nn import TensorNN
from tinyteach.uop import Ops, UOp

Scalar = int | float | bool
TensorLike = "Tensor | Scalar"
ShapeArg = int | Sequence[int]


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcasting rule: align from the right; sizes must match or be 1."""
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + s for s in shapes]
    result = []
    for sizes in zip(*padded):
        non_one = {s for s in sizes if s != 1}
        if len(non_one) > 1:
            raise ValueError(f"cannot broadcast shapes {' and '.join(map(str, shapes))}: "
                             f"sizes {sorted(non_one)} differ on one axis")
        result.append(non_one.pop() if non_one else 1)
    return tuple(result)


class _NoGrad:
    """What `Tensor.no_grad` gives: true while gradients are switched off, and a context
    manager that switches them off inside a `with` block, then restores the previous state."""

    def __init__(self, active: bool):
        self.active = active

    def __bool__(self) -> bool:
        return self.active

    def __repr__(self) -> str:
        return f"<Tensor.no_grad: {self.active}>"

    def __call__(self) -> _NoGrad:
        return self

    def __enter__(self) -> None:
        self.previous = _TensorType.no_grad_active
        _TensorType.no_grad_active = True

    def __exit__(self, *args: object) -> None:
        _TensorType.no_grad_active = self.previous


class _TensorType(type):
    """Makes `Tensor.no_grad` work both ways: `Tensor.no_grad = True` (tinygrad) switches
    gradients off until set back, `with Tensor.no_grad:` (torch.no_grad) for one block."""

    no_grad_active = False

    @property
    def no_grad(cls) -> _NoGrad:
        return _NoGrad(_TensorType.no_grad_active)

    @no_grad.setter
    def no_grad(cls, value: object) -> None:
        _TensorType.no_grad_active = bool(value)


class _Train(contextlib.ContextDecorator):
    """`with Tensor.train():` (or `@Tensor.train()` on a function) turns on training behaviour
    (dropout, batchnorm statistics)."""

    def __init__(self, mode: bool = True):
        self.mode = mode
        self._context = Context(TRAINING=int(mode))

    def __enter__(self) -> None:
        self.previous = Tensor.training
        Tensor.training = self.mode
        self._context.__enter__()

    def __exit__(self, *args: Any) -> None:
        self._context.__exit__(*args)
        Tensor.training = self.previous


class Tensor(TensorNN, metaclass=_TensorType):
    """A lazily computed n-dimensional array on a device, with reverse-mode autograd.
    The methods not defined here come from the parts it inherits (see the module docstring)."""

    training: ClassVar[bool] = False
    # tensors with requires_grad=True, by id (a WeakSet would compare tensors with ==, which
    # builds a graph instead of answering True or False)
    _needs_grad: ClassVar[weakref.WeakValueDictionary[int, Tensor]] = \
        weakref.WeakValueDictionary()
    # tensors backward() was called on: realized together with a later assign to their inputs,
    # so `loss.backward(); optim.step(); loss.item()` reports the loss before the step
    _losses: ClassVar[weakref.WeakValueDictionary[int, Tensor]] = weakref.WeakValueDictionary()
    __hash__ = object.__hash__  # `==` builds a graph, so hashing is by identity

    def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None,
                 requires_grad: bool | None = None):
        wanted = None if dtype is None else dtypes.as_dtype(dtype)
        self.device = Device.canonicalize(device)
        if isinstance(data, UOp):
            self.uop = data if wanted is None else data.cast(wanted)
        elif isinstance(data, Tensor):
            self.uop = data.to(self.device).uop if wanted is None else data.cast(wanted).uop
        elif isinstance(data, (bool, int, float, np.bool_, np.integer, np.floating)):
            self.uop = UOp.const(wanted or dtypes.from_py(data), data)
        else:
            self.uop = _uop_from_data(data, wanted, self.device)
        self.grad: Tensor | None = None
        self._lazy: UOp | None = None  # the graph before realize, kept for backward()
        self.requires_grad = requires_grad

    @property
    def requires_grad(self) -> bool | None:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        if value:
            if not dtypes.is_float(self.dtype):
                raise TypeError(f"only float tensors can require gradients, not {self.dtype}")
            if not is_contiguous_buffer(self.uop):
                self._requires_grad = None  # realized as a plain tensor, with no graph kept
                self._become_leaf()
            Tensor._needs_grad[id(self)] = self
        self._requires_grad = value

    def _become_leaf(self) -> None:
        """Compute this tensor into a buffer of its own and forget how it was made, as a
        PyTorch leaf. UOps are shared (hash-consed) and realized graphs are remembered:
        `zeros(2)` is the same node, and realizes to the same buffer, as every other
        `zeros(2)`; only a fresh buffer tells one parameter from another."""
        self.uop = _uop_from_data(self.numpy(), self.dtype, self.device)  # a copy, no math
        self._lazy = None

    # ---- what a tensor is ----

    @property
    def shape(self) -> tuple[int, ...]:
        return self.uop.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return prod(self.shape)

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        return self.shape if dim is None else self.shape[self._axis(dim)]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        state = "realized" if is_contiguous_buffer(self.uop) else "lazy"
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"<Tensor {state} shape={self.shape} dtype={self.dtype} device={self.device}{grad}>"

    # ---- running the graph ----

    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and `others`): `t.realize()` or `Tensor.realize(a, b, c)`."""
        tensors = [self, *others]
        pending = [t for t in tensors if not is_contiguous_buffer(t.uop)]
        pending += _losses_reading_assigned(pending, Tensor._losses.values())
        if pending:
            results = realize_uops([t.uop for t in pending], self.device)
            for tensor, result in zip(pending, results):
                if tensor.requires_grad is not None or tensor.uop.op is not Ops.BUFFER:
                    tensor._lazy = tensor._lazy or tensor.uop
                lazy = tensor._lazy or tensor.uop
                if tensor.requires_grad and id(tensor) not in Tensor._needs_grad and \
                        result is not lazy:  # a view of a buffer is its own graph: no loop
                    # graphs built on this tensor now start at its buffer: remember the graph
                    # behind it, so backward() still reaches the parameters (as PyTorch does)
                    _graph_behind[result] = lazy
                tensor.uop = result
        return self

    def _buffer(self) -> Buffer:
        node = self.realize().uop
        if not is_contiguous_buffer(node):  # a view of a buffer: copy it into a fresh one
            node = self.contiguous().realize().uop
        while node.op is Ops.RESHAPE:
            node = node.src[0]
        buffer: Buffer = node.arg
        return buffer

    def numpy(self) -> np.ndarray:
        """Compute the tensor and return its values as a numpy array (a copy)."""
        return self._buffer().numpy().reshape(self.shape)

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with exactly one element, not shape "
                             f"{self.shape}")
        value = self.numpy().reshape(-1)[0]
        return value.item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, device: str) -> Tensor:
        """This tensor on another device (a COPY node; nothing moves until realized)."""
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        result = Tensor(UOp(Ops.COPY, self.dtype, (self.uop,), device), device)
        result._inherit_grad(self)
        return result

    def detach(self) -> Tensor:
        return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)), self.device)

    def contiguous(self) -> Tensor:
        return self._apply(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), self)

    def clone(self) -> Tensor:
        return self.contiguous()

    # ---- building results ----

    def _apply(self, uop: UOp, *sources: Tensor) -> Tensor:
        if Tensor.no_grad and any(s.requires_grad for s in sources):
            uop = UOp(Ops.DETACH, uop.dtype, (uop,))  # made under no_grad: gradients stop here
        result = Tensor(uop, self.device)
        result._inherit_grad(*sources)
        return result

    def _inherit_grad(self, *sources: Tensor) -> None:
        if not Tensor.no_grad and any(s.requires_grad for s in sources):
            self._requires_grad = True

    def _const(self, value: Scalar, dtype: DType | None = None) -> Tensor:
        """A scalar constant broadcast to this tensor's shape."""
        node = UOp.const(dtype or self.dtype, value)
        shape = self.shape
        if shape:
            node = node.reshape((1,) * len(shape)).expand(shape)
        return Tensor(node, self.device)

    def _axis(self, axis: int, ndim: int | None = None) -> int:
        ndim = self.ndim if ndim is None else ndim
        if not -max(ndim, 1) <= axis < max(ndim, 1):
            raise IndexError(f"axis {axis} is out of range for a tensor with {ndim} dimensions "
                             f"(shape {self.shape})")
        return axis % max(ndim, 1)

    def _axes(self, axis: int | Sequence[int] | None) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        normalized = tuple(self._axis(a) for a in axes)
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"repeated axis in {axes}")
        return normalized

    # ---- movement: the six primitive movement ops (the rest are in tensor_movement.py) ----

    def reshape(self, *shape: Any) -> Tensor:
        new_shape = list(_shape_from_maybe_negative(shape))
        if new_shape.count(-1) > 1:
            raise ValueError(f"reshape: only one -1 allowed, got {tuple(new_shape)}")
        if -1 in new_shape:
            known = prod(s for s in new_shape if s != -1)
            if known == 0 or self.numel() % known:
                raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) "
                                 f"to {tuple(new_shape)}")
            new_shape[new_shape.index(-1)] = self.numel() // known
        if prod(new_shape) != self.numel():
            raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to "
                             f"{tuple(new_shape)} ({prod(new_shape)} elements)")
        return self._apply(self.uop.reshape(tuple(new_shape)), self)

    def permute(self, *order: Any) -> Tensor:
        axes = _shape_from_maybe_negative(order)
        normalized = tuple(self._axis(a) for a in axes)
        if sorted(normalized) != list(range(self.ndim)):
            raise ValueError(f"permute order {axes} is not a permutation of the {self.ndim} "
                             f"axes of shape {self.shape}")
        return self._apply(self.uop.permute(normalized), self)

    def expand(self, *shape: Any) -> Tensor:
        wanted = _shape_from_maybe_negative(shape)
        if len(wanted) < self.ndim:
            raise ValueError(f"cannot expand {self.shape} to fewer dimensions {wanted}")
        current = (1,) * (len(wanted) - self.ndim) + self.shape
        target = tuple(c if w == -1 else w for c, w in zip(current, wanted))
        for c, t in zip(current, target):
            if c != t and c != 1:
                raise ValueError(f"cannot expand shape {self.shape} to {wanted}: only axes of "
                                 f"size 1 can be expanded")
        reshaped = self.reshape(current)
        return self._apply(reshaped.uop.expand(target), self)

    def pad(self, padding: Sequence[Any], mode: str = "constant", value: Scalar = 0) -> Tensor:
        """`padding` is ((before, after) or None per axis), or PyTorch's flat form
        (left, right, top, bottom, ...) that starts from the last axis. `mode` is "constant"
        (fill with `value`), or "reflect", "replicate", "circular" (tensor_movement.py)."""
        if isinstance(mode, (int, float)):  # tinygrad's old pad(padding, value) order
            mode, value = "constant", mode
        pairs = _padding_pairs(padding, self.ndim)
        if mode != "constant":
            if value != 0:
                raise ValueError(f"pad mode {mode!r} takes no fill value (got value={value})")
            return self._pad_edges(pairs, mode)
        if any(b < 0 or a < 0 for b, a in pairs):
            cropped = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape))
            return self.shrink(cropped).pad([(max(0, b), max(0, a)) for b, a in pairs],
                                            value=value)
        padded = self._apply(self.uop.pad(tuple(pairs)), self)
        if value == 0:
            return padded
        inside = Tensor.ones(*self.shape, dtype=dtypes.bool, device=self.device).pad(pairs)
        return inside.where(padded, value)

    def shrink(self, bounds: Sequence[tuple[int, int] | None]) -> Tensor:
        if len(bounds) != self.ndim:
            raise ValueError(f"shrink needs {self.ndim} bounds for shape {self.shape}, "
                             f"got {len(bounds)}")
        full = tuple((0, s) if b is None else (int(b[0]), int(b[1]))
                     for b, s in zip(bounds, self.shape))
        for (start, end), size in zip(full, self.shape):
            if not 0 <= start <= end <= size:
                raise ValueError(f"shrink bounds {full} out of range for shape {self.shape}")
        return self._apply(self.uop.shrink(full), self)

    def flip(self, axis: int | Sequence[int]) -> Tensor:
        axes = self._axes(axis)
        return self._apply(self.uop.flip(tuple(a for a in axes if self.shape[a] > 1)), self)

    def __getitem__(self, index: Any) -> Tensor:
        """Ints, slices, None, ..., and (fancy indexing) lists and tensors of indices: `t[[0, 2]]`,
        `t[rows, cols]`. Lists become index tensors on this tensor's device."""
        from tinyteach.indexing import getitem
        if isinstance(index, tuple):
            return getitem(self, tuple(self._index_tensor(item) for item in index))
        return getitem(self, self._index_tensor(index))

    def _index_tensor(self, item: Any) -> Any:
        if not isinstance(item, list):
            return item
        if any(isinstance(part, Tensor) for part in item):
            return Tensor.stack(*[part if isinstance(part, Tensor) else Tensor(part, self.device)
                                  for part in item]).cast(dtypes.int32)
        return Tensor(item, self.device, dtype=dtypes.int32)

    # ---- elementwise: broadcasting and promotion, then one primitive op ----

    def _broadcasted(self, other: Any, reverse: bool = False,
                     float_result: bool = False) -> tuple[Tensor, Tensor]:
        x, y = self, other
        if not isinstance(y, Tensor):
            y = Tensor(y, self.device, dtype=_scalar_dtype(self.dtype, y))
        elif y.device != x.device:
            raise RuntimeError(f"tensors are on different devices: {x.device} and {y.device}; "
                               f"move one with .to()")
        if reverse:
            x, y = y, x
        dtype = least_upper_dtype(x.dtype, y.dtype)
        if float_result:
            dtype = least_upper_float(dtype)
        shape = broadcast_shape(x.shape, y.shape)
        return x.cast(dtype).expand(shape), y.cast(dtype).expand(shape)

    def _binary(self, op: Ops, other: Any, reverse: bool = False) -> Tensor:
        x, y = self._broadcasted(other, reverse)
        return x._apply(x.uop.alu(op, y.uop), x, y)

    def _unary(self, op: Ops) -> Tensor:
        return self._apply(self.uop.alu(op), self)

    def cast(self, dtype: DType | str | type) -> Tensor:
        wanted = dtypes.as_dtype(dtype)
        return self if wanted == self.dtype else self._apply(self.uop.cast(wanted), self)

    def _to_float(self) -> Tensor:
        return self.cast(least_upper_float(self.dtype))

    def add(self, other: Any, reverse: bool = False) -> Tensor:
        return self._binary(Ops.ADD, other, reverse)

    def mul(self, other: Any, reverse: bool = False) -> Tensor:
        return self._binary(Ops.MUL, other, reverse)

    def sub(self, other: Any, reverse: bool = False) -> Tensor:
        x, y = self._broadcasted(other, reverse)
        return x + (-y)

    def div(self, other: Any, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """True division: integers are divided as floats. PyTorch's `rounding_mode` rounds the
        quotient toward zero ("trunc") or down ("floor"); integers then stay integers."""
        if rounding_mode == "floor":
            return self.floordiv(other, reverse)
        if rounding_mode == "trunc":
            x, y = self._broadcasted(other, reverse)
            if dtypes.is_float(x.dtype):
                return (x * y.reciprocal()).trunc()
            return x._apply(x.uop.alu(Ops.IDIV, y.uop), x, y)  # IDIV rounds toward zero, as C
        if rounding_mode is not None:
            raise ValueError(f"div rounding_mode must be None, 'trunc' or 'floor', "
                             f"not {rounding_mode!r}")
        x, y = self._broadcasted(other, reverse, float_result=True)
        return x * y.reciprocal()

    def neg(self) -> Tensor:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return self._unary(Ops.NEG)

    def __neg__(self) -> Tensor:
        return self.neg()

    def __add__(self, other: Any) -> Tensor:
        return self.add(other)

    def __radd__(self, other: Any) -> Tensor:
        return self.add(other, True)

    def __sub__(self, other: Any) -> Tensor:
        return self.sub(other)

    def __rsub__(self, other: Any) -> Tensor:
        return self.sub(other, True)

    def __mul__(self, other: Any) -> Tensor:
        return self.mul(other)

    def __rmul__(self, other: Any) -> Tensor:
        return self.mul(other, True)

    def __truediv__(self, other: Any) -> Tensor:
        return self.div(other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return self.div(other, True)

    def __floordiv__(self, other: Any) -> Tensor:
        return self.floordiv(other)

    def __rfloordiv__(self, other: Any) -> Tensor:
        return self.floordiv(other, True)

    def __mod__(self, other: Any) -> Tensor:
        return self.mod(other)

    def __rmod__(self, other: Any) -> Tensor:
        return self.mod(other, True)

    def __pow__(self, other: Any) -> Tensor:
        return self.pow(other)

    def __rpow__(self, other: Any) -> Tensor:
        return self.pow(other, True)

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.matmul(other)

    def __rmatmul__(self, other: Tensor) -> Tensor:
        return other.matmul(self)

    def __and__(self, other: Any) -> Tensor:
        return self._binary(Ops.AND, other)

    def __rand__(self, other: Any) -> Tensor:
        return self._binary(Ops.AND, other, True)

    def __or__(self, other: Any) -> Tensor:
        return self._binary(Ops.OR, other)

    def __ror__(self, other: Any) -> Tensor:
        return self._binary(Ops.OR, other, True)

    def __xor__(self, other: Any) -> Tensor:
        return self._binary(Ops.XOR, other)

    def __rxor__(self, other: Any) -> Tensor:
        return self._binary(Ops.XOR, other, True)

    def __invert__(self) -> Tensor:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        if dtypes.is_float(self.dtype):
            raise TypeError(f"~ needs an integer or bool tensor, not {self.dtype}")
        return self ^ self._const(-1 if self.dtype.kind == "int" else self.dtype.max)

    # comparisons give bool tensors (and build graphs, so tensors hash by identity)
    def __lt__(self, other: Any) -> Tensor:
        return self._binary(Ops.CMPLT, other)

    def __gt__(self, other: Any) -> Tensor:
        return self._binary(Ops.CMPLT, other, True)

    def __le__(self, other: Any) -> Tensor:
        return (self < other) | (self == other)

    def __ge__(self, other: Any) -> Tensor:
        return (self > other) | (self == other)

    def __ne__(self, other: Any) -> Tensor:  # type: ignore[override]
        return self._binary(Ops.CMPNE, other)

    def __eq__(self, other: Any) -> Tensor:  # type: ignore[override]
        return (self != other).logical_not()

    def logical_not(self) -> Tensor:
        return self.cast(dtypes.bool)._binary(Ops.CMPNE, True)

    def where(self, if_true: Any, if_false: Any) -> Tensor:
        """self ? if_true : if_false, with broadcasting (self is used as a condition)."""
        condition = self.cast(dtypes.bool)
        if not isinstance(if_true, Tensor) and not isinstance(if_false, Tensor):
            dtype = least_upper_dtype(dtypes.from_py(if_true), dtypes.from_py(if_false))
            if_true = Tensor(if_true, self.device, dtype=dtype)
        if isinstance(if_true, Tensor):
            x, y = if_true._broadcasted(if_false)
        else:
            y, x = if_false._broadcasted(if_true)
        shape = broadcast_shape(condition.shape, x.shape)
        c, x, y = condition.expand(shape), x.expand(shape), y.expand(shape)
        return x._apply(c.uop.alu(Ops.WHERE, x.uop, y.uop), x, y)

    def maximum(self, other: Any) -> Tensor:
        return self._binary(Ops.MAX, other)

    # ---- reduction: one primitive op (sum, max and the rest are in tensor_math.py) ----

    def _reduce(self, op: Ops, axis: Any, keepdim: bool) -> Tensor:
        axes = self._axes(axis)
        if self.ndim == 0:
            return self
        reduced = self._apply(self.uop.reduce(op, axes), self)
        if keepdim:
            return reduced
        return reduced.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    # ---- autograd ----

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """Gradients of self with respect to `targets`, without touching `.grad`."""
        root = graph_before_realize(self._lazy or self.uop, _graph_behind)
        if gradient is None:
            if self.shape != ():
                raise ValueError(f"gradient of a non-scalar tensor (shape {self.shape}) needs "
                                 f"`gradient=`, the gradient of the output")
            gradient = Tensor(1.0, self.device, dtype=self.dtype)
        if gradient.shape != self.shape:
            raise ValueError(f"gradient shape {gradient.shape} != tensor shape {self.shape}")
        target_nodes = {node for t in targets for node in (t.uop, t._lazy) if node is not None}
        grads = compute_gradient(root, gradient.uop, target_nodes, _copy_back)
        results = []
        for t in targets:
            node = t.uop if t.uop in grads else t._lazy
            if node is None or node not in grads:
                results.append(t.zeros_like())
            else:
                results.append(Tensor(grads[node], t.device))
        return results

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Set `.grad` on every tensor with requires_grad that this one depends on."""
        if gradient is None and self.shape != ():
            raise ValueError(f"backward() needs a scalar (shape ()) tensor, this one has shape "
                             f"{self.shape}; pass gradient= for a non-scalar output")
        in_graph = reachable_by_gradient(graph_before_realize(self._lazy or self.uop,
                                                              _graph_behind))
        targets = [t for t in list(Tensor._needs_grad.values())
                   if t.uop in in_graph or (t._lazy is not None and t._lazy in in_graph)]
        if not targets:
            raise RuntimeError("backward(): no tensor with requires_grad=True in this graph "
                               "(gradients stop at detach(), no_grad and comparisons)")
        for target, grad in zip(targets, self.gradient(*targets, gradient=gradient)):
            target.grad = grad if target.grad is None else target.grad + grad
        Tensor._losses[id(self)] = self
        return self

    @staticmethod
    def train(mode: bool = True) -> _Train:
        return _Train(mode)

    def assign(self, value: Any) -> Tensor:
        """Replace this tensor's value (the graph of `value` is computed when realized)."""
        if not isinstance(value, Tensor):
            value = Tensor(value, self.device, dtype=self.dtype)
        if value.shape != self.shape or value.dtype != self.dtype or value.device != self.device:
            raise ValueError(f"assign: {value.shape} {value.dtype} on {value.device} does not "
                             f"match {self.shape} {self.dtype} on {self.device}")
        target = self.uop.src[0] if self.uop.op is Ops.ASSIGN else self.uop
        if is_contiguous_buffer(target) and value.uop is not target:
            # write into the existing buffer: whoever holds it (a JIT, an optimizer) sees it
            self.uop = UOp(Ops.ASSIGN, self.dtype, (target, value.uop))
        else:
            self.uop = value.uop
        self._lazy = None
        return self

    def __iter__(self) -> Iterator[Tensor]:
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a Tensor is ambiguous; use .item(), .any() or .all()")

    # ---- casts by name: last in the class, because below these definitions the names
    # `float`, `int` and `bool` mean the methods, not the types (for type checkers) ----

    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def double(self) -> Tensor:
        return self.cast(dtypes.float64)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        return self.cast(dtypes.int64)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool)


# ---- helpers used above ----

def _losses_reading_assigned(pending: list[Tensor], losses: Any) -> list[Tensor]:
    """Unrealized losses that read a buffer one of `pending` assigns to: they must be computed
    in the same schedule, before the assign overwrites what they read."""
    targets = {node.src[0] for t in pending for node in t.uop.toposort if node.op is Ops.ASSIGN}
    if not targets:
        return []
    chosen = [id(t) for t in pending]
    rescued = []
    for loss in list(losses):
        if id(loss) in chosen or is_contiguous_buffer(loss.uop):
            continue
        if any(node in targets for node in loss.uop.toposort):
            rescued.append(loss)
    return rescued


def _shape_from_maybe_negative(args: tuple[Any, ...]) -> tuple[int, ...]:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(int(s) for s in args)


def _scalar_dtype(tensor_dtype: DType, value: Any) -> DType:
    """A Python scalar adapts to the tensor: int*2 stays int, int*0.5 becomes float."""
    if isinstance(value, bool):
        return tensor_dtype
    if isinstance(value, int):
        return tensor_dtype if tensor_dtype != dtypes.bool else dtypes.default_int
    return tensor_dtype if dtypes.is_float(tensor_dtype) else dtypes.default_float


def _padding_pairs(padding: Sequence[Any], ndim: int) -> list[tuple[int, int]]:
    items = list(padding)
    if all(isinstance(p, int) for p in items):  # PyTorch: (last_before, last_after, ...)
        if len(items) % 2 or len(items) // 2 > ndim:
            raise ValueError(f"flat padding {tuple(items)} needs an even count <= {2 * ndim}")
        pairs = [(0, 0)] * ndim
        for k in range(len(items) // 2):
            pairs[ndim - 1 - k] = (items[2 * k], items[2 * k + 1])
        return pairs
    if len(items) != ndim:
        raise ValueError(f"padding needs one (before, after) pair per axis ({ndim}), got {items}")
    return [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in items]


# realized buffer -> the lazy graph that computed it, for tensors on a path to a parameter
_graph_behind: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()


def _copy_back(grad: UOp, source: UOp) -> UOp:
    return UOp(Ops.COPY, grad.dtype, (grad,), device_of(source, Device.DEFAULT))


def _uop_from_data(data: Any, dtype: DType | None, device: str) -> UOp:
    """Bring host data (list, numpy array) onto the device as a realized buffer."""
    if isinstance(data, (list, tuple)):
        array = np.array(data, dtype=(dtype or dtypes.from_py(data)).np)
    elif isinstance(data, np.ndarray):
        array = data if dtype is None else data.astype(dtype.np)
        if dtype is None and array.dtype not in (np.float16, np.float32, np.float64):
            dtypes.from_np(array.dtype)  # raises a clear error for unsupported dtypes
    elif isinstance(data, bytes):
        array = np.frombuffer(data, dtype=np.uint8)
    else:
        raise TypeError(f"cannot make a Tensor from {type(data).__name__}")
    shape = array.shape  # (np.ascontiguousarray turns a 0-d array into shape (1,))
    array = np.ascontiguousarray(array)
    buffer = Buffer(device, array.size, dtypes.from_np(array.dtype)).copyin(array.reshape(-1))
    return UOp(Ops.BUFFER, buffer.dtype, (), buffer).reshape(shape)



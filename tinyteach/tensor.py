"""Chapter 1: Tensors — a PyTorch-like API built from the primitive ops.

What this teaches:
- a Tensor is a handle on a lazy UOp graph plus a device; building `(a + b).relu()` computes
  nothing. `realize()`, `numpy()`, `item()` or `tolist()` schedule the graph into kernels and run
  them (chapters 6-9);
- everything here — softmax, conv2d, cross-entropy, random numbers, even `arange` — is composed
  from the 28 primitive ops of uop.py. No numpy call computes a result behind your back; numpy is
  only used to bring data in and take it out;
- broadcasting and dtype promotion happen here, once, before the graph is built, so every op
  below sees operands of equal shape and dtype;
- `requires_grad`, `backward()` and `.grad` work as in PyTorch (chapter 2 has the rules).

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
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from tinyteach.device import Buffer, Device
from tinyteach.dtype import DType, dtypes, least_upper_dtype, least_upper_float
from tinyteach.gradient import compute_gradient, graph_before_realize, reachable_by_gradient
from tinyteach.helpers import TRAINING, Context, prod
from tinyteach.realize import realize_uops
from tinyteach.schedule import device_of, is_contiguous_buffer
from tinyteach.uop import Ops, UOp

Scalar = int | float | bool
TensorLike = "Tensor | Scalar"
ShapeArg = int | Sequence[int]


def _shape_from(args: tuple[Any, ...]) -> tuple[int, ...]:
    """Accept both `f(2, 3)` and `f((2, 3))`."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    shape = tuple(int(s) for s in args)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative size in shape {shape}")
    return shape


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


class Tensor(metaclass=_TensorType):
    """A lazily computed n-dimensional array on a device, with reverse-mode autograd."""

    training: ClassVar[bool] = False
    _seed: ClassVar[int] = 0
    _rng_counter: ClassVar[int] = 0
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

    # ---- creation ----

    @staticmethod
    def full(shape: ShapeArg, fill_value: Scalar, **kwargs: Any) -> Tensor:
        dims = _shape_from((shape,))
        dtype = dtypes.as_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") else None
        requires_grad = kwargs.pop("requires_grad", None)
        scalar = Tensor(fill_value, dtype=dtype, **kwargs)
        result = scalar.reshape((1,) * len(dims)).expand(dims)
        result.requires_grad = requires_grad
        return result

    @staticmethod
    def zeros(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor.full(_shape_from(shape), 0.0, **_float_default(kwargs))

    @staticmethod
    def ones(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor.full(_shape_from(shape), 1.0, **_float_default(kwargs))

    @staticmethod
    def empty(*shape: Any, device: str | None = None, dtype: DType | str | None = None,
              **kwargs: Any) -> Tensor:
        """Memory that is allocated but not set: its contents are undefined (fresh memory is
        zero, reused memory keeps what its last owner wrote; see device.HostMemory)."""
        dims = _shape_from(shape)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        name = Device.canonicalize(device)
        buffer = UOp(Ops.BUFFER, wanted, (), Buffer(name, prod(dims), wanted))
        return Tensor(buffer.reshape(dims), name, **kwargs)

    def full_like(self, fill_value: Scalar, **kwargs: Any) -> Tensor:
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return Tensor.full(self.shape, fill_value, **kwargs)

    def zeros_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(1, **kwargs)

    def rand_like(self, **kwargs: Any) -> Tensor:
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return Tensor.rand(*self.shape, **kwargs)

    def randn_like(self, **kwargs: Any) -> Tensor:
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return Tensor.randn(*self.shape, **kwargs)

    @staticmethod
    def arange(start: int | float, stop: int | float | None = None, step: int | float = 1,
               **kwargs: Any) -> Tensor:
        """start, start+step, ... < stop — built from ones and a running sum, not numpy."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("arange step must not be zero")
        count = max(0, math.ceil((stop - start) / step))
        is_int = all(isinstance(v, int) for v in (start, stop, step))
        dtype = kwargs.pop("dtype", None) or (dtypes.default_int if is_int else
                                              dtypes.default_float)
        index = _arange_int(count, Device.canonicalize(kwargs.get("device")))
        result = (index * step + start) if (step, start) != (1, 0) else index
        return result.cast(dtypes.as_dtype(dtype))._with(**kwargs)

    @staticmethod
    def linspace(start: float, stop: float, steps: int, **kwargs: Any) -> Tensor:
        if steps < 0:
            raise ValueError(f"linspace needs steps >= 0, got {steps}")
        dtype = dtypes.as_dtype(kwargs.pop("dtype", dtypes.default_float))
        requires_grad = kwargs.pop("requires_grad", None)  # set on the result, not the arange
        if steps == 1:
            return Tensor.full((1,), start, dtype=dtype, requires_grad=requires_grad, **kwargs)
        index = Tensor.arange(steps, **kwargs).cast(dtypes.float64 if dtype == dtypes.float64
                                                    else dtypes.default_float)
        result = (index * ((stop - start) / (steps - 1)) + start).cast(dtype)
        return result._with(requires_grad=requires_grad)

    @staticmethod
    def eye(n: int, m: int | None = None, **kwargs: Any) -> Tensor:
        dtype = dtypes.as_dtype(kwargs.pop("dtype", dtypes.default_float))
        requires_grad = kwargs.pop("requires_grad", None)  # set on the result, not the aranges
        rows = Tensor.arange(n, **kwargs).reshape(n, 1)
        cols = Tensor.arange(n if m is None else m, **kwargs).reshape(1, -1)
        return (rows == cols).cast(dtype)._with(requires_grad=requires_grad)

    def _with(self, device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        result = self if device is None else self.to(device)
        if requires_grad is not None:
            result = Tensor(result.uop, result.device, requires_grad=requires_grad)
        return result

    # ---- random numbers: a counter-based hash, computed on the device itself ----

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        """Make random numbers reproducible: the same seed gives the same numbers on every
        device, because they come from integer arithmetic that every device does exactly."""
        Tensor._seed, Tensor._rng_counter = int(seed), 0

    @staticmethod
    def _random_bits(count: int, device: str | None) -> Tensor:
        """`count` pseudo-random uint32s: hash(counter, seed), lowbias32 by Chris Wellons."""
        start = Tensor._rng_counter
        Tensor._rng_counter += count
        counter = _arange_int(count, Device.canonicalize(device)).cast(dtypes.uint32)
        # 0x6A09E667 (from sqrt(2)) moves seed 0 off the hash's fixed point hash(0) == 0
        key = _hash32_int(_hash32_int(Tensor._seed ^ 0x6A09E667) ^ (start & 0xFFFFFFFF))
        return _hash32((counter ^ key) * 0x9E3779B9 + (start >> 32))

    @staticmethod
    def rand(*shape: Any, device: str | None = None, dtype: DType | str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        """Uniform in [0, 1)."""
        dims = _shape_from(shape)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        bits = Tensor._random_bits(prod(dims), device)
        # the top 24 bits, scaled to [0, 1): exactly representable in float32
        uniform = (bits // 256).cast(dtypes.float32) * (1.0 / (1 << 24))
        result = uniform.cast(wanted).reshape(dims)
        result.requires_grad = requires_grad
        return result

    @staticmethod
    def randn(*shape: Any, dtype: DType | str | None = None, requires_grad: bool | None = None,
              **kwargs: Any) -> Tensor:
        """Standard normal, by the Box-Muller transform of two uniforms."""
        dims = _shape_from(shape)
        wanted = dtypes.default_float if dtype is None else dtypes.as_dtype(dtype)
        u = Tensor.rand(2, *dims, **kwargs)
        radius = ((1 - u[0]).log() * -2).sqrt()
        result = (radius * (u[1] * (2 * math.pi)).cos()).cast(wanted)
        result.requires_grad = requires_grad
        return result

    @staticmethod
    def randint(*shape: Any, low: int = 0, high: int = 10, dtype: DType | str = dtypes.int32,
                **kwargs: Any) -> Tensor:
        if high <= low:
            raise ValueError(f"randint needs low < high, got low={low}, high={high}")
        uniform = Tensor.rand(*shape, dtype=dtypes.float64 if high - low > 1 << 23 else None,
                              **kwargs)
        return (uniform * (high - low)).floor().cast(dtypes.as_dtype(dtype)) + low

    @staticmethod
    def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, **kwargs: Any) -> Tensor:
        requires_grad = kwargs.pop("requires_grad", None)
        result = Tensor.rand(*shape, **kwargs) * (high - low) + low
        result.requires_grad = requires_grad
        return result

    @staticmethod
    def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Tensor:
        requires_grad = kwargs.pop("requires_grad", None)
        result = Tensor.randn(*shape, **kwargs) * std + mean
        result.requires_grad = requires_grad
        return result

    @staticmethod
    def kaiming_uniform(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        dims = _shape_from(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(dims[1:]))
        return Tensor.uniform(*dims, low=-bound, high=bound, **kwargs)

    @staticmethod
    def glorot_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        dims = _shape_from(shape)
        bound = math.sqrt(6 / (dims[0] + prod(dims[1:])))
        return Tensor.uniform(*dims, low=-bound, high=bound, **kwargs)

    # ---- movement ----

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

    def view(self, *shape: Any) -> Tensor:
        return self.reshape(*shape)

    def permute(self, *order: Any) -> Tensor:
        axes = _shape_from_maybe_negative(order)
        normalized = tuple(self._axis(a) for a in axes)
        if sorted(normalized) != list(range(self.ndim)):
            raise ValueError(f"permute order {axes} is not a permutation of the {self.ndim} "
                             f"axes of shape {self.shape}")
        return self._apply(self.uop.permute(normalized), self)

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = self._axis(dim0), self._axis(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:
        return self.permute(tuple(reversed(range(self.ndim))))

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

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        start, end = self._axis(start_dim), self._axis(end_dim)
        return self.reshape(*self.shape[:start], -1, *self.shape[end + 1:])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        axis = self._axis(dim)
        return self.reshape(*self.shape[:axis], *sizes, *self.shape[axis + 1:])

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        axis = self._axis(dim)
        if self.shape and self.shape[axis] != 1:
            return self
        return self.reshape(self.shape[:axis] + self.shape[axis + 1:])

    def unsqueeze(self, dim: int) -> Tensor:
        axis = self._axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def pad(self, padding: Sequence[Any], value: Scalar = 0) -> Tensor:
        """`padding` is ((before, after) or None per axis), or PyTorch's flat form
        (left, right, top, bottom, ...) that starts from the last axis."""
        pairs = _padding_pairs(padding, self.ndim)
        if any(b < 0 or a < 0 for b, a in pairs):
            cropped = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape))
            return self.shrink(cropped).pad([(max(0, b), max(0, a)) for b, a in pairs], value)
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
        from tinyteach.indexing import getitem
        return getitem(self, index)

    def gather(self, dim: int, index: Tensor) -> Tensor:
        """out[i][j] = self[i][index[i][j]] for dim=1 (PyTorch's gather)."""
        axis = self._axis(dim)
        if index.ndim != self.ndim:
            raise ValueError(f"gather: index has {index.ndim} dims, tensor has {self.ndim}")
        from tinyteach.indexing import check_index_range
        check_index_range(index, self.shape[axis], axis)
        index = (index < 0).where(index + self.shape[axis], index)  # -1 is the last, as numpy
        bounds = [(0, i) if a != axis else None for a, i in enumerate(index.shape)]
        source = self.shrink(bounds).transpose(axis, -1)  # (..., n)
        picked = index.transpose(axis, -1).unsqueeze(-1)   # (..., k, 1)
        n = self.shape[axis]
        one_hot = picked == Tensor.arange(n, device=self.device)
        return one_hot.where(source.unsqueeze(-2), 0).sum(-1, dtype=self.dtype).transpose(axis, -1)

    def cat(*tensors: Any, dim: int = 0) -> Tensor:
        """Join along `dim`: `a.cat(b, c)`, `Tensor.cat(a, b, c)` or `Tensor.cat([a, b, c])`
        (no @staticmethod, so that `a.cat(b)` passes `a` too, as in tinygrad)."""
        items: list[Tensor] = list(tensors[0]) if len(tensors) == 1 and isinstance(
            tensors[0], (list, tuple)) else list(tensors)
        return items[0].cat_with(*items[1:], dim=dim)

    def cat_with(self, *others: Tensor, dim: int = 0) -> Tensor:
        axis = self._axis(dim)
        for other in others:
            if other.ndim != self.ndim or any(a != b for i, (a, b) in
                                              enumerate(zip(self.shape, other.shape)) if i != axis):
                raise ValueError(f"cat: shapes {self.shape} and {other.shape} differ outside "
                                 f"dim {axis}")
        tensors = [self, *others]
        dtype = least_upper_dtype(*(t.dtype for t in tensors))
        total = sum(t.shape[axis] for t in tensors)
        result, offset = None, 0
        for t in tensors:
            pairs = [(0, 0)] * self.ndim
            pairs[axis] = (offset, total - offset - t.shape[axis])
            piece = t.cast(dtype).pad(pairs)
            result = piece if result is None else result + piece
            offset += t.shape[axis]
        assert result is not None
        return result

    def stack(*tensors: Any, dim: int = 0) -> Tensor:
        """Join along a new axis `dim`: `a.stack(b)`, `Tensor.stack(a, b)` or a list."""
        items: list[Tensor] = list(tensors[0]) if len(tensors) == 1 and isinstance(
            tensors[0], (list, tuple)) else list(tensors)
        for item in items[1:]:
            if item.shape != items[0].shape:
                raise ValueError(f"stack needs tensors of one shape, got {items[0].shape} and "
                                 f"{item.shape}")
        axis = items[0]._axis(dim, items[0].ndim + 1)
        return Tensor.cat(*(t.unsqueeze(axis) for t in items), dim=axis)

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> list[Tensor]:
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

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        if chunks <= 0:
            raise ValueError(f"chunk needs a positive number of chunks, got {chunks}")
        length = self.shape[self._axis(dim)]
        return self.split(max(1, math.ceil(length / chunks)), dim)

    def repeat(self, *repeats: Any) -> Tensor:
        counts = _shape_from(repeats)
        if len(counts) < self.ndim:
            raise ValueError(f"repeat needs at least {self.ndim} counts, got {counts}")
        base = self.reshape((1,) * (len(counts) - self.ndim) + self.shape)
        interleaved = [d for s in base.shape for d in (1, s)]
        expanded = [d for c, s in zip(counts, base.shape) for d in (c, s)]
        return base.reshape(interleaved).expand(expanded).reshape(
            tuple(c * s for c, s in zip(counts, base.shape)))

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

    def cast(self, dtype: DType | str) -> Tensor:
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

    def div(self, other: Any, reverse: bool = False) -> Tensor:
        """True division: integers are divided as floats."""
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

    def minimum(self, other: Any) -> Tensor:
        x, y = self._broadcasted(other)
        return x._order_reversed().maximum(y._order_reversed())._order_reversed()

    def _order_reversed(self) -> Tensor:
        """Values in the opposite order, so that min(x) = r(max(r(x))): -x for floats, and
        ~x = -x - 1 for integers and bools, which never overflows (-INT_MIN does)."""
        return -self if dtypes.is_float(self.dtype) else ~self

    # ---- math, composed from EXP2, LOG2, SIN, SQRT and RECIPROCAL ----

    def exp2(self) -> Tensor:
        return self._to_float()._unary(Ops.EXP2)

    def log2(self) -> Tensor:
        return self._to_float()._unary(Ops.LOG2)

    def exp(self) -> Tensor:
        return (self._to_float() * (1 / math.log(2))).exp2()   # e^x = 2^(x / ln 2)

    def log(self) -> Tensor:
        return self.log2() * math.log(2)                       # ln x = log2(x) * ln 2

    def sqrt(self) -> Tensor:
        return self._to_float()._unary(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        return self._to_float()._unary(Ops.RECIPROCAL)

    def sin(self) -> Tensor:
        return self._to_float()._unary(Ops.SIN)

    def cos(self) -> Tensor:
        return ((math.pi / 2) - self._to_float()).sin()         # cos x = sin(pi/2 - x)

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def sigmoid(self) -> Tensor:
        return (1 + (-self._to_float()).exp()).reciprocal()

    def tanh(self) -> Tensor:
        return 2.0 * (2.0 * self._to_float()).sigmoid() - 1.0

    def relu(self) -> Tensor:
        return (self > 0).where(self, 0)

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        return (self < 0).where(self * neg_slope, self)

    def gelu(self) -> Tensor:
        """The tanh approximation (PyTorch's gelu(approximate='tanh'), tinygrad's gelu)."""
        inner = math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)
        return 0.5 * self * (1 + inner.tanh())

    def silu(self) -> Tensor:
        return self * self.sigmoid()

    def swish(self) -> Tensor:
        return self.silu()

    def elu(self, alpha: float = 1.0) -> Tensor:
        return (self > 0).where(self, alpha * (self.exp() - 1))

    def softplus(self, beta: float = 1.0) -> Tensor:
        return (1 + (self * beta).exp()).log() * (1 / beta)

    def abs(self) -> Tensor:
        if self.dtype.kind in ("uint", "bool"):
            return self
        return self * self.sign()  # its gradient is sign(x): 0 at x = 0, as in PyTorch

    def sign(self) -> Tensor:
        positive = (self > 0).cast(self.dtype)
        if self.dtype.kind in ("uint", "bool"):
            return positive
        return positive - (self < 0).cast(self.dtype)

    def clip(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Tensor:
        if min_ is None and max_ is None:
            raise ValueError("clip needs at least one of min_ and max_")
        result = self if min_ is None else self.maximum(min_)
        return result if max_ is None else result.minimum(max_)

    def clamp(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Tensor:
        return self.clip(min_, max_)

    def square(self) -> Tensor:
        return self * self

    def trunc(self) -> Tensor:
        """Round toward zero: x - fmod(x, 1); huge floats are already whole numbers."""
        if not dtypes.is_float(self.dtype):
            return self
        whole = self - self._binary(Ops.MOD, 1.0)
        limit = 2.0 ** {2: 10, 4: 23, 8: 52}[self.dtype.itemsize]
        return (self.abs() < limit).where(whole, self)

    def floor(self) -> Tensor:
        whole = self.trunc()
        return whole if not dtypes.is_float(self.dtype) else (self < whole).where(whole - 1, whole)

    def ceil(self) -> Tensor:
        whole = self.trunc()
        return whole if not dtypes.is_float(self.dtype) else (self > whole).where(whole + 1, whole)

    def round(self) -> Tensor:
        """Round half to even, as numpy and PyTorch do."""
        down = self.floor()
        difference = self - down
        down_is_even = (down * 0.5).floor() * 2 == down
        up = (difference > 0.5) | ((difference == 0.5) & down_is_even.logical_not())
        return up.where(down + 1, down)

    def floordiv(self, other: Any, reverse: bool = False) -> Tensor:
        """Python's //: rounds toward negative infinity."""
        x, y = self._broadcasted(other, reverse)
        if dtypes.is_float(x.dtype):
            return (x / y).floor()
        quotient = x._apply(x.uop.alu(Ops.IDIV, y.uop), x, y)
        if x.dtype.kind == "uint":
            return quotient
        inexact = x._apply(x.uop.alu(Ops.MOD, y.uop), x, y) != 0
        return (inexact & ((x < 0) != (y < 0))).where(quotient - 1, quotient)

    def mod(self, other: Any, reverse: bool = False) -> Tensor:
        """Python's %: the result takes the sign of the divisor."""
        x, y = self._broadcasted(other, reverse)
        remainder = x._apply(x.uop.alu(Ops.MOD, y.uop), x, y)
        if x.dtype.kind == "uint":
            return remainder
        wrong_sign = (remainder != 0) & ((remainder < 0) != (y < 0))
        return wrong_sign.where(remainder + y, remainder)

    def pow(self, exponent: Any, reverse: bool = False) -> Tensor:
        if reverse:
            base = Tensor(exponent, self.device, dtype=_scalar_dtype(self.dtype, exponent))
            return base.pow(self)
        if isinstance(exponent, int) and not isinstance(exponent, bool) and abs(exponent) <= 64:
            return self._integer_power(exponent)
        if isinstance(exponent, float) and exponent == 0.5:
            return self.sqrt()
        base, power = self._broadcasted(exponent, float_result=not (
            isinstance(exponent, Tensor) and not dtypes.is_float(self.dtype)
            and not dtypes.is_float(exponent.dtype)))
        if not dtypes.is_float(base.dtype):
            raise TypeError(f"pow of integer tensors with a tensor exponent is not supported "
                            f"({base.dtype}); cast to float first")
        magnitude = (base.abs().log2() * power).exp2()
        odd = (power.abs() % 2) == 1
        is_whole = power.trunc() == power
        negative = base < 0
        signed = (negative & odd).where(-magnitude, magnitude)
        result = (negative & is_whole.logical_not()).where(math.nan, signed)
        return (power == 0).where(1.0, result)

    def _integer_power(self, exponent: int) -> Tensor:
        """x ** n by repeated squaring: exact for integers and negative bases."""
        if exponent < 0:
            return self._integer_power(-exponent).reciprocal()
        result: Tensor | None = None
        base = self
        while exponent:
            if exponent & 1:
                result = base if result is None else result * base
            exponent >>= 1
            if exponent:
                base = base * base
        return self.ones_like() if result is None else result

    # ---- reductions ----

    def _reduce(self, op: Ops, axis: Any, keepdim: bool) -> Tensor:
        axes = self._axes(axis)
        if self.ndim == 0:
            return self
        reduced = self._apply(self.uop.reduce(op, axes), self)
        if keepdim:
            return reduced
        return reduced.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis: Any = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
        """Sums accumulate in at least 32 bits (half floats in float32), as in tinygrad."""
        accumulate = dtype or _sum_dtype(self.dtype)
        wide = accumulate if dtype else (dtypes.float32 if self.dtype == dtypes.float16
                                         else accumulate)
        return self.cast(wide)._reduce(Ops.ADD, axis, keepdim).cast(accumulate)

    def max(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self._order_reversed().max(axis, keepdim)._order_reversed()

    def mean(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        total = self._to_float().sum(axis, keepdim)
        count = prod(s for i, s in enumerate(self.shape) if i in self._axes(axis))
        return total / max(count, 1) if count else total * math.nan

    def var(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        centered = self._to_float() - self._to_float().mean(axis, keepdim=True)
        count = prod(s for i, s in enumerate(self.shape) if i in self._axes(axis))
        return (centered * centered).sum(axis, keepdim) / max(count - correction, 0)

    def std(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
        return self.var(axis, keepdim, correction).sqrt()

    def prod(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        """Multiply pairs of halves until one element is left (log2(n) elementwise steps)."""
        axes = self._axes(axis)
        moved = self.permute([i for i in range(self.ndim) if i not in axes] + list(axes))
        kept = moved.shape[: self.ndim - len(axes)]
        x = moved.reshape(*kept, -1).cast(_sum_dtype(self.dtype))
        while x.shape[-1] > 1:
            half = (x.shape[-1] + 1) // 2
            x = x.pad([(0, 0)] * (x.ndim - 1) + [(0, 2 * half - x.shape[-1])], value=1)
            x = x.shrink([None] * (x.ndim - 1) + [(0, half)]) * x.shrink(
                [None] * (x.ndim - 1) + [(half, 2 * half)])
            if half > 8:
                x = x.contiguous()  # keeps each kernel small
        if x.shape[-1] == 0:
            x = Tensor.ones(*kept, 1, dtype=x.dtype, device=self.device)
        result = x.reshape(kept)
        if keepdim:
            result = result.reshape(tuple(1 if i in axes else s for i, s in enumerate(self.shape)))
        return result

    def any(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self.cast(dtypes.bool).max(axis, keepdim)

    def all(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        return self.logical_not().any(axis, keepdim).logical_not()

    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """The index of the first maximum: max over (is_max * (n - index)), turned around."""
        if axis is None:
            index = self.flatten().argmax(0)
            return index.reshape((1,) * self.ndim) if keepdim else index
        a = self._axis(axis)
        n = self.shape[a]
        is_max = self == self.max(a, keepdim=True)
        countdown = Tensor.arange(n, 0, -1, device=self.device).reshape(
            (n,) + (1,) * (self.ndim - a - 1))
        return n - (is_max.cast(dtypes.int32) * countdown).max(a, keepdim)

    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        return self._order_reversed().argmax(axis, keepdim)

    def softmax(self, axis: int = -1) -> Tensor:
        shifted = self._to_float() - self._shift(axis)
        e = shifted.exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self, axis: int = -1) -> Tensor:
        shifted = self._to_float() - self._shift(axis)
        return shifted - shifted.exp().sum(axis, keepdim=True).log()

    def _shift(self, axis: Any) -> Tensor:
        """The max along `axis`, subtracted before exp() so it cannot overflow. Detached: the
        result does not depend on the shift (its gradient is exactly zero), and backward would
        otherwise spend two reductions (and two kernels) computing that zero. (tinygrad
        detaches it too.)"""
        return self._to_float().max(axis, keepdim=True).detach()

    def logsumexp(self, axis: Any = None, keepdim: bool = False) -> Tensor:
        peak = self._shift(axis)
        peak = (peak.abs() == math.inf).where(0.0, peak)  # all -inf: the answer is -inf, not nan
        total = (self - peak).exp().sum(axis, keepdim=True).log() + peak
        return total if keepdim else total.reshape(
            tuple(s for i, s in enumerate(self.shape) if i not in self._axes(axis)))

    def cumsum(self, axis: int = 0) -> Tensor:
        """Running sum: each output sums a window of the input padded with n-1 zeros."""
        if self.ndim == 0:
            return self.reshape(1).cumsum(0).reshape(())
        a = self._axis(axis)
        n = self.shape[a]
        if n == 0:
            return self
        moved = self.transpose(a, -1)
        padded = moved.pad([(0, 0)] * (self.ndim - 1) + [(n - 1, 0)])
        windows = pool(padded, (n,))  # (..., n, n): window i covers inputs 0..i
        return windows.sum(-1, dtype=_sum_dtype(self.dtype)).transpose(a, -1)

    # ---- processing: matmul, convolution, pooling, normalization, losses ----

    def dot(self, other: Tensor) -> Tensor:
        return self.matmul(other)

    def matmul(self, other: Tensor) -> Tensor:
        """Multiply then sum over the shared axis: (n, 1, k) * (1, m, k) -> sum -> (n, m)."""
        if not isinstance(other, Tensor):
            raise TypeError(f"matmul needs a Tensor, got {type(other).__name__}")
        if self.ndim == 0 or other.ndim == 0:
            raise ValueError(f"matmul needs at least 1-d tensors, got shapes {self.shape} and "
                             f"{other.shape}")
        x = self.unsqueeze(0) if self.ndim == 1 else self
        w = other.unsqueeze(-1) if other.ndim == 1 else other
        if x.shape[-1] != w.shape[-2]:
            raise ValueError(f"matmul shape mismatch: {self.shape} @ {other.shape} "
                             f"(inner dimensions {x.shape[-1]} != {w.shape[-2]})")
        product = x.unsqueeze(-2) * w.transpose(-1, -2).unsqueeze(-3)
        result = product.sum(-1, dtype=least_upper_dtype(x.dtype, w.dtype))
        if self.ndim == 1:
            result = result.squeeze(-2)
        if other.ndim == 1:
            result = result.squeeze(-1)
        return result

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        out = self * weight if weight.ndim == 1 else self.dot(weight)
        return out if bias is None else out + bias

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
               stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
               padding: int | Sequence[int] = 0) -> Tensor:
        """2-d convolution (cross-correlation, as PyTorch): windows from `pool`, one reduce."""
        if self.ndim != 4 or weight.ndim != 4:
            raise ValueError(f"conv2d needs (N, C, H, W) input and (O, C/groups, kH, kW) weight, "
                             f"got {self.shape} and {weight.shape}")
        batch, channels = self.shape[:2]
        out_channels, group_channels, kh, kw = weight.shape
        if channels != group_channels * groups or out_channels % groups:
            raise ValueError(f"conv2d: input has {channels} channels, weight {weight.shape} with "
                             f"groups={groups} expects {group_channels * groups}")
        pad_pairs = _conv_padding(padding, 2)
        x = self.pad([(0, 0), (0, 0), *pad_pairs])
        windows = pool(x, (kh, kw), _pair(stride), _pair(dilation))  # (N, C, oh, ow, kh, kw)
        oh, ow = windows.shape[2:4]
        per_group = out_channels // groups
        x = windows.reshape(batch, groups, 1, group_channels, oh, ow, kh, kw)
        w = weight.reshape(1, groups, per_group, group_channels, 1, 1, kh, kw)
        out = (x * w).sum((3, 6, 7)).reshape(batch, out_channels, oh, ow)
        return out if bias is None else out + bias.reshape(1, -1, 1, 1)

    def avg_pool2d(self, kernel_size: int | Sequence[int] = 2,
                   stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
                   count_include_pad: bool = True) -> Tensor:
        kernel = _pair(kernel_size)
        pad_pairs = _conv_padding(padding, 2)
        x = self.pad([(0, 0)] * (self.ndim - 2) + list(pad_pairs))
        windows = pool(x, kernel, _pair(stride or kernel))
        if count_include_pad or not any(p != (0, 0) for p in pad_pairs):
            return windows.mean((-2, -1))
        ones = Tensor.ones(*self.shape[-2:], device=self.device).pad(pad_pairs)
        counts = pool(ones, kernel, _pair(stride or kernel)).sum((-2, -1))
        return windows.sum((-2, -1)) / counts

    def max_pool2d(self, kernel_size: int | Sequence[int] = 2,
                   stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0,
                   dilation: int | Sequence[int] = 1) -> Tensor:
        kernel = _pair(kernel_size)
        pad_pairs = _conv_padding(padding, 2)
        x = self.pad([(0, 0)] * (self.ndim - 2) + list(pad_pairs), value=-math.inf)
        return pool(x, kernel, _pair(stride or kernel), _pair(dilation)).max((-2, -1))

    def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        centered = self - self.mean(axis, keepdim=True)
        return centered * ((centered * centered).mean(axis, keepdim=True) + eps).rsqrt()

    def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
                  invstd: Tensor, axis: int | Sequence[int] = 1) -> Tensor:
        axes = self._axes(axis)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None:
            x = x * weight.reshape(shape)
        x = x * (invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return x if bias is None else x + bias.reshape(shape)

    def dropout(self, p: float = 0.5) -> Tensor:
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        if not (Tensor.training or TRAINING) or p == 0:
            return self
        if p == 1:
            return self.zeros_like()
        keep = Tensor.rand(*self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    def one_hot(self, num_classes: int = -1) -> Tensor:
        if dtypes.is_float(self.dtype):
            raise TypeError(f"one_hot needs integer class indices, not {self.dtype}")
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1
        classes = Tensor.arange(num_classes, device=self.device)
        return (self.unsqueeze(-1) == classes).where(1, 0)

    def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1,
                                        label_smoothing: float = 0.0,
                                        reduction: str = "mean") -> Tensor:
        """Cross-entropy of logits `self` (N, C) against integer labels Y (N,)."""
        if Y.shape != self.shape[:-1]:
            raise ValueError(f"labels of shape {Y.shape} do not match logits {self.shape}")
        log_probs = self.log_softmax(-1)
        counted = Y != ignore_index
        picked = (Y.unsqueeze(-1) == Tensor.arange(self.shape[-1], device=self.device))
        # each log-probability's weight: 1 on the target class, 0 elsewhere and on ignored items;
        # label smoothing moves `label_smoothing` of it evenly over all the classes
        kept = counted.unsqueeze(-1)
        weights = (picked & kept).cast(log_probs.dtype)
        if label_smoothing:
            spread = kept.cast(log_probs.dtype) * (label_smoothing / self.shape[-1])
            weights = weights * (1 - label_smoothing) + spread
        per_class = -(log_probs * weights)
        if reduction == "none":
            return per_class.sum(-1)
        # one sum over items and classes at once: a sum of per-item sums would be two kernels
        # (a reduction that feeds another reduction is stored)
        return _reduce_loss(per_class, reduction, counted)

    def cross_entropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        return self.sparse_categorical_crossentropy(Y, reduction=reduction)

    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        """For probabilities `self` in (0, 1); logs are clipped at -100 as PyTorch does."""
        log_p = self.log().maximum(-100)
        log_not_p = (1 - self).log().maximum(-100)
        return _reduce_loss(-(Y * log_p + (1 - Y) * log_not_p), reduction)

    def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        # log(sigmoid(x)) = -softplus(-x), written stably: max(x, 0) - x*y + log(1 + e^-|x|).
        # At x = 0 the kinks must add up to the true gradient sigmoid(0) - y = 0.5 - y:
        # abs contributes 0 there, and maximum splits a tie, contributing 0.5.
        loss = self.maximum(0) - self * Y + (1 + (-self.abs()).exp()).log()
        return _reduce_loss(loss, reduction)

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


def _float_default(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.setdefault("dtype", dtypes.default_float)
    return kwargs


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


def _sum_dtype(dtype: DType) -> DType:
    if dtype.kind == "bool" or (dtype.kind == "int" and dtype.itemsize < 4):
        return dtypes.int32
    if dtype.kind == "uint" and dtype.itemsize < 4:
        return dtypes.uint32
    return dtype


def _reduce_loss(loss: Tensor, reduction: str, counted: Tensor | None = None) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / counted.sum() if counted is not None else loss.mean()
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


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


def _hash32_int(x: int) -> int:
    """lowbias32 on a Python int (for the key, computed once on the host)."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _hash32(x: Tensor) -> Tensor:
    """lowbias32 on a uint32 tensor: xor, multiply and shift (a shift is a division by 2^k)."""
    x = x ^ (x // (1 << 16))
    x = x * 0x7FEB352D
    x = x ^ (x // (1 << 15))
    x = x * 0x846CA68B
    return x ^ (x // (1 << 16))


def _arange_int(count: int, device: str) -> Tensor:
    """0, 1, ..., count-1 as int32, from primitive ops only.
    Small: a running sum of ones (cumsum). Large: i*b + j from two smaller aranges."""
    if count <= 32:
        ones = Tensor.ones(count, dtype=dtypes.int32, device=device)
        return ones.cumsum() - 1 if count else ones
    columns = math.isqrt(count - 1) + 1
    rows = -(-count // columns)
    grid = (_arange_int(rows, device) * columns).reshape(rows, 1) + \
        _arange_int(columns, device).reshape(1, columns)
    return grid.reshape(-1).shrink([(0, count)])


def _pair(value: int | Sequence[int] | None) -> tuple[int, int]:
    if value is None:
        raise ValueError("expected an int or a pair of ints")
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _conv_padding(padding: int | Sequence[int], dims: int) -> list[tuple[int, int]]:
    """PyTorch's conv padding: an int, one per spatial axis, or (left, right, top, bottom)."""
    if isinstance(padding, int):
        return [(padding, padding)] * dims
    values = list(padding)
    if len(values) == dims:
        return [(int(p), int(p)) for p in values]
    if len(values) == 2 * dims:
        return _padding_pairs(values, dims)
    raise ValueError(f"padding {padding} does not fit {dims} spatial axes")


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


def pool(x: Tensor, kernel: Sequence[int], stride: Sequence[int] | None = None,
         dilation: Sequence[int] | None = None) -> Tensor:
    """Sliding windows over the last len(kernel) axes, with movement ops only.
    Returns shape (..., out_1, ..., out_k, kernel_1, ..., kernel_k)."""
    k = len(kernel)
    stride = stride or (1,) * k
    dilation = dilation or (1,) * k
    leading = x.ndim - k
    for position, (size, step, spread) in enumerate(zip(kernel, stride, dilation)):
        axis = leading + 2 * position  # earlier axes have become (kernel, out) pairs
        x = _windows_1d(x, axis, size, step, spread)
    outs = [leading + 2 * i + 1 for i in range(k)]
    kernels = [leading + 2 * i for i in range(k)]
    return x.permute(list(range(leading)) + outs + kernels)


def _windows_1d(x: Tensor, axis: int, kernel: int, stride: int, dilation: int) -> Tensor:
    """Replace axis (size n) by (kernel, out): y[r, o] = x[r*dilation + o*stride].
    Trick: repeat x with rows of length L+dilation; row r then starts r*dilation later."""
    n = x.shape[axis]
    span = dilation * (kernel - 1) + 1
    if span > n:
        raise ValueError(f"window of {kernel} (dilation {dilation}) does not fit in size {n}")
    out = (n - span) // stride + 1
    length = max(n, dilation * (kernel - 1) + out * stride)
    before, after = x.shape[:axis], x.shape[axis + 1:]
    rows = -(-kernel * (length + dilation) // length)
    moved = x.pad([(0, 0)] * axis + [(0, length - n)] + [(0, 0)] * len(after))
    repeated = moved.unsqueeze(axis).expand(*before, rows, length, *after)
    flat = repeated.reshape(*before, rows * length, *after)
    diagonal = flat.shrink([None] * axis + [(0, kernel * (length + dilation))] +
                           [None] * len(after)).reshape(*before, kernel, length + dilation, *after)
    strided = diagonal.shrink([None] * (axis + 1) + [(0, out * stride)] + [None] * len(after))
    strided = strided.reshape(*before, kernel, out, stride, *after)
    picked = strided.shrink([None] * (axis + 2) + [(0, 1)] + [None] * len(after))
    return picked.reshape(*before, kernel, out, *after)


"""Chapter 1 (part 1): the Tensor's core — a lazy graph on a device, realize, and autograd.

What this teaches:
- a Tensor is a handle on a lazy UOp graph plus a device; building `(a + b).relu()` computes
  nothing. `realize()`, `numpy()`, `item()` or `tolist()` schedule the graph into kernels and run
  them (chapters 6-9);
- the core has the primitive ops only: the six movement ops, one elementwise op per operator
  (after broadcasting and dtype promotion, which happen here, once, so every op below sees
  operands of equal shape and dtype), one reduction, and the entry to autograd;
- `requires_grad` has three states, as in tinygrad: None (the default: the tensor gets a
  `.grad` if a backward reaches it), True (the same, and results computed from it keep their
  graph through realize) and False (a stop: never a `.grad`, as BatchNorm's running statistics
  and the datasets). `backward()` fills `.grad` on every live float tensor of its graph that is
  not a constant. What autograd remembers across tensors is one object, `AUTOGRAD`
  (`AutogradState`); chapter 2 has the gradient rules.

The rest of chapter 1 stands on this class. Each part is a mixin that uses only what is below
it: CoreTensor <- TensorCreation (tensor/create.py, part 4) <- TensorMovement (part 5) <-
TensorMath (part 6) <- TensorNN (part 7) <- TensorIndexing (tensor/indexing.py, part 3), and
tensor/__init__.py assembles them into `Tensor`. The parts are typed with `typing.Self`: a method of
a part returns the same class it was called on, which is always the assembled Tensor.

Builds on: uop, schedule, realize, gradient. Used by: the other parts of chapter 1.

>>> from tinyteach import Tensor
>>> a = Tensor([[1.0, 2.0], [3.0, 4.0]])
>>> (a + a).tolist()
[[2.0, 4.0], [6.0, 8.0]]
>>> a.sum(axis=1).numpy().tolist()
[3.0, 7.0]
"""
from __future__ import annotations

import contextlib
import pathlib
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar, cast

import numpy as np

from tinyteach.device import Buffer, Device
from tinyteach.dtype import (
    DType,
    dtypes,
    from_bfloat16_bits,
    is_bfloat16_words,
    least_upper_dtype,
    least_upper_float,
    to_bfloat16_bits,
    truncate_to,
)
from tinyteach.engine.realize import realize_elementwise, realize_uops, schedule_uops
from tinyteach.engine.schedule import ScheduleItem, device_of, is_contiguous_buffer
from tinyteach.helpers import prod, register_memo
from tinyteach.ir.uop import (
    COMPARISONS,
    Ops,
    UOp,
    _arg_key,
    as_sint,
    base_buffer,
    describe_size,
    sint,
    sym_eval,
    sym_max,
    sym_min,
    sym_mul,
    sym_prod,
    sym_shape_eval,
    sym_sub,
    toposort_of,
)
from tinyteach.settings import Context
from tinyteach.tensor.gradient import (
    CONTIGUOUS_BACKWARD,
    compute_gradient,
    graph_before_realize,
    reachable_by_gradient,
)
from tinyteach.tensor.multi import (
    MultiUOp,
    ShardingError,
    all_reduce,
    canonical_devices,
    each_shard,
    reads_a_device,
    shard_uop,
    shards_of,
)

Scalar = int | float | bool
ShapeArg = int | Sequence[int]


class ArgumentError(ValueError, RuntimeError):
    """An argument an op refuses (a shape that does not fit, an unknown mode, a repeated
    axis). tinyteach's class is ValueError; torch and tinygrad raise RuntimeError. This error
    is both, so code written for either catches it."""


class ShapeError(ArgumentError):
    """Shapes that do not fit together (matmul, broadcasting, gather, scatter, conv)."""


class DTypeError(TypeError, RuntimeError):
    """An operand of a dtype the op does not take: TypeError here, RuntimeError in torch and
    tinygrad (bitwise ops on floats, a scatter whose src has another dtype)."""


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcasting rule: align from the right; sizes must match or be 1."""
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + s for s in shapes]
    result = []
    for sizes in zip(*padded):
        non_one = {s for s in sizes if s != 1}
        if len(non_one) > 1:
            numbers = sorted(str(s) for s in non_one if isinstance(s, int))
            numbers.sort(key=int)
            symbols = sorted(describe_size(s) for s in non_one if isinstance(s, UOp))
            raise ShapeError(f"cannot broadcast shapes {' and '.join(map(str, shapes))}: "
                             f"sizes [{', '.join(numbers + symbols)}] differ on one axis")
        result.append(non_one.pop() if non_one else 1)
    return tuple(result)


# ---- what autograd remembers across tensors ----

def _by_id() -> weakref.WeakValueDictionary[int, CoreTensor]:
    # keyed by id: a WeakSet would compare tensors with ==, which builds a graph
    return weakref.WeakValueDictionary()


class LiveTensors:
    """Every live tensor, by id, held weakly (`AUTOGRAD.tensors`).

    A WeakValueDictionary would do, but registering in one is three Python calls and each
    death a fourth (its callback), and an eager loop makes and drops tensors all the time.
    Here each tensor is a plain `weakref.ref` without a callback (made in C): a dead one is
    skipped when the tensors are listed, and swept out when the table has doubled since the
    last sweep, so the table stays under twice the live count at no cost per death."""

    def __init__(self) -> None:
        self.refs: dict[int, weakref.ref[CoreTensor]] = {}
        self.sweep_at = 1024

    def add(self, tensor: CoreTensor) -> None:
        key, refs = id(tensor), self.refs
        refs.pop(key, None)  # a dead tensor's id, reused: the new one goes last (creation order)
        refs[key] = weakref.ref(tensor)
        if len(refs) > self.sweep_at:
            self.sweep()

    def sweep(self) -> None:
        """Drop the references of dead tensors."""
        self.refs = {key: ref for key, ref in self.refs.items() if ref() is not None}
        self.sweep_at = max(1024, 2 * len(self.refs))

    def values(self) -> list[CoreTensor]:
        """The live tensors, oldest first."""
        alive = [ref() for ref in self.refs.values()]
        return [tensor for tensor in alive if tensor is not None]

    def get(self, key: int) -> CoreTensor | None:
        ref = self.refs.get(key)
        return None if ref is None else ref()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.get(key) is not None

    def __len__(self) -> int:
        return len(self.values())


@dataclass
class AutogradState:
    """Everything realize() and backward() remember across tensors. There is one, `AUTOGRAD`.

    Each tensor carries two fields of its own: `requires_grad` (True, None or False) and
    `_lazy`, the graph its buffer was computed from once it is realized (None for a leaf and
    for host data). The invariant that ties them to the fields here:
    - `tensors` holds every live tensor (registered when it is made, gone when it dies):
      `backward()` fills `.grad` on each one whose graph (`uop`, or `_lazy` once realized) its
      gradient reaches, that is floating point, not a constant and not requires_grad=False,
      adding to a `.grad` already there (tinygrad's rule: intermediate results get one too);
    - `leaves` holds exactly the live tensors whose requires_grad was set to True: each is a
      buffer of its own (setting True on a lazy tensor computes it first). A tensor computed
      from a leaf has requires_grad True too, but is not a leaf;
    - `graph_behind` maps the buffer of every realized non-leaf tensor with requires_grad True
      to its lazy graph, so that a graph built on that buffer still reaches the leaves:
      gradient.graph_before_realize puts the graph back before differentiating;
    - a realize that assigns into a buffer also computes every live lazy tensor in `tensors`
      that reads the buffer's old contents, before the assign overwrites them (`_still_lazy`),
      so `loss.backward(); opt.step(); loss.item()` reports the loss before the step.
    Every map holds its keys or values weakly: autograd keeps nothing alive on its own."""

    tensors: LiveTensors = field(default_factory=LiveTensors)
    leaves: weakref.WeakValueDictionary[int, CoreTensor] = field(default_factory=_by_id)
    graph_behind: weakref.WeakKeyDictionary[UOp, UOp] = field(
        default_factory=weakref.WeakKeyDictionary)


AUTOGRAD = AutogradState()


class _ClassSwitch(contextlib.ContextDecorator):
    """Set a class-level switch of Tensor for a `with` block or a decorated function, then
    put the previous value back: `Tensor.train()` sets `training` (and the TRAINING context),
    `Tensor.test()` sets `no_grad` (tinygrad's names)."""

    def __init__(self, owner: type, name: str, value: bool,
                 context: contextlib.AbstractContextManager[Any] | None = None):
        self.owner, self.name, self.value, self.context = owner, name, value, context

    def __enter__(self) -> None:
        self.previous = getattr(self.owner, self.name)
        setattr(self.owner, self.name, self.value)
        if self.context is not None:
            self.context.__enter__()

    def __exit__(self, *args: Any) -> None:
        if self.context is not None:
            self.context.__exit__(*args)
        setattr(self.owner, self.name, self.previous)


# devices that cannot compute bfloat16, with the reason (the others convert its 16-bit words
# to float32 and back: runtime/numpy.py, render/c.py; WEBGPU's renderer refuses it itself)
class CoreTensor:
    """A lazily computed n-dimensional array on a device, with reverse-mode autograd: the
    primitive ops. The parts of chapter 1 build the rest of the API on it (module docstring)."""

    training: ClassVar[bool] = False
    no_grad: ClassVar[bool] = False  # tinygrad's switch: results made while True get no gradient
    __hash__ = object.__hash__  # `==` builds a graph, so hashing is by identity

    def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None,
                 requires_grad: bool | None = None):
        wanted = None if dtype is None else dtypes.as_dtype(dtype)
        self.device: str  # (a tuple of devices for a sharded tensor: tensor/multi.py)
        self.uop: UOp  # (a MultiUOp for a sharded tensor)
        if isinstance(device, (tuple, list)):  # on several devices: replicated on each
            self.device, self.uop = _sharded_node(data, canonical_devices(device), wanted)
        else:
            self.device = Device.canonicalize(device)
            self.uop = _node_of(data, wanted, self.device)
        self.grad: Self | None = None
        self._lazy: UOp | None = None  # the graph before realize, kept for backward()
        self.requires_grad = requires_grad
        AUTOGRAD.tensors.add(self)  # (weakly) so that backward() can find it

    @classmethod
    def _from_uop(cls, uop: UOp, device: str) -> Self:
        """The lean constructor of an op's result: its node is built and its device already
        canonical, so what `__init__` converts and checks is done (building results is much
        of an eager realize: `x + 1` makes one). The same fields, the same registration."""
        tensor = cls.__new__(cls)
        tensor.uop, tensor.device, tensor.grad, tensor._lazy = uop, device, None, None
        tensor._requires_grad = None
        AUTOGRAD.tensors.add(tensor)
        return tensor

    @property
    def requires_grad(self) -> bool | None:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        if value:
            if not dtypes.is_float(self.dtype):
                raise TypeError(f"only float tensors can require gradients, not {self.dtype}")
            if not _is_buffer(self.uop):
                self._requires_grad = None  # realized as a plain tensor, with no graph kept
                self._become_leaf()
            AUTOGRAD.leaves[id(self)] = self
        self._requires_grad = None if value is None else bool(value)

    def requires_grad_(self, requires_grad: bool | None = True) -> Self:
        """Set requires_grad and return the tensor (tinygrad's and PyTorch's)."""
        self.requires_grad = requires_grad
        return self

    def _become_leaf(self) -> None:
        """Compute this tensor into a buffer of its own and forget how it was made, as a
        PyTorch leaf. UOps are shared (hash-consed) and realized graphs are remembered:
        `zeros(2)` is the same node, and realizes to the same buffer, as every other
        `zeros(2)`; only a fresh buffer tells one parameter from another."""
        if isinstance(self.uop, MultiUOp):  # fresh buffers on each device, copied from one
            multi = self.uop
            host = _uop_from_data(self.numpy(), self.dtype, multi.devices[0])
            self.uop = shard_uop(host, multi.devices, multi.axis)
            self.realize()
        else:
            self.uop = _uop_from_data(self.numpy(), self.dtype, self.device)  # a copy, no math
        self._lazy = None

    @classmethod
    def train(cls, mode: bool = True) -> _ClassSwitch:
        """`with Tensor.train():` (or `@Tensor.train()`): dropout and batchnorm statistics on."""
        return _ClassSwitch(cls, "training", mode, Context(TRAINING=int(mode)))

    @classmethod
    def test(cls, mode: bool = True) -> _ClassSwitch:
        """`with Tensor.test():` (or `@Tensor.test()`): `Tensor.no_grad` is True inside, so
        nothing made there gets a gradient (tinygrad's; PyTorch's `torch.no_grad()`)."""
        return _ClassSwitch(cls, "no_grad", mode)

    # ---- what a tensor is ----

    @property
    def shape(self) -> tuple[int, ...]:
        """The sizes; a symbolic size is a UOp over Variables (printed by name, `(i, 4)`;
        typed as ints, see UOp.shape)."""
        return self.uop.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return cast(int, sym_prod(self.shape))  # (symbolic for a symbolic shape: see shape)

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        return self.shape if dim is None else self.shape[self._axis(dim)]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        state = "realized" if _is_buffer(self.uop) else "lazy"
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"<Tensor {state} shape={self.shape} dtype={self.dtype} device={self.device}{grad}>"

    # ---- running the graph ----

    def realize(self, *others: Self) -> Self:
        """Compute this tensor (and `others`): `t.realize()` or `Tensor.realize(a, b, c)`.
        Three steps: pick the tensors that still need computing, run their graphs in one
        schedule (engine/realize.py), and point each tensor at its buffer."""
        # (the WeakSet's own set of references: its truth is a C call, the WeakSet's a Python one)
        sharded = isinstance(self.uop, MultiUOp)
        if not others and not sharded and not _SCHEDULED_NOT_RUN.data:  # type: ignore[attr-defined]
            if is_contiguous_buffer(self.uop):
                return self  # already a buffer (a JIT's inputs, every call): nothing to do
            # the lean path (engine/realize.py): one elementwise kernel over realized buffers, whose
            # plan is cached. Such a graph assigns nothing, so no other tensor need be computed
            # with it (`_still_lazy`), and it reads no unrun schedule() output (checked above)
            result = realize_elementwise(self.uop, self.device)
            if result is not None:
                self._point_at(result)
                return self
        if sharded or (others and any(isinstance(t.uop, MultiUOp) for t in others)):
            return self._realize_sharded(*others)
        pending = _still_lazy(list({id(t): t for t in (self, *others)}.values()))
        if any(isinstance(t.uop, MultiUOp) for t in pending):
            # a live sharded tensor reads what this assigns over (a random draw on a tuple of
            # devices reads the key that manual_seed rewrites): it is computed first, shard by shard
            return self._realize_sharded(*others)
        _refuse_unrun([self.uop, *(t.uop for t in others)])
        if pending:
            graphs, devices = [t.uop for t in pending], [t.device for t in pending]
            results = realize_uops(graphs, self.device)
            for tensor, result in zip(pending, _distinct(graphs, devices, results)):
                tensor._point_at(result)
        return self

    def _realize_sharded(self, *others: Self) -> Self:
        """`realize` where a tensor is sharded (tensor/multi.py): the same steps, over every
        shard."""
        pending = _still_lazy(list({id(t): t for t in (self, *others)}.values()))
        _refuse_unrun([graph for t in (self, *others) for graph in shards_of(t.uop)])
        if pending:
            default = self.uop.devices[0] if isinstance(self.uop, MultiUOp) else self.device
            for tensor, result in zip(pending, _realize_tensors(pending, default)):
                tensor._point_at(result)
        return self

    def schedule(self, *others: Self) -> list[ScheduleItem]:
        """tinygrad's `schedule()`: the kernels that would compute this tensor (and `others`),
        without running them. Each item can be read (`name`, `ast`, `buffers`, `device`,
        `boundary_reason`). The tensors are pointed at their output buffers at once, empty
        until `realize.run_schedule(items)` runs the items in order: `realize()` is these two
        steps (through the plan cache)."""
        pending = _still_lazy(list({id(t): t for t in (self, *others)}.values()))
        if not pending:
            return []
        if any(isinstance(t.uop, MultiUOp) for t in pending):
            raise ShardingError("schedule() of a sharded tensor: realize() it instead")
        _refuse_unrun([t.uop for t in pending])
        graphs, devices = [t.uop for t in pending], [t.device for t in pending]
        items, results = schedule_uops(graphs, self.device)
        for tensor, result in zip(pending, _distinct(graphs, devices, results, items)):
            tensor._point_at(result)
        _SCHEDULED_NOT_RUN.update(item.output for item in items if not item.output.is_allocated)
        return items

    def schedule_with_vars(self, *others: Self) -> tuple[list[ScheduleItem], dict[str, int]]:
        """tinygrad's `schedule_with_vars()`: `schedule()`, and the values of the Variables its
        symbolic sizes are bound to (name -> value; each item also keeps its own, which
        `run_schedule` passes to its kernel)."""
        items = self.schedule(*others)
        var_vals: dict[str, int] = {}
        for item in items:
            var_vals.update(item.var_vals)
        return items, var_vals

    def _point_at(self, result: UOp) -> None:
        """Make `result` (this tensor's computed buffer) its graph, and keep what backward()
        needs: the lazy graph in `_lazy`, and, for a non-leaf on a path to a leaf, the same
        graph in AUTOGRAD.graph_behind (see AutogradState)."""
        if isinstance(self.uop, MultiUOp):
            return self._point_shards_at(cast(MultiUOp, result))
        if self._requires_grad is not None or self.uop.op is not Ops.BUFFER:
            self._lazy = self._lazy or self.uop
        lazy = self._lazy or self.uop
        if self._requires_grad and id(self) not in AUTOGRAD.leaves and result is not lazy:
            AUTOGRAD.graph_behind[result] = lazy  # (a view of a buffer is its own graph)
        self.uop = result

    def _point_shards_at(self, result: MultiUOp) -> None:
        """`_point_at` for a sharded tensor: the same, shard by shard."""
        multi = cast(MultiUOp, self.uop)
        if self._requires_grad is not None or any(s.op is not Ops.BUFFER for s in multi.shards):
            self._lazy = self._lazy or self.uop
        lazy = self._lazy or self.uop
        if self._requires_grad and id(self) not in AUTOGRAD.leaves:
            for computed, graph in zip(result.shards, shards_of(lazy)):
                if computed is not graph:
                    AUTOGRAD.graph_behind[computed] = graph
        self.uop = cast(UOp, result)

    def _buffer(self) -> Buffer:
        if isinstance(self.uop, MultiUOp):  # gathered on the first device
            return self.to(self.uop.devices[0])._buffer()
        node = self.realize().uop
        if not is_contiguous_buffer(node):  # a view of a buffer: copy it into a fresh one
            node = self.contiguous().realize().uop
        base = base_buffer(node)
        assert base is not None, "a realized tensor is a view of its buffer"
        _refuse_unrun([base])
        buffer: Buffer = base.arg
        return buffer

    def numpy(self) -> np.ndarray:
        """Compute the tensor and return its values as a numpy array (a copy). numpy has no
        bfloat16: a bfloat16 tensor's values come back as float32 (exactly; tinygrad's). A
        symbolic shape gives the array of its bound sizes (the buffer has room for the
        largest)."""
        shape = sym_shape_eval(self.shape) if self.uop.has_symbols else self.shape
        values = self._buffer().numpy()[:prod(shape)]
        if self.dtype == dtypes.bfloat16:
            return from_bfloat16_bits(values).reshape(shape)
        return values.reshape(shape)

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with exactly one element, not shape "
                             f"{self.shape}")
        value = self.numpy().reshape(-1)[0]
        return value.item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, device: str) -> Self:
        """This tensor on another device (a COPY node; nothing moves until realized). A
        sharded tensor is gathered there (its shards copied and concatenated); a tuple of
        devices replicates the tensor on each (`shard(devices)`)."""
        if isinstance(device, (tuple, list)):
            if canonical_devices(device) == self.device:
                return self
            if isinstance(self.uop, MultiUOp):
                return self.to(self.uop.devices[0]).shard(device)
            return self.shard(device)
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        if isinstance(self.uop, MultiUOp):
            node = self.uop.gather(device)
        else:
            node = UOp(Ops.COPY, self.dtype, (self.uop,), device)
        result = type(self)(node, device)
        result._inherit_grad(self)
        return result

    def shard(self, devices: Sequence[str], axis: int | None = None) -> Self:
        """This tensor over several devices: cut into len(devices) equal parts along `axis`,
        part i copied to devices[i] (axis None: a whole copy on each, *replicated*). Its
        `.device` is the tuple of devices; ops run on every part (tensor/multi.py)."""
        names = canonical_devices(devices)
        if isinstance(self.uop, MultiUOp):
            raise ValueError(f"shard: this tensor is already sharded over {self.device}; "
                             f"gather it with .to(device) first")
        if self.uop.has_symbols:
            raise ValueError(f"shard: a tensor of symbolic shape {self.shape} cannot be split")
        split = None if axis is None else self._axis(axis)
        node = cast(UOp, shard_uop(self.uop, names, split))
        result = type(self)._from_uop(node, cast(str, names))
        result._inherit_grad(self)
        return result

    def shard_(self, devices: Sequence[str], axis: int | None = None) -> Self:
        """Shard this tensor in place (for parameters: the model keeps its tensors), each
        part computed into a buffer of its own on its device."""
        sharded = self.shard(devices, axis)
        self.uop = each_shard(sharded.uop, _into_buffer)  # (a part still on its device: a view)
        self.device, self._lazy = sharded.device, None
        self.realize()
        self._lazy = None
        return self

    def detach(self) -> Self:
        return type(self)(each_shard(self.uop, _detached), self.device)

    def contiguous(self) -> Self:
        return self._apply(each_shard(self.uop, _contiguous), self)

    def contiguous_backward(self) -> Self:
        """The same value; in backward, the gradient that flows through here is computed into
        a buffer of its own (tinygrad's), which cuts a long backward graph into kernels."""
        marked = each_shard(self.uop, _contiguous_backward)
        return self._apply(marked, self)

    def clone(self) -> Self:
        return self.contiguous()

    # ---- building results ----

    def _apply(self, uop: UOp, *sources: CoreTensor) -> Self:
        if type(self).no_grad and any(s.requires_grad is not False for s in sources) and \
                dtypes.is_float(uop.dtype):
            uop = each_shard(uop, _detached)  # made under no_grad: gradients stop here
        result = type(self)._from_uop(uop, self.device)
        result._inherit_grad(*sources)
        return result

    def _inherit_grad(self, *sources: CoreTensor) -> None:
        """tinygrad's rule: True if a source requires a gradient (and no_grad is off), False if
        every source is False, else None."""
        wanted = [s._requires_grad for s in sources]  # (the field: the property is a call)
        if True in wanted:  # (each is True, False or None: the setter stores a bool)
            if not type(self).no_grad:
                self._requires_grad = True
        elif wanted and None not in wanted:  # every source False
            self._requires_grad = False

    def _const(self, value: Scalar, dtype: DType | None = None) -> Self:
        """A scalar constant broadcast to this tensor's shape."""
        node = UOp.const(dtype or self.dtype, value)
        shape = self.shape
        if shape:
            node = node.reshape((1,) * len(shape)).expand(shape)
        return type(self)(node, self.device, requires_grad=False)

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
            raise ArgumentError(f"repeated axis in {axes}")
        return normalized

    # ---- movement: the six primitive movement ops (the rest are in tensor/movement.py) ----

    def reshape(self, *shape: Any) -> Self:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        # None keeps that axis's size (tinygrad's reshape((None, None, 6, 6)))
        shape = tuple(self.shape[i] if s is None else s for i, s in enumerate(shape))
        new_shape = list(_shape_from_maybe_negative(shape))
        if new_shape.count(-1) > 1:
            raise ArgumentError(f"reshape: only one -1 allowed, got {tuple(new_shape)}")
        if self.uop.has_symbols or any(isinstance(s, UOp) for s in new_shape):
            return self._symbolic_reshape(new_shape)
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

    def _symbolic_reshape(self, new_shape: list[int]) -> Self:
        """tinygrad's rule for a symbolic reshape: the element count stays the same, as an
        expression ((i, 4) -> (i*4,) and back; -1 stands for what is left when that is an
        int or a symbolic size times an int)."""
        if -1 in new_shape:
            known = sym_prod(s for s in new_shape if not isinstance(s, int) or s != -1)
            new_shape[new_shape.index(-1)] = cast(int, _divide_count(self.numel(), known,
                                                                     self.shape))
        if not _same_count(sym_prod(new_shape), self.numel()):
            raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to "
                             f"{tuple(new_shape)} ({sym_prod(new_shape)} elements): a symbolic "
                             "reshape must keep the element count")
        return self._apply(self.uop.reshape(tuple(new_shape)), self)

    def permute(self, *order: Any) -> Self:
        axes = _shape_from_maybe_negative(order)
        normalized = tuple(self._axis(a) for a in axes)
        if sorted(normalized) != list(range(self.ndim)):
            raise ArgumentError(f"permute order {axes} is not a permutation of the {self.ndim} "
                             f"axes of shape {self.shape}")
        return self._apply(self.uop.permute(normalized), self)

    def expand(self, *shape: Any) -> Self:
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

    def pad(self, padding: Sequence[Any], mode: str = "constant", value: Scalar = 0) -> Self:
        """`padding` is ((before, after) or None per axis), or PyTorch's flat form
        (left, right, top, bottom, ...) that starts from the last axis, filled with `value`.
        (TensorMovement adds the modes "reflect", "replicate" and "circular".)"""
        if isinstance(mode, (int, float)):  # tinygrad's old pad(padding, value) order
            mode, value = "constant", mode
        if mode != "constant":
            raise ValueError(f"the core pads with a constant only, not mode {mode!r}")
        pairs = padding_pairs(padding, self.ndim)
        if any(sym_min(b) < 0 or sym_min(a) < 0 for b, a in pairs):
            if any(isinstance(p, UOp) for pair in pairs for p in pair):
                raise ValueError(f"a symbolic pad must be >= 0 for every value, got {pairs}")
            cropped = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape))
            return self.shrink(cropped).pad([(max(0, b), max(0, a)) for b, a in pairs],
                                            value=value)
        padded = self._apply(self.uop.pad(tuple(pairs)), self)
        if value == 0:
            return padded
        inside = self._const(True, dtypes.bool).pad(pairs)  # False where the padding is
        return inside.where(padded, value)

    def shrink(self, bounds: Sequence[tuple[sint, sint] | None]) -> Self:
        if len(bounds) != self.ndim:
            raise ValueError(f"shrink needs {self.ndim} bounds for shape {self.shape}, "
                             f"got {len(bounds)}")
        full = tuple((0, s) if b is None else (as_sint(b[0]), as_sint(b[1]))
                     for b, s in zip(bounds, self.shape))
        for (start, end), size in zip(full, self.shape):
            if not _shrink_fits(start, end, size):
                raise ValueError(f"shrink bounds {full} out of range for shape {self.shape}"
                                 + _symbolic_note(start, end, size))
        return self._apply(self.uop.shrink(full), self)

    def flip(self, axis: int | Sequence[int]) -> Self:
        axes = self._axes(axis)
        return self._apply(self.uop.flip(tuple(a for a in axes if self.shape[a] > 1)), self)

    # ---- elementwise: broadcasting and promotion, then one primitive op ----

    def _broadcasted(self, other: Any, reverse: bool = False,
                     float_result: bool = False) -> tuple[Self, Self]:
        x, y = self, other
        if isinstance(y, UOp):  # a symbolic int (a bound Variable, `v + 1`): an int32 scalar
            y = type(self)(y, self.device, requires_grad=False)
        if not isinstance(y, CoreTensor):
            dtype = scalar_dtype(self.dtype, y)
            if isinstance(y, (bool, int, float)) and dtype == self.dtype and \
                    (not float_result or dtypes.is_float(dtype)):
                # `x + 1`, the common case: the constant is made at x's shape and dtype at
                # once, one Tensor instead of three (building them is most of an eager realize)
                constant = self._const(y)
                return (constant, self) if reverse else (self, constant)
            y = type(self)(y, self.device, dtype=dtype, requires_grad=False)
        elif y.device != x.device:
            raise RuntimeError(f"tensors are on different devices: {x.device} and {y.device}; "
                               f"move one with .to()")
        if reverse:
            x, y = y, x
        dtype = least_upper_dtype(x.dtype, y.dtype)
        if float_result:
            dtype = least_upper_float(dtype)
        shape = broadcast_shape(x.shape, y.shape)
        x, y = x.cast(dtype), y.cast(dtype)
        # a tensor of the right shape already is used as it is (expand would wrap it anew)
        return (x if x.shape == shape else x.expand(shape),
                y if y.shape == shape else y.expand(shape))

    def _binary(self, op: Ops, other: Any, reverse: bool = False) -> Self:
        dtype = self.uop.dtype
        if type(other) in (int, float) and (dtype.kind == "float" or type(other) is int) and \
                dtype.kind != "bool" and not isinstance(self.uop, MultiUOp):
            # `x + 1`, the common case of an eager loop, where the scalar takes x's dtype
            # (scalar_dtype): the constant is a node at x's shape, found in `_CONSTANTS`, not
            # a Tensor, and the node is built as `alu` would (the shapes are equal). A constant
            # never requires a gradient: the result inherits from x alone, as
            # `_inherit_grad(x, constant)` would say
            constant = _broadcast_constant(dtype, other, self.uop.shape)
            sources = (constant, self.uop) if reverse else (self.uop, constant)
            return self._apply(UOp(op, dtypes.bool if op in COMPARISONS else dtype, sources),
                               self)
        x, y = self._broadcasted(other, reverse)
        return x._apply(x.uop.alu(op, y.uop), x, y)

    def _unary(self, op: Ops) -> Self:
        return self._apply(self.uop.alu(op), self)

    def cast(self, dtype: DType | str | type) -> Self:
        """The values converted to `dtype` (`bitcast` keeps the bits instead). Every device
        converts alike: integers wrap around, floats round to nearest, anything to bool is
        `x != 0`, and a float to an integer type truncates toward zero and saturates to the
        type's range, NaN -> 0 (where C is undefined: dtype.float_to_int).

        >>> Tensor([2.7, -2.7, 1e10, float("nan")]).cast(dtypes.int32).tolist()
        [2, -2, 2147483647, 0]
        """
        wanted = dtypes.as_dtype(dtype)
        return self if wanted == self.dtype else self._apply(self.uop.cast(wanted), self)

    def _to_float(self) -> Self:
        return self.cast(least_upper_float(self.dtype))

    def add(self, other: Any, reverse: bool = False) -> Self:
        return self._binary(Ops.ADD, other, reverse)

    def mul(self, other: Any, reverse: bool = False) -> Self:
        return self._binary(Ops.MUL, other, reverse)

    def sub(self, other: Any, reverse: bool = False) -> Self:
        x, y = self._broadcasted(other, reverse)
        return x + (-y)

    # the five unary primitives (tensor/math.py composes every other function from them)
    def exp2(self) -> Self:
        return self._to_float()._unary(Ops.EXP2)

    def log2(self) -> Self:
        return self._to_float()._unary(Ops.LOG2)

    def sin(self) -> Self:
        return self._to_float()._unary(Ops.SIN)

    def sqrt(self) -> Self:
        return self._to_float()._unary(Ops.SQRT)

    def reciprocal(self) -> Self:
        return self._to_float()._unary(Ops.RECIPROCAL)

    def div(self, other: Any, reverse: bool = False, rounding_mode: str | None = None) -> Self:
        """True division: integers are divided as floats. PyTorch's `rounding_mode` rounds the
        quotient toward zero ("trunc") or down ("floor"); integers then stay integers.
        (TensorMath adds the rounding modes.)"""
        if rounding_mode is not None:
            raise ArgumentError(f"the core divides without rounding, not rounding_mode "
                             f"{rounding_mode!r}")
        x, y = self._broadcasted(other, reverse, float_result=True)
        return x._apply(x.uop.alu(Ops.FDIV, y.uop), x, y)  # rounded once, as torch's `/`

    def neg(self) -> Self:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return self._unary(Ops.NEG)

    def __neg__(self) -> Self:
        return self.neg()

    def __add__(self, other: Any) -> Self:
        return self.add(other)

    def __radd__(self, other: Any) -> Self:
        return self.add(other, True)

    def __sub__(self, other: Any) -> Self:
        return self.sub(other)

    def __rsub__(self, other: Any) -> Self:
        return self.sub(other, True)

    def __mul__(self, other: Any) -> Self:
        return self.mul(other)

    def __rmul__(self, other: Any) -> Self:
        return self.mul(other, True)

    def __truediv__(self, other: Any) -> Self:
        return self.div(other)

    def __rtruediv__(self, other: Any) -> Self:
        return self.div(other, True)

    def __and__(self, other: Any) -> Self:
        return self._bitwise(Ops.AND, other)

    def __rand__(self, other: Any) -> Self:
        return self._bitwise(Ops.AND, other, True)

    def __or__(self, other: Any) -> Self:
        return self._bitwise(Ops.OR, other)

    def __ror__(self, other: Any) -> Self:
        return self._bitwise(Ops.OR, other, True)

    def __xor__(self, other: Any) -> Self:
        return self._bitwise(Ops.XOR, other)

    def __rxor__(self, other: Any) -> Self:
        return self._bitwise(Ops.XOR, other, True)

    def _bitwise(self, op: Ops, other: Any, reverse: bool = False) -> Self:
        """&, | and ^ on bools and integers; floats have no bits to combine (C refuses them)."""
        result = self._binary(op, other, reverse)
        if dtypes.is_float(result.dtype):
            raise DTypeError(f"{op.name.lower()} needs integer or bool operands, not "
                             f"{result.dtype.name}")
        return result

    def __invert__(self) -> Self:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        if dtypes.is_float(self.dtype):
            raise DTypeError(f"~ needs an integer or bool tensor, not {self.dtype}")
        return self ^ self._const(-1 if self.dtype.kind == "int" else self.dtype.max)

    # comparisons give bool tensors (and build graphs, so tensors hash by identity)
    def __lt__(self, other: Any) -> Self:
        return self._binary(Ops.CMPLT, other)

    def __gt__(self, other: Any) -> Self:
        return self._binary(Ops.CMPLT, other, True)

    def __le__(self, other: Any) -> Self:
        return (self < other) | (self == other)

    def __ge__(self, other: Any) -> Self:
        return (self > other) | (self == other)

    def __ne__(self, other: Any) -> Self:  # type: ignore[override]
        return self._binary(Ops.CMPNE, other)

    def __eq__(self, other: Any) -> Self:  # type: ignore[override]
        return (self != other).logical_not()

    def logical_not(self) -> Self:
        return self.cast(dtypes.bool)._binary(Ops.CMPNE, True)

    def where(self, if_true: Any, if_false: Any) -> Self:
        """self ? if_true : if_false, with broadcasting (self is used as a condition)."""
        condition = self.cast(dtypes.bool)
        if not isinstance(if_true, CoreTensor) and not isinstance(if_false, CoreTensor):
            dtype = least_upper_dtype(dtypes.from_py(if_true), dtypes.from_py(if_false))
            if_true = type(self)(if_true, self.device, dtype=dtype, requires_grad=False)
        if isinstance(if_true, type(self)):
            x, y = if_true._broadcasted(if_false)
        else:
            y, x = type(self)._broadcasted(if_false, if_true)
        shape = broadcast_shape(condition.shape, x.shape)
        c, x, y = condition.expand(shape), x.expand(shape), y.expand(shape)
        return x._apply(c.uop.alu(Ops.WHERE, x.uop, y.uop), x, y)

    def maximum(self, other: Any) -> Self:
        return self._binary(Ops.MAX, other)

    # ---- reduction: one primitive op, summing or taking the max (the rest: tensor/math.py) ----

    def sum(self, axis: Any = None, keepdim: bool = False,
            dtype: DType | str | type | None = None) -> Self:
        """Sums accumulate in at least 32 bits (half floats in float32: `sum_acc_dtype`), as in
        tinygrad; `dtype` casts the input first and is the result's dtype (PyTorch's)."""
        result = sum_dtype(self.dtype) if dtype is None else dtypes.as_dtype(dtype)
        wide = self.cast(result).cast(sum_acc_dtype(result))
        return wide._reduce(Ops.ADD, axis, keepdim).cast(result)

    def max(self, axis: Any = None, keepdim: bool = False) -> Self:
        return self._reduce(Ops.MAX, axis, keepdim)

    def _reduce(self, op: Ops, axis: Any, keepdim: bool) -> Self:
        axes = self._axes(axis)
        if self.ndim == 0:
            return self
        if self.dtype == dtypes.bfloat16:  # reduced in float32, rounded once (PyTorch's)
            return self.float()._reduce(op, axis, keepdim).cast(dtypes.bfloat16)
        reduced = self._apply(self.uop.reduce(op, axes), self)
        if keepdim:
            return reduced
        return reduced.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    # ---- autograd ----

    def gradient(self, *targets: CoreTensor, gradient: CoreTensor | None = None) -> list[Self]:
        """The gradients of this tensor with respect to `targets`, as new lazy tensors; `.grad`
        is not touched (tinygrad's; PyTorch's torch.autograd.grad). A target the gradient does
        not reach gets zeros. `gradient` is the output's own gradient, needed unless the
        output is a scalar."""
        if not dtypes.is_float(self.dtype) or any(not dtypes.is_float(t.dtype) for t in targets):
            raise RuntimeError("only float tensors have gradients")
        if gradient is None:
            if self.shape != ():
                raise ValueError(f"gradient of a non-scalar tensor (shape {self.shape}) needs "
                                 f"`gradient=`, the gradient of the output")
            gradient = type(self)(1.0, self.device, dtype=self.dtype)
        if gradient.shape != self.shape:
            raise ValueError(f"gradient shape {gradient.shape} != tensor shape {self.shape}")
        root = graph_before_realize(_root_graph(self), AUTOGRAD.graph_behind)
        target_nodes = {node for t in targets for graph in (t.uop, t._lazy) if graph is not None
                        for node in shards_of(graph)}
        grads = compute_gradient(root, shards_of(gradient.uop)[0], target_nodes, _copy_back)
        results = []
        for t in targets:
            if isinstance(t.uop, MultiUOp):
                results.append(type(self)(_sharded_gradient(t, grads), t.device))
                continue
            node = t.uop if t.uop in grads else t._lazy
            reached = node is not None and node in grads
            grad = grads[node] if node is not None and reached else t._const(0.0).uop
            results.append(type(self)(grad, t.device))
        return results

    def backward(self, gradient: CoreTensor | None = None) -> Self:
        """Add this tensor's gradient to `.grad` of every live tensor below it that can have
        one: floating point, not a constant, requires_grad not False (tinygrad's rule; the
        loss itself gets a `.grad` of ones). Gradients stop at detach(), no_grad, comparisons
        and tensors with requires_grad=False."""
        if gradient is None and self.shape != ():
            raise ValueError(f"backward() needs a scalar (shape ()) tensor, this one has shape "
                             f"{self.shape}; pass gradient= for a non-scalar output")
        root = graph_before_realize(_root_graph(self), AUTOGRAD.graph_behind)
        in_graph = reachable_by_gradient(root)
        targets = [t for t in list(AUTOGRAD.tensors.values()) if _gets_gradient(t, in_graph)]
        if not targets:
            raise RuntimeError("backward(): nothing in this graph can have a gradient (it needs "
                               "a float tensor that is not a constant and not "
                               "requires_grad=False)")
        for target, grad in zip(targets, self.gradient(*targets, gradient=gradient)):
            target.grad = grad if target.grad is None else target.grad + grad
        return self

    def assign(self, value: Any) -> Self:
        """Replace this tensor's value (the graph of `value` is computed when realized)."""
        if not isinstance(value, CoreTensor):
            value = type(self)(value, self.device, dtype=self.dtype)
        if value.shape != self.shape or value.dtype != self.dtype or value.device != self.device:
            raise ValueError(f"assign: {value.shape} {value.dtype} on {value.device} does not "
                             f"match {self.shape} {self.dtype} on {self.device}")
        if isinstance(self.uop, MultiUOp):
            self.uop, self._lazy = _assign_shards(self.uop, value.uop), None
            return self
        target = self.uop.src[0] if self.uop.op is Ops.ASSIGN else self.uop
        if is_contiguous_buffer(target) and value.uop is not target:
            # write into the existing buffer: whoever holds it (a JIT, an optimizer) sees it
            self.uop = UOp(Ops.ASSIGN, self.dtype, (target, value.uop))
        else:
            self.uop = value.uop
        self._lazy = None
        return self

    def __iter__(self) -> Iterator[Self]:
        return (self._row(i) for i in range(len(self)))

    def _row(self, i: int) -> Self:
        """self[i] for an int i, from a shrink and a reshape."""
        bounds: list[tuple[int, int] | None] = [None] * self.ndim
        bounds[0] = (i, i + 1)
        return self.shrink(bounds).reshape(self.shape[1:])

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a Tensor is ambiguous; use .item(), .any() or .all()")

    # ---- casts by name: last in the class, because below these definitions the names
    # `float`, `int` and `bool` mean the methods, not the types (for type checkers) ----

    def float(self) -> Self:
        return self.cast(dtypes.float32)

    def half(self) -> Self:
        return self.cast(dtypes.float16)

    def bfloat16(self) -> Self:
        return self.cast(dtypes.bfloat16)

    def double(self) -> Self:
        return self.cast(dtypes.float64)

    def int(self) -> Self:
        return self.cast(dtypes.int32)

    def long(self) -> Self:
        return self.cast(dtypes.int64)

    def bool(self) -> Self:
        return self.cast(dtypes.bool)


# ---- helpers used above ----

_MOVEMENT = (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.FLIP)


def _gets_gradient(tensor: CoreTensor, in_graph: set[UOp]) -> bool:
    """Whether backward() fills `tensor.grad`: its graph is reached, it is a float tensor,
    not a constant (`zeros`, `full`: a CONST seen through movement ops), and not False."""
    if tensor.requires_grad is False or not dtypes.is_float(tensor.dtype):
        return False
    if isinstance(tensor.uop, MultiUOp):
        graphs = shards_of(tensor.uop) + (shards_of(tensor._lazy) if tensor._lazy else ())
        return any(g in in_graph for g in graphs) and \
            any(reads_a_device(s) for s in tensor.uop.shards)
    if tensor.uop not in in_graph and (tensor._lazy is None or tensor._lazy not in in_graph):
        return False
    node = tensor.uop
    while node.op in _MOVEMENT:
        node = node.src[0]
    return node.op is not Ops.CONST


def _distinct(graphs: list[UOp], devices: list[str], results: list[UOp],
              items: list[ScheduleItem] | None = None) -> list[UOp]:
    """Each tensor's buffer, with a copy for every tensor after the first whose graph is the
    same node as an earlier one's. UOps are hash-consed, so `zeros(4).contiguous()` made twice
    is one node, which the schedule computes once into one buffer; two tensors must not share
    it, or an assign to one would change the other. (One kernel per extra copy: each copy of
    the same buffer is the same node again, so they are realized one at a time.) Given the
    `items` of a `schedule()`, the copies are scheduled after them instead of run.
    (`graphs[i]`, on `devices[i]`, was computed into `results[i]`.)"""
    first_of: dict[tuple[UOp, str], UOp] = {}  # (a graph of constants may be on two devices)
    distinct = []
    for graph, device, result in zip(graphs, devices, results):
        if (graph, device) in first_of:
            copy = UOp(Ops.CONTIGUOUS, result.dtype, (first_of[graph, device],))
            if items is None:
                result = realize_uops([copy], device)[0]
            else:
                copy_items, (result,) = schedule_uops([copy], device)
                items.extend(copy_items)
        else:
            first_of[graph, device] = result
        distinct.append(result)
    return distinct


def _realize_tensors(tensors: list[CoreTensor], default_device: str) -> list[UOp]:
    """The computed node of each tensor, all in one schedule, where some are sharded: a
    sharded tensor's graphs are its shards (a shard of constants alone is computed on its own
    device: nothing else in it says which device that is)."""
    graphs: list[UOp] = []
    devices: list[str] = []
    for tensor in tensors:
        graphs.extend(shards_of(tensor.uop))
        devices.extend(tensor.uop.devices if isinstance(tensor.uop, MultiUOp) else
                       (tensor.device,))
    results: list[UOp | None] = [None] * len(graphs)
    anchored = [i for i, g in enumerate(graphs) if reads_a_device(g)]
    for i, result in zip(anchored, realize_uops([graphs[i] for i in anchored], default_device)):
        results[i] = result
    for i, graph in enumerate(graphs):
        if results[i] is None:
            results[i] = realize_uops([graph], devices[i])[0]
    flat = _distinct(graphs, devices, cast(list[UOp], results))
    computed: list[UOp] = []
    for tensor in tensors:
        count = len(shards_of(tensor.uop))
        shards, flat = tuple(flat[:count]), flat[count:]
        if isinstance(tensor.uop, MultiUOp):
            computed.append(cast(UOp, MultiUOp(shards, tensor.uop.devices, tensor.uop.axis)))
        else:
            computed.append(shards[0])
    return computed


def _is_buffer(node: UOp | MultiUOp) -> bool:
    """Is the value already in memory (every shard of a sharded tensor)?"""
    if isinstance(node, MultiUOp):
        return all(is_contiguous_buffer(s) for s in node.shards)
    return is_contiguous_buffer(node)


def _root_graph(tensor: CoreTensor) -> UOp:
    """The graph a gradient starts from: the tensor's, or for a replicated tensor its first
    shard's (every shard holds the same value; an all-reduce made it from all of them)."""
    node = tensor._lazy or tensor.uop
    if not isinstance(node, MultiUOp):
        return node
    if node.axis is not None:
        raise ShardingError(f"a gradient of a tensor split on axis {node.axis} over "
                            f"{node.devices}: reduce it (loss.sum(), .mean()) first")
    return node.shards[0]


def _sharded_gradient(tensor: CoreTensor, grads: dict[UOp, UOp]) -> MultiUOp:
    """A sharded tensor's gradient, shard by shard (zeros where none reached). A replicated
    tensor's value is used once per device, so its gradient is the sum of its shards'
    gradients, on every device: an all-reduce (data-parallel training's)."""
    multi = cast(MultiUOp, tensor.uop)
    before = shards_of(tensor._lazy) if tensor._lazy is not None else (None,) * len(multi.shards)
    per_shard = []
    for now, lazy in zip(multi.shards, before):
        node = now if now in grads else lazy
        per_shard.append(grads[node] if node is not None and node in grads else
                         now.const_like(0.0))
    if multi.axis is not None:
        return MultiUOp(tuple(per_shard), multi.devices, multi.axis)
    return MultiUOp(all_reduce(Ops.ADD, tuple(per_shard), multi.devices), multi.devices, None)


def _assign_shards(target: MultiUOp, value: UOp | MultiUOp) -> MultiUOp:
    """`assign` shard by shard: each shard's buffer gets the value's part on its device."""
    if isinstance(value, MultiUOp) and value.axis not in (None, target.axis):
        raise ShardingError(f"assign of a tensor split on axis {value.axis} to one split on "
                            f"axis {target.axis}: shard both alike")
    parts = target._shards_of(value, target.axis)
    assigned = []
    for shard, part in zip(target.shards, parts):
        buffer = shard.src[0] if shard.op is Ops.ASSIGN else shard
        if is_contiguous_buffer(buffer) and part is not buffer:
            assigned.append(UOp(Ops.ASSIGN, shard.dtype, (buffer, part)))
        else:
            assigned.append(part)
    return MultiUOp(tuple(assigned), target.devices, target.axis)


def _into_buffer(node: UOp) -> UOp:
    """The node, or, if it is a view that is not yet a buffer of its own, a copy into one."""
    return node if is_contiguous_buffer(node) else _contiguous(node)


def _detached(node: UOp) -> UOp:
    return UOp(Ops.DETACH, node.dtype, (node,))


def _contiguous(node: UOp) -> UOp:
    return UOp(Ops.CONTIGUOUS, node.dtype, (node,))


def _contiguous_backward(node: UOp) -> UOp:
    return UOp(Ops.DETACH, node.dtype, (node,), CONTIGUOUS_BACKWARD)


# the output buffers `schedule()` handed to tensors: empty until their items run
_SCHEDULED_NOT_RUN: weakref.WeakSet[Buffer] = weakref.WeakSet()


def _refuse_unrun(graphs: list[UOp]) -> None:
    """Raise if a graph reads a buffer that `schedule()` handed out and nothing has computed
    yet (its memory is not even allocated: engine/realize.run allocates a step's buffers just
    before it launches the step)."""
    if not _SCHEDULED_NOT_RUN:
        return
    waiting = set()
    for buffer in list(_SCHEDULED_NOT_RUN):
        if buffer.is_allocated:
            _SCHEDULED_NOT_RUN.discard(buffer)
        else:
            waiting.add(id(buffer))
    for graph in graphs:
        if any(node.op is Ops.BUFFER and id(node.arg) in waiting for node in graph.toposort):
            raise RuntimeError("this tensor reads the output of a schedule() whose items have "
                               "not run yet: run them first (realize.run_schedule(items))")


def _still_lazy(tensors: list[CoreTensor]) -> list[CoreTensor]:
    """The tensors to compute (those not yet a buffer), and with them every other live lazy
    tensor whose graph reads the old contents of a buffer one of them assigns to: it is
    computed in the same schedule, which orders it before the assign overwrites what it reads
    (tinygrad's schedule, too, hands the live tensors it computes their buffers). So
    `out = net(x); loss(out).backward(); opt.step(); out.numpy()` gives `out` as it was
    before the step. (A tensor that is only a view of such a buffer is not lazy: it sees the
    new contents, as a view does in PyTorch.)"""
    pending = [t for t in tensors if not _is_buffer(t.uop)]
    targets = _assigned_buffers(pending)
    if not targets:
        return pending
    chosen = {id(t) for t in pending}
    others = [t for t in list(AUTOGRAD.tensors.values())
              if id(t) not in chosen and not _is_buffer(t.uop)]
    reads = _reads_old_contents(
        [graph for tensor in others for graph in shards_of(tensor.uop)], targets)
    pending += [t for t in others if any(reads[graph] for graph in shards_of(t.uop))]
    return pending


def _assigned_buffers(tensors: list[CoreTensor]) -> set[int]:
    """The ids of the Buffers that the graphs of `tensors` assign to. (One walk over all the
    graphs together: an optimizer step's assigns share the whole backward graph.)"""
    roots = [graph for tensor in tensors for graph in shards_of(tensor.uop)]
    if not roots:
        return set()
    order = roots[0].toposort if len(roots) == 1 else toposort_of(roots)
    return {id(base.arg) for node in order
            if node.op is Ops.ASSIGN and (base := base_buffer(node.src[0])) is not None}


def _reads_old_contents(graphs: list[UOp], targets: set[int]) -> dict[UOp, bool]:
    """For each of `graphs`: does it read one of the `targets` buffers, and could it still be
    computed? A graph that reads a buffer an earlier assign overwrote cannot (the scheduler
    says so when it is realized), and must not stop this realize. One walk over all the graphs
    together: the live gradients of a training step share the whole backward graph, and a walk
    per graph would cost the square of its size."""
    reads_target: dict[UOp, bool] = {}
    reads_overwritten: dict[UOp, bool] = {}
    for node in toposort_of(graphs):
        if node.op is Ops.BUFFER:
            reads_target[node] = id(node.arg) in targets
            reads_overwritten[node] = node.arg.overwritten
        else:
            reads_target[node] = any(reads_target[s] for s in node.src)
            reads_overwritten[node] = any(reads_overwritten[s] for s in node.src)
    return {graph: reads_target[graph] and not reads_overwritten[graph] for graph in graphs}


def _shape_from_maybe_negative(args: tuple[Any, ...]) -> tuple[int, ...]:
    """The sizes given, as ints (a symbolic size stays a UOp: typed int, see UOp.shape)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return cast(tuple[int, ...], tuple(as_sint(s) for s in args))


def _same_count(a: sint, b: sint) -> bool:
    """Are two element counts equal for every value of their Variables? Counts are built by
    sym_prod (ints folded, symbolic factors in order), so equal ones are the same node."""
    return a is b if isinstance(a, UOp) or isinstance(b, UOp) else a == b


def _divide_count(count: sint, known: sint, shape: tuple[sint, ...]) -> sint:
    """count / known for reshape's -1, when it is exact for every value of the Variables."""
    if _same_count(count, known):
        return 1
    if isinstance(known, int) and isinstance(count, int) and known and count % known == 0:
        return count // known
    if isinstance(known, int) and isinstance(count, UOp) and known:
        if known == 1:
            return count
        if count.op is Ops.MUL and count.src[1].op is Ops.CONST and count.src[1].arg % known == 0:
            return sym_mul(count.src[0], int(count.src[1].arg) // known)
    if isinstance(known, UOp) and isinstance(count, UOp) and count.op is Ops.MUL and \
            count.src[0] is known and count.src[1].op is Ops.CONST:
        return int(count.src[1].arg)
    raise ValueError(f"reshape: cannot work out -1 for shape {shape} ({count} elements) and "
                     f"{known} known elements")


def _shrink_fits(start: sint, end: sint, size: sint) -> bool:
    """0 <= start <= end <= size, for every value of the Variables (by their ranges; a size
    may be read up to its variable's largest value, as a JIT replays with new values)."""
    if all(isinstance(x, int) for x in (start, end, size)):
        return 0 <= start <= end <= size  # type: ignore[operator]
    length = sym_sub(end, start)
    if sym_min(start) < 0 or sym_min(length) < 0:
        return False
    if end is size or sym_max(end) <= sym_min(size) or sym_sub(size, end) == 0:
        return True
    return _fits_bound_values(start, end, size)


def _fits_bound_values(start: sint, end: sint, size: sint) -> bool:
    """0 <= start <= end <= size for the values the variables are bound to, when every one is
    bound (tinygrad's rule: `x[:v.bind(2)][:2]` slices a size bound to 2 by 2), and the end
    never past the size's largest value (a symbolic size is stored for its largest value, so
    a replay with another value still reads inside the memory)."""
    try:
        values = [sym_eval(x) for x in (start, end, size)]
    except ValueError:  # an unbound variable: only its range can be checked
        return False
    return 0 <= values[0] <= values[1] <= values[2] and sym_max(end) <= sym_max(size)


def _symbolic_note(start: sint, end: sint, size: sint) -> str:
    if all(isinstance(s, int) for s in (start, end, size)):
        return ""
    return (f" (symbolic bounds are checked over the variables' ranges: start in "
            f"[{sym_min(start)}, {sym_max(start)}], end in [{sym_min(end)}, {sym_max(end)}], "
            f"size in [{sym_min(size)}, {sym_max(size)}])")


# broadcast constants by (dtype, value, shape): `x + 1` in a loop asks for the same one each
# time, and building it (CONST, RESHAPE, EXPAND) is three lookups of the UOp table. A bound
# keeps a loop over many values or shapes from growing it (it starts over, as _TRUNCATED does)
_CONSTANTS: dict[tuple[Any, ...], UOp] = register_memo("tensor.constants", {})


def _broadcast_constant(dtype: DType, value: Scalar, shape: tuple[int, ...]) -> UOp:
    """The constant `value` of `dtype`, broadcast to `shape` (`CoreTensor._const`'s node)."""
    key = (dtype.name, _arg_key(value), shape)  # (a dtype by its name: a str hashes in C)
    node = _CONSTANTS.get(key)
    if node is None:
        if len(_CONSTANTS) > 4096:
            _CONSTANTS.clear()
        node = UOp.const(dtype, value)
        if shape:
            node = node.reshape((1,) * len(shape)).expand(shape)
        _CONSTANTS[key] = node
    return node


def scalar_dtype(tensor_dtype: DType, value: Any) -> DType:
    """A Python scalar adapts to the tensor: int*2 stays int, int*0.5 becomes float."""
    if isinstance(value, bool):
        return tensor_dtype
    if isinstance(value, int):
        return tensor_dtype if tensor_dtype != dtypes.bool else dtypes.default_int
    return tensor_dtype if dtypes.is_float(tensor_dtype) else dtypes.default_float


def padding_pairs(padding: Sequence[Any], ndim: int) -> list[tuple[int, int]]:
    """((before, after) per axis) from either form pad() takes (a symbolic amount stays a
    UOp: typed int, see UOp.shape)."""
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
    return cast(list[tuple[int, int]],
                [(0, 0) if p is None else (as_sint(p[0]), as_sint(p[1])) for p in items])


def sum_dtype(dtype: DType) -> DType:
    """The dtype of a sum's result: at least 32 bits for integers and bools."""
    if dtype.kind == "bool" or (dtype.kind == "int" and dtype.itemsize < 4):
        return dtypes.int32
    if dtype.kind == "uint" and dtype.itemsize < 4:
        return dtypes.uint32
    return dtype


def sum_acc_dtype(dtype: DType) -> DType:
    """The dtype a sum accumulates in (tinygrad's sum_acc_dtype): half and bfloat16 sums add
    in float32 and round once at the end, as PyTorch's do; others in `sum_dtype`."""
    if dtype in (dtypes.float16, dtypes.bfloat16):
        return dtypes.float32
    return sum_dtype(dtype)


# ---- sliding windows from movement ops only: cumsum (arange), convolution and pooling ----

CT = TypeVar("CT", bound=CoreTensor)  # pool returns the class it was given


def pool(x: CT, kernel: Sequence[int], stride: Sequence[int] | None = None,
         dilation: Sequence[int] | None = None) -> CT:
    """Sliding windows over the last len(kernel) axes, with movement ops only.
    Returns shape (..., out_1, ..., out_k, kernel_1, ..., kernel_k)."""
    k = len(kernel)
    stride = stride or (1,) * k
    dilation = dilation or (1,) * k
    leading = x.ndim - k
    if all(size <= step for size, step in zip(kernel, stride)) and all(d == 1 for d in dilation):
        return _tiled_windows(x, kernel, stride)
    for position, (size, step, spread) in enumerate(zip(kernel, stride, dilation)):
        axis = leading + 2 * position  # earlier axes have become (kernel, out) pairs
        x = _windows_1d(x, axis, size, step, spread)
    outs = [leading + 2 * i + 1 for i in range(k)]
    kernels = [leading + 2 * i for i in range(k)]
    return x.permute(list(range(leading)) + outs + kernels)


def _tiled_windows(x: CT, kernel: Sequence[int], stride: Sequence[int]) -> CT:
    """pool's windows when they do not overlap (kernel <= stride, no dilation): each axis
    is cut into `out` tiles of `stride` elements (a reshape) and each tile shrunk to its
    first `kernel`. No element is copied, so the gradient is a reshape back, not a sum over
    the copies that _windows_1d makes."""
    k, leading = len(kernel), x.ndim - len(kernel)
    outs = [(n - size) // step + 1 for n, size, step in
            zip(x.shape[leading:], kernel, stride)]
    if any(size > n for n, size in zip(x.shape[leading:], kernel)):
        raise ValueError(f"window {tuple(kernel)} does not fit in sizes {x.shape[leading:]}")
    used = [o * step for o, step in zip(outs, stride)]
    lead: list[tuple[int, int] | None] = [None] * leading
    x = x.shrink(lead + [(0, min(u, n)) for u, n in zip(used, x.shape[leading:])])
    x = x.pad([(0, 0)] * leading + [(0, u - n) for u, n in zip(used, x.shape[leading:])])
    x = x.reshape(*x.shape[:leading], *[d for o, step in zip(outs, stride) for d in (o, step)])
    x = x.shrink(lead + [b for o, size in zip(outs, kernel) for b in ((0, o), (0, size))])
    order = [leading + 2 * i for i in range(k)] + [leading + 2 * i + 1 for i in range(k)]
    return x.permute(list(range(leading)) + order)


def _windows_1d(x: CT, axis: int, kernel: int, stride: int, dilation: int) -> CT:
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
    repeated = moved.reshape(*before, 1, length, *after).expand(*before, rows, length, *after)
    flat = repeated.reshape(*before, rows * length, *after)
    diagonal = flat.shrink([None] * axis + [(0, kernel * (length + dilation))] +
                           [None] * len(after)).reshape(*before, kernel, length + dilation, *after)
    strided = diagonal.shrink([None] * (axis + 1) + [(0, out * stride)] + [None] * len(after))
    strided = strided.reshape(*before, kernel, out, stride, *after)
    picked = strided.shrink([None] * (axis + 2) + [(0, 1)] + [None] * len(after))
    return picked.reshape(*before, kernel, out, *after)


def _copy_back(grad: UOp, source: UOp) -> UOp:
    return UOp(Ops.COPY, grad.dtype, (grad,), device_of(source, Device.DEFAULT))


def _node_of(data: Any, wanted: DType | None, device: str) -> UOp:
    """The graph of `Tensor(data, device, dtype=wanted)` on one device."""
    if isinstance(data, UOp):
        return data if wanted is None else data.cast(wanted)
    if isinstance(data, CoreTensor):
        return data.to(device).uop if wanted is None else data.cast(wanted).uop
    if isinstance(data, (bool, int, float, np.bool_, np.integer, np.floating)):
        return UOp.const(wanted or dtypes.from_py(data), data)
    return _uop_from_data(data, wanted, device)


def _sharded_node(data: Any, devices: tuple[str, ...],
                  wanted: DType | None) -> tuple[str, UOp]:
    """(device, graph) of `Tensor(data, devices)`: a sharded graph as it is, host data copied
    into a buffer on each device (realized, as `Tensor(data)` is), a graph made on the first
    device and replicated on each (constants need no copy)."""
    if isinstance(data, (list, tuple, np.ndarray, bytes, pathlib.Path)):
        buffers = tuple(_uop_from_data(data, wanted, device) for device in devices)
        return cast(str, devices), cast(UOp, MultiUOp(buffers, devices, None))
    if isinstance(data, CoreTensor):
        data = data.to(cast(str, devices)).uop
    if isinstance(data, MultiUOp):
        if data.devices != devices:
            raise ValueError(f"a tensor sharded over {data.devices} cannot be made on "
                             f"{devices}: gather it with .to(device) first")
        node = data if wanted is None else data.cast(wanted)
    else:
        node = shard_uop(_node_of(data, wanted, devices[0]), devices, None)
    return cast(str, devices), cast(UOp, node)


def _array_from_list(data: list | tuple, dtype: DType) -> np.ndarray:
    """A nested list as a numpy array of `dtype`. A Python int outside an integer dtype's range
    wraps modulo 2**bits, as tinygrad stores it (`Tensor([255], dtype="int8")` is [-1],
    `Tensor([-1], dtype="uint32")` [4294967295]): the same wrap as a constant's
    (dtype.truncate_to) and as numpy's own cast of an int64 array. numpy refuses such an int
    in a list (OverflowError), so only then is each int wrapped, one by one."""
    if dtype.kind not in ("int", "uint"):
        return np.array(data, dtype=dtype.np)
    try:
        return np.array(data, dtype=dtype.np)
    except OverflowError:
        pass
    objects = np.array(data, dtype=object)
    wrapped = np.frompyfunc(lambda value: _wrapped_int(value, dtype), 1, 1)(objects)
    try:
        return np.asarray(wrapped).astype(dtype.np)
    except OverflowError as error:  # a float out of the range too: no wrap is defined for it
        raise ValueError(f"cannot store the list's values in {dtype}: {error}") from None


def _wrapped_int(value: Any, dtype: DType) -> Any:
    """A Python int (or numpy integer) wrapped into `dtype`; any other value as it is."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return truncate_to(dtype, int(value))
    return value


def _file_array(path: pathlib.Path, dtype: DType) -> np.ndarray:
    """A file's bytes as a 1-D array of `dtype` (uint8 unless asked): as many whole elements as
    the file holds, a shorter tail left out. tinygrad maps the file on its DISK device; here the
    bytes are read and copied to the tensor's device."""
    if path.is_dir():
        raise IsADirectoryError(f"Tensor({path!r}): {path} is a folder, not a file")
    contents = path.read_bytes()  # FileNotFoundError names the missing file
    whole = len(contents) // dtype.itemsize * dtype.itemsize
    return np.frombuffer(contents[:whole], dtype=dtype.np)


def _uop_from_data(data: Any, dtype: DType | None, device: str) -> UOp:
    """Bring host data (list, numpy array, bytes, a file's pathlib.Path) onto the device as a
    realized buffer (bfloat16 as its words, rounded from float32: numpy has no bfloat16,
    dtype.py)."""
    if isinstance(data, pathlib.Path):
        data, dtype = _file_array(data, dtype or dtypes.uint8), None
    if dtype == dtypes.bfloat16 and not (isinstance(data, np.ndarray) and
                                         is_bfloat16_words(data.dtype)):
        data = to_bfloat16_bits(np.asarray(data, dtype=np.float32))
        dtype = None
    if isinstance(data, (list, tuple)):
        array = _array_from_list(data, dtype or dtypes.from_py(data))
    elif isinstance(data, np.ndarray):
        array = data if dtype is None else data.astype(dtype.np)
        if dtype is None and array.dtype.kind != "f":
            dtypes.from_np(array.dtype)  # raises a clear error for unsupported dtypes
    elif isinstance(data, bytes):
        array = np.frombuffer(data, dtype=np.uint8)
    else:
        raise TypeError(f"cannot make a Tensor from {type(data).__name__}")
    shape = array.shape  # (np.ascontiguousarray turns a 0-d array into shape (1,))
    array = np.ascontiguousarray(array)
    buffer = Buffer(device, array.size, dtypes.from_np(array.dtype)).copyin(array.reshape(-1))
    return UOp(Ops.BUFFER, buffer.dtype, (), buffer).reshape(shape)

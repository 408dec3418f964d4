"""Chapter 9 (part 8): several devices — a tensor sharded over devices, and the all-reduce.

What this teaches:
- going past one device needs no new kind of kernel. A sharded tensor is one graph per device
  (its *shards*) plus one number: the axis it is split on (`None`: every device holds all of
  it, a *replicated* tensor). `Tensor.shard(("CPU", "CPU:1"), axis=0)` cuts a tensor into
  equal parts and copies part i to device i;
- an op runs per shard when no shard needs another's data: elementwise ops, casts, and the
  movement ops that leave the split axis alone (a replicated operand is cut to each shard's
  slice first: a view, no copy). A reduction over the split axis cannot: each device reduces
  its own part, and then the partial results are combined across devices by an *all-reduce*;
- the all-reduce here is a ring, as in tinygrad and NCCL: each partial result is cut into one
  chunk per device; in n-1 *reduce-scatter* steps each chunk travels once around the ring,
  collecting every device's part of it; in n-1 *all-gather* steps the finished chunks travel
  around again, until every device holds the whole result. Every step is a COPY between two
  devices plus an ADD (or MAX): ordinary graph nodes, which the scheduler runs and DEBUG=1
  lists (`DEBUG=1` also prints the ring's steps, with the devices, when it is built);
- `.to(device)` gathers: copy every shard there, and concatenate them along the axis;
- autograd needs nothing new either: the shards' graphs are plain UOps joined by COPYs, which
  have a gradient (a copy back). A replicated parameter's gradient is the *sum* of the
  gradients of its replicas, one all-reduce more: that is data-parallel training.

`MultiUOp` below is the sharded counterpart of a UOp: the Tensor layer builds graphs by
calling `uop.alu`, `uop.reshape`, `uop.reduce`..., and a MultiUOp answers each call by calling it
on every shard (tinygrad's MultiLazyBuffer, before tinygrad moved the same rules into a graph
rewrite of its MULTI op).

Builds on: ir/uop.py, device.py. Used by: tensor/core.py (a Tensor whose `.uop` is a MultiUOp,
and whose `.device` is a tuple of devices).

>>> from tinyteach import Tensor
>>> t = Tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]).shard(("CPU", "CPU:1"), axis=0)
>>> t.device, t.uop.shards[1].shape
(('CPU', 'CPU:1'), (2, 2))
>>> (t * 10).sum(axis=0).tolist()
[160.0, 200.0]
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from tinyteach.device import Device
from tinyteach.dtype import DType
from tinyteach.engine.schedule import device_of
from tinyteach.helpers import prod
from tinyteach.ir.uop import Ops, UOp
from tinyteach.settings import DEBUG


class ShardingError(NotImplementedError):
    """An op that a sharded tensor cannot do per shard (it would mix the shards of its split
    axis): the message names the op and the axis, and what to do instead."""


class OneGraphError(ShardingError, AttributeError):
    """Code that reads one UOp graph (`.op`, `.src`, `.toposort`) met a sharded tensor's
    MultiUOp: it does not handle several devices (an AttributeError too, for `hasattr`)."""


def canonical_devices(devices: Sequence[str]) -> tuple[str, ...]:
    """The devices' own names (Device.canonicalize), checked: at least one, none twice."""
    if isinstance(devices, str) or not devices:
        raise ValueError(f"shard needs a tuple of devices, such as ('CPU', 'CPU:1'), not "
                         f"{devices!r}")
    names = tuple(Device.canonicalize(d) for d in devices)
    if len(set(names)) != len(names):
        raise ValueError(f"shard: a device appears twice in {names}")
    return names


def reads_a_device(node: UOp) -> bool:
    """Does this graph read memory (a buffer, or a copy of one)? A graph of constants does
    not: it can stand on every device as it is."""
    return any(n.op in (Ops.BUFFER, Ops.COPY) for n in node.toposort)


def _slice_bounds(shape: tuple[int, ...], axis: int, index: int,
                  parts: int) -> tuple[tuple[int, int], ...]:
    """The bounds of part `index` of `parts` equal parts along `axis`."""
    size = shape[axis] // parts
    return tuple((index * size, (index + 1) * size) if i == axis else (0, s)
                 for i, s in enumerate(shape))


def _copy(node: UOp, device: str) -> UOp:
    """`node` on `device`: a COPY, unless it is there already, or is a graph of constants
    (no memory to move)."""
    if not reads_a_device(node) or device_of(node, "") == device:
        return node
    return UOp(Ops.COPY, node.dtype, (node,), device)


def shard_uop(node: UOp, devices: tuple[str, ...], axis: int | None) -> MultiUOp:
    """`node` (on one device) cut into len(devices) equal parts along `axis`, part i copied to
    devices[i]; every device gets all of it for axis None."""
    if axis is not None and node.shape[axis] % len(devices):
        raise ValueError(f"shard: axis {axis} of shape {node.shape} has {node.shape[axis]} "
                         f"elements, which do not split evenly over {len(devices)} devices")
    shards = []
    for index, device in enumerate(devices):
        part = node if axis is None else node.shrink(
            _slice_bounds(node.shape, axis, index, len(devices)))
        shards.append(_copy(part, device))
    return MultiUOp(tuple(shards), devices, axis)


@dataclass(frozen=True, eq=False)
class MultiUOp:
    """One graph per device (`shards[i]` on `devices[i]`), and the axis they split the whole
    along (None: each shard is all of it). Equal by identity, as a Tensor's graph handle."""

    shards: tuple[UOp, ...]
    devices: tuple[str, ...]
    axis: int | None

    # ---- what the whole is ----

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.shards[0].shape)
        if self.axis is not None:
            shape[self.axis] *= len(self.shards)
        return tuple(shape)

    @property
    def dtype(self) -> DType:
        return self.shards[0].dtype

    has_symbols = False  # shard refuses symbolic shapes

    def __getattr__(self, name: str) -> Any:
        """Only for a name a MultiUOp lacks: a UOp's (`op`, `src`, `toposort`), asked by code
        that handles one graph per tensor (TinyJit, viz) and not yet a tensor's shards."""
        if name.startswith("__"):
            raise AttributeError(name)
        raise OneGraphError(f"UOp.{name} of a tensor sharded over {self.devices}: this code "
                            f"works on one graph per tensor, not on one per device; gather "
                            f"the tensor with .to(device) first")

    def _each(self, build: Callable[[UOp], UOp], axis: int | None = None) -> MultiUOp:
        return MultiUOp(tuple(build(s) for s in self.shards), self.devices, axis)

    def _refuse(self, op: str, why: str) -> ShardingError:
        return ShardingError(f"{op} {why}, on axis {self.axis}, the axis this tensor of shape "
                             f"{self.shape} is split on over {self.devices}: gather it with "
                             f".to(device) first, or shard it on another axis")

    # ---- elementwise: per shard, after lining the operands up ----

    def alu(self, op: Ops, *others: MultiUOp | UOp) -> MultiUOp:
        operands = (self, *others)
        axis = self._common_axis(op, operands)
        per_operand = [self._shards_of(o, axis) for o in operands]
        shards = tuple(first.alu(op, *rest) for first, *rest in zip(*per_operand))
        return MultiUOp(shards, self.devices, axis)

    def _common_axis(self, op: Ops, operands: Sequence[MultiUOp | UOp]) -> int | None:
        axes = {o.axis for o in operands if isinstance(o, MultiUOp) and o.axis is not None}
        if len(axes) > 1:
            raise ShardingError(f"{op.name} of tensors split on different axes {sorted(axes)}:"
                                f" shard them on the same axis first")
        for other in operands:
            if isinstance(other, MultiUOp) and other.devices != self.devices:
                raise ValueError(f"{op.name} of tensors sharded over different devices: "
                                 f"{self.devices} and {other.devices}")
        return axes.pop() if axes else None

    def _shards_of(self, operand: MultiUOp | UOp, axis: int | None) -> tuple[UOp, ...]:
        """The operand's part on each device, for a result split on `axis`: a replicated
        operand (or a graph of constants) is cut to each shard's slice, a view."""
        parts = len(self.devices)
        if isinstance(operand, UOp):
            if reads_a_device(operand):
                raise ValueError("an op between a sharded tensor and one on a single device: "
                                 "shard the other one too (or move it with .to())")
            whole = (operand,) * parts
        elif operand.axis == axis:
            return operand.shards
        else:
            whole = operand.shards
        if axis is None:
            return whole
        return tuple(w.shrink(_slice_bounds(w.shape, axis, i, parts)) for i, w in enumerate(whole))

    def cast(self, dtype: DType) -> MultiUOp:
        return self._each(lambda s: s.cast(dtype), self.axis)

    def bitcast(self, dtype: DType) -> MultiUOp:
        return self._each(lambda s: s.bitcast(dtype), self.axis)

    # ---- movement: per shard, where the split axis is left alone ----

    def reshape(self, shape: tuple[int, ...]) -> MultiUOp:
        shape = tuple(shape)
        if self.axis is None:
            return self._each(lambda s: s.reshape(shape))
        new_axis = self._axis_after_reshape(shape)
        local = tuple(s // len(self.shards) if i == new_axis else s for i, s in enumerate(shape))
        return self._each(lambda s: s.reshape(local), new_axis)

    def _axis_after_reshape(self, shape: tuple[int, ...]) -> int:
        """Where the split axis lands in a reshape to `shape`. Each shard holds a run of
        consecutive elements of the whole, counted from the split axis on: it stays a shard
        of the new shape if some new axis starts at the same element count and splits
        evenly ((4, 3) split on 0 -> (12,) split on 0 -> (2, 2, 3) split on 0)."""
        before = prod(self.shape[:self.axis])
        parts = len(self.shards)
        for axis in range(len(shape)):
            if prod(shape[:axis]) == before and shape[axis] % parts == 0 and shape[axis] > 1:
                return axis
        raise self._refuse(f"reshape to {shape}", "would cut across the shards")

    def permute(self, order: tuple[int, ...]) -> MultiUOp:
        order = tuple(order)
        axis = None if self.axis is None else order.index(self.axis)
        return self._each(lambda s: s.permute(order), axis)

    def expand(self, shape: tuple[int, ...]) -> MultiUOp:
        shape = tuple(shape)
        if self.axis is not None and shape[self.axis] != self.shape[self.axis]:
            raise self._refuse(f"expand to {shape}", "would broadcast the split axis")
        local = shape if self.axis is None else shape[:self.axis] + (
            self.shards[0].shape[self.axis],) + shape[self.axis + 1:]
        return self._each(lambda s: s.expand(local), self.axis)

    def pad(self, padding: tuple[tuple[int, int], ...]) -> MultiUOp:
        if self.axis is not None and tuple(padding[self.axis]) != (0, 0):
            raise self._refuse(f"pad {padding[self.axis]}", "would pad across the shards")
        return self._each(lambda s: s.pad(padding), self.axis)

    def shrink(self, bounds: tuple[tuple[int, int], ...]) -> MultiUOp:
        if self.axis is not None and tuple(bounds[self.axis]) != (0, self.shape[self.axis]):
            raise self._refuse(f"shrink to {bounds[self.axis]}", "would cut across the shards")
        local = tuple(bounds)
        if self.axis is not None:
            local = local[:self.axis] + ((0, self.shards[0].shape[self.axis]),) + \
                local[self.axis + 1:]
        return self._each(lambda s: s.shrink(local), self.axis)

    def flip(self, axes: tuple[int, ...]) -> MultiUOp:
        if self.axis in axes:
            raise self._refuse("flip", "would reverse the order of the shards")
        return self._each(lambda s: s.flip(axes), self.axis)

    # ---- reduction: per shard, then across the devices when the split axis is reduced ----

    def reduce(self, op: Ops, axes: tuple[int, ...]) -> MultiUOp:
        partial = self._each(lambda s: s.reduce(op, axes), self.axis)
        if self.axis is None or self.axis not in axes:
            return partial
        return MultiUOp(all_reduce(op, partial.shards, self.devices), self.devices, None)

    # ---- leaving the devices ----

    def gather(self, device: str) -> UOp:
        """The whole on one device: every shard copied there, concatenated along the axis (as
        Tensor.cat does: each part padded to the whole with zeros, then added)."""
        if self.axis is None:
            return self.shards[0] if self.devices[0] == device else _copy(self.shards[0], device)
        total, size = self.shape[self.axis], self.shards[0].shape[self.axis]
        result: UOp | None = None
        for index, shard in enumerate(self.shards):
            here = shard if self.devices[index] == device else _copy(shard, device)
            padding = [(0, 0)] * len(self.shape)
            padding[self.axis] = (index * size, total - (index + 1) * size)
            piece = here.pad(tuple(padding))
            result = piece if result is None else result + piece
        assert result is not None
        return result


def shards_of(node: UOp | MultiUOp) -> tuple[UOp, ...]:
    """The graphs a tensor's node stands for: a MultiUOp's shards, or the node itself."""
    return node.shards if isinstance(node, MultiUOp) else (node,)


def each_shard(node: UOp, build: Callable[[UOp], UOp]) -> UOp:
    """`build` applied to the node, or to every shard of a MultiUOp (the axis kept). Typed as
    a UOp: a sharded Tensor holds its MultiUOp where a Tensor holds its UOp."""
    if isinstance(node, MultiUOp):
        return cast(UOp, node._each(build, node.axis))
    return build(node)


# ---- the all-reduce: a ring of copies and adds ----

@dataclass(frozen=True)
class RingStep:
    """One copy of the ring: in `phase` "reduce-scatter" or "all-gather", round `round`,
    chunk `chunk` goes from device index `source` to device index `dest`."""

    phase: str
    round: int
    chunk: int
    source: int
    dest: int


def ring_steps(parts: int) -> list[RingStep]:
    """The copies of a ring all-reduce over `parts` devices, in order. Chunk c starts on
    device c; in reduce-scatter round r it moves from device c+r to c+r+1 (mod parts), where
    that device's own part of chunk c is added, so after parts-1 rounds device c-1 holds all
    of chunk c. In the all-gather rounds it moves on, parts-1 more times, overwriting."""
    steps = []
    for phase, start in (("reduce-scatter", 0), ("all-gather", parts - 1)):
        for round_ in range(parts - 1):
            for chunk in range(parts):
                source = (chunk + start + round_) % parts
                steps.append(RingStep(phase, round_ + 1, chunk, source, (source + 1) % parts))
    return steps


def _chunk_bounds(size: int, parts: int) -> list[tuple[int, int]]:
    """`size` elements cut into `parts` runs, as even as can be (the first ones longer)."""
    base, extra = divmod(size, parts)
    bounds, start = [], 0
    for index in range(parts):
        end = start + base + (1 if index < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def all_reduce(op: Ops, partials: tuple[UOp, ...], devices: tuple[str, ...]) -> tuple[UOp, ...]:
    """Every device gets the reduction (ADD or MAX) of all the `partials` (one per device, of
    one shape): a ring all-reduce. When a partial has fewer elements than there are devices
    (a ring would send empty chunks), each device adds copies of all the others instead."""
    parts, shape = len(partials), partials[0].shape
    size = prod(shape)
    if parts == 1:
        return partials
    if size < parts:
        _log(f"all-reduce ({op.name}, every device copies every part): {size} elements over "
             f"{', '.join(devices)}")
        return tuple(_combine(op, [_copy(p, device) for p in partials]) for device in devices)
    flat = [p.reshape((size,)) for p in partials]
    bounds = _chunk_bounds(size, parts)
    # chunks[d][c]: chunk c as device d holds it now
    chunks = [[f.shrink((b,)) for b in bounds] for f in flat]
    _log(f"all-reduce ({op.name}, ring): {size} elements on each of {', '.join(devices)}, "
         f"in {parts} chunks of <= {bounds[0][1]}")
    for step in ring_steps(parts):
        arriving = _copy(chunks[step.source][step.chunk], devices[step.dest])
        if step.phase == "reduce-scatter":
            arriving = arriving.alu(op, chunks[step.dest][step.chunk])
        chunks[step.dest][step.chunk] = arriving
        _log(f"  {step.phase} {step.round}: chunk {step.chunk} {devices[step.source]} -> "
             f"{devices[step.dest]}" + (f" ({op.name})" if step.phase == "reduce-scatter" else ""))
    return tuple(_concatenate(row, bounds, size).reshape(shape) for row in chunks)


def _combine(op: Ops, values: list[UOp]) -> UOp:
    result = values[0]
    for value in values[1:]:
        result = result.alu(op, value)
    return result


def _concatenate(pieces: list[UOp], bounds: list[tuple[int, int]], size: int) -> UOp:
    """1-d pieces joined into one run of `size` (each padded with zeros, then added)."""
    padded = [piece.pad(((start, size - end),)) for piece, (start, end) in zip(pieces, bounds)]
    return _combine(Ops.ADD, padded)


def _log(line: str) -> None:
    if DEBUG.value >= 1:
        print(line)

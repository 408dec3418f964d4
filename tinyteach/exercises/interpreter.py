"""Chapter 12 (exercise A): an interpreter backend — every primitive op as a small numpy function.

What this teaches:
- the backend contract is a table: for each op of `uop.PRIMITIVE_OPS`, a function
  `op_function(node, *sources) -> np.ndarray` that gets the UOp (its dtype and arg) and the
  already computed values of its sources;
- the engine handles BUFFER (memory) and COPY (moving between devices) itself, so a student
  writes the other 26 (`INTERPRETER_OPS`);
- `InterpreterBackend(ops).register("STUDENT")` turns the table into a device:
  `Tensor([1, 2], device="STUDENT")` then runs every kernel through the student's functions,
  using the same InterpretedProgram as the NUMPY device.

The solution is `runtime/numpy.py`'s `NUMPY_OPS`.

Builds on: ir/uop.py, device.py, runtime/numpy.py, engine/realize.py. Used by: autograder.py.

>>> from tinyteach.runtime.numpy import NUMPY_OPS
>>> len(INTERPRETER_OPS), InterpreterBackend(NUMPY_OPS).missing()
(26, [])
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from tinyteach.device import Backend, Device, HostAllocator
from tinyteach.engine.realize import forget_runners
from tinyteach.ir.uop import PRIMITIVE_OPS, Ops
from tinyteach.runtime.numpy import InterpretedProgram

# the engine handles these two: BUFFER is memory, COPY moves bytes between devices
ENGINE_OPS = (Ops.BUFFER, Ops.COPY)
INTERPRETER_OPS: tuple[Ops, ...] = tuple(op for op in PRIMITIVE_OPS if op not in ENGINE_OPS)

OpFunction = Callable[..., np.ndarray]


def forget_device(name: str) -> None:
    """Drop the kernels the engine compiled for a device (its runner cache), so a
    re-registered backend recomputes everything with its new code."""
    forget_runners(name)


class InterpreterBackend:
    """A student's interpreter backend: a table {Ops.ADD: add_function, ...}."""

    kind = "interpreter"

    def __init__(self, ops: dict[Ops, OpFunction]):
        self.ops = dict(ops)

    def __repr__(self) -> str:
        return f"<InterpreterBackend: {len(self.ops)} of {len(INTERPRETER_OPS)} ops in the table>"

    def missing(self) -> list[str]:
        """The ops the table does not have yet."""
        return [op.name for op in INTERPRETER_OPS if op not in self.ops]

    def make_backend(self, name: str) -> Backend:
        program = partial(InterpretedProgram, ops=self.ops)
        return Backend(name, HostAllocator(), None, None, program)

    def register(self, name: str = "STUDENT") -> str:
        """Make this backend the device `name` (replacing an earlier one of that name)."""
        name = name.upper()
        Device.register(name, partial(self.make_backend, name))
        forget_device(name)
        return name

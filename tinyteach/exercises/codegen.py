"""Exercise B: a code-generating backend — `code_for_op` for a C-like target.

What this teaches:
- a compiled backend does not compute values: it writes source code. The renderer (chapter 8)
  already walks the kernel, writes the loops, the loads and the stores; a language only says how
  each ALU op looks: `code_for_op[Ops.ADD] = lambda a, b, dtype: f"({a}+{b})"`;
- here all 18 ALU ops (`CODEGEN_OPS`) go through the student's table, IDIV and MOD included
  (CRenderer special-cases them for constant divisors; StudentRenderer does not);
- the Compiler turns source into a binary and the Program runs it; the C compiler of the CPU
  device (runtime/cpu.py) can be reused, so the glue is a few lines;
- fusion, movement ops (views become index math), reductions and the JIT need nothing more.

Each `code_for_op` entry gets the operands' source text and a dtype: the operands' dtype for
every op, except CAST, which gets the dtype to convert to.

The solution is `render/c.py`'s table (see reference.py).

Builds on: render/c.py, runtime/cpu.py, device.py. Used by: autograder.py.

>>> from tinyteach.exercises.reference import reference_codegen
>>> len(CODEGEN_OPS), reference_codegen().missing()
(18, [])
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from tinyteach.device import Backend, Compiler, Device, HostAllocator
from tinyteach.exercises.interpreter import forget_device
from tinyteach.render import NARROW_DTYPES, WRAPPING_OPS
from tinyteach.render.c import CRenderer
from tinyteach.runtime.cpu import ClangStyleCompiler, CPUProgram, find_c_compiler
from tinyteach.uop import ALU, Ops, UOp

CODEGEN_OPS: tuple[Ops, ...] = ALU

CodeFunction = Callable[..., str]


class StudentRenderer(CRenderer):
    """CRenderer with the student's `code_for_op` for every ALU op."""

    def __init__(self, code_for_op: dict[Ops, CodeFunction]):
        super().__init__()
        self.code_for_op = dict(code_for_op)

    def alu(self, node: UOp, operands: list[str]) -> str:
        if node.op not in self.code_for_op:
            raise NotImplementedError(f"code_for_op has no entry for {node.op.name}")
        # CAST is told the dtype to convert to; every other op its operands' dtype
        dtype = node.dtype if node.op is Ops.CAST else node.src[-1].dtype
        expression = self.code_for_op[node.op](*operands, dtype)
        if node.op in WRAPPING_OPS and node.dtype in NARROW_DTYPES:
            # as in CRenderer: C computes on narrow ints as int, so cast back to wrap (127+1)
            return f"(({self.type_name(node.dtype)})({expression}))"
        return expression


def cpu_compiler() -> ClangStyleCompiler:
    """The CPU device's compiler (gcc or clang, with its on-disk cache)."""
    return ClangStyleCompiler(find_c_compiler())


class CodegenBackend:
    """A student's code-generating backend: a `code_for_op` table, a Compiler and a Program
    class (by default the CPU device's)."""

    kind = "codegen"

    def __init__(self, code_for_op: dict[Ops, CodeFunction], compiler: Compiler | None = None,
                 program: Callable[..., Any] | None = None):
        self.code_for_op = dict(code_for_op)
        self.compiler = compiler
        self.program = program

    def __repr__(self) -> str:
        return f"<CodegenBackend: {len(self.code_for_op)} of {len(CODEGEN_OPS)} ops in the table>"

    def missing(self) -> list[str]:
        """The ops the table does not have yet."""
        return [op.name for op in CODEGEN_OPS if op not in self.code_for_op]

    def make_backend(self, name: str) -> Backend:
        compiler = self.compiler if self.compiler is not None else cpu_compiler()
        program = self.program if self.program is not None else CPUProgram
        return Backend(name, HostAllocator(), StudentRenderer(self.code_for_op), compiler, program)

    def register(self, name: str = "STUDENT_C") -> str:
        """Make this backend the device `name` (replacing an earlier one of that name)."""
        name = name.upper()
        Device.register(name, partial(self.make_backend, name))
        forget_device(name)
        return name

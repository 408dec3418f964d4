"""Chapter 12 (exercise B): a code-generating backend — `code_for_op` for a C-like target.

What this teaches:
- a compiled backend does not compute values: it writes source code. The renderer (chapter 8)
  already walks the kernel, writes the loops, the loads and the stores; a language only says how
  each ALU op looks: one entry of `code_for_op` per op, `ADD` writes `f"({a}+{b})"`;
- all 18 ALU ops (`CODEGEN_OPS`) go through the student's table, IDIV, MOD and CAST included:
  StudentRenderer is CRenderer with the student's table instead of its own;
- the Compiler turns source into a binary and the Program runs it; the C compiler of the CPU
  device (runtime/cpu.py) can be reused, so the glue is a few lines;
- fusion, movement ops (views become index math), reductions and the JIT need nothing more.

Each entry has the signature every renderer's entries have (render/__init__.py states it):

    def add_code(renderer, operands, operand_dtypes, dtype) -> str:
        a, b = operands
        return f"({a}+{b})"

`renderer` is the C renderer (`renderer.type_name(dtype)`, `renderer.render_const(1, dtype)`),
`operands` the operands' C expressions, `operand_dtypes` their dtypes and `dtype` the result's
(the dtype to convert to, for CAST).

The solution is `render/c.py`'s table (see reference.py).

Builds on: render/c.py, runtime/cpu.py, device.py. Used by: autograder.py.

>>> from tinyteach.exercises.reference import reference_codegen
>>> len(CODEGEN_OPS), reference_codegen().missing()
(18, [])
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

from tinyteach.device import Backend, Compiler, Device, HostAllocator
from tinyteach.dtype import dtypes
from tinyteach.exercises.interpreter import forget_device
from tinyteach.ir.uop import ALU, Ops
from tinyteach.render import CodeForOp, CStyleRenderer
from tinyteach.render.c import CRenderer
from tinyteach.runtime.cpu import ClangStyleCompiler, CPUProgram, find_c_compiler

CODEGEN_OPS: tuple[Ops, ...] = ALU

CodeFunction = CodeForOp


class StudentRenderer(CRenderer):
    """CRenderer with the student's `code_for_op` for every ALU op (an op without an entry
    raises NotImplementedError when a kernel needs it)."""

    def __init__(self, code_for_op: dict[Ops, CodeFunction]):
        super().__init__()
        self.code_for_op = dict(code_for_op)

    def code(self, op: Ops) -> CodeFunction:
        """The student's entry for `op`, after a check that it takes the four arguments every
        entry gets (a clear message instead of a TypeError from deep inside the walk)."""
        entry = CStyleRenderer.code(self, op)  # the student's own function, as written
        try:
            inspect.signature(entry).bind(self, [], [], dtypes.float32)
        except TypeError:
            takes = inspect.signature(entry)
            raise TypeError(f"code_for_op[Ops.{op.name}] must take (renderer, operands, "
                            f"operand_dtypes, dtype); it takes {takes}") from None
        except ValueError:  # no signature to read (a builtin): let the call decide
            pass
        return super().code(op)  # (CRenderer's wraps it for bfloat16 operands)


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

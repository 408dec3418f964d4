"""The reference solutions of both exercises, as backends the grader accepts.

- Exercise A: `runtime/numpy.py`'s NUMPY_OPS, the definition of every op;
- Exercise B: `render/c.py`'s code_for_op table, plus IDIV and MOD written for any divisor
  (CRenderer renders those two itself, with a shortcut for constant divisors).

`python -m tinyteach.exercises tinyteach.exercises.reference` grades both: all pass.

Builds on: runtime/numpy.py, render/c.py, exercises/interpreter.py and codegen.py.

>>> reference_interpreter().missing()
[]
"""
from __future__ import annotations

from tinyteach.dtype import DType, dtypes
from tinyteach.exercises.codegen import CODEGEN_OPS, CodegenBackend
from tinyteach.exercises.interpreter import INTERPRETER_OPS, InterpreterBackend
from tinyteach.render.c import CRenderer
from tinyteach.runtime.numpy import NUMPY_OPS
from tinyteach.uop import Ops


def idiv_code(a: str, b: str, dtype: DType) -> str:
    """C's / never traps here: x/0 gives 0 and MIN/-1 wraps (as -MIN does with -fwrapv)."""
    if dtypes.is_unsigned(dtype):
        return f"({b}==0?0:{a}/{b})"
    return f"({b}==0?0:({b}==-1?-({a}):{a}/{b}))"


def mod_code(a: str, b: str, dtype: DType) -> str:
    """C's % for integers (x%0 gives 0, MIN%-1 gives 0); fmod, with the same sign rule, for
    floats."""
    if dtypes.is_float(dtype):
        return f"fmod({a},{b})"
    if dtypes.is_unsigned(dtype):
        return f"({b}==0?0:{a}%{b})"
    return f"(({b}==0||{b}==-1)?0:{a}%{b})"


def reference_interpreter() -> InterpreterBackend:
    return InterpreterBackend({op: NUMPY_OPS[op] for op in INTERPRETER_OPS})


def reference_codegen() -> CodegenBackend:
    table = {**CRenderer().code_for_op, Ops.IDIV: idiv_code, Ops.MOD: mod_code}
    return CodegenBackend({op: table[op] for op in CODEGEN_OPS})


REFERENCE_INTERPRETER = reference_interpreter()
REFERENCE_CODEGEN = reference_codegen()

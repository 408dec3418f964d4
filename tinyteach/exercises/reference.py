"""Chapter 12 (solutions): both exercises solved, as backends the grader accepts.

- Exercise A: `runtime/numpy.py`'s NUMPY_OPS, the definition of every op;
- Exercise B: `render/c.py`'s code_for_op table, as it is (IDIV, MOD and CAST included);
- the stretch exercise: the five rewrite rules of rewrites.py, written as ir/rewrite.py writes its
  own (`symbolic`).

`python -m tinyteach.exercises tinyteach.exercises.reference` grades all three: all pass.

Builds on: runtime/numpy.py, render/c.py, ir/rewrite.py, exercises/interpreter.py, codegen.py and
rewrites.py.

>>> reference_interpreter().missing(), reference_rules().missing()
([], [])
"""
from __future__ import annotations

from tinyteach.dtype import dtypes
from tinyteach.exercises.codegen import CODEGEN_OPS, CodegenBackend
from tinyteach.exercises.interpreter import INTERPRETER_OPS, InterpreterBackend
from tinyteach.exercises.rewrites import PatternAndBuild, RewriteRules
from tinyteach.ir.rewrite import UPat
from tinyteach.ir.uop import Ops, UOp
from tinyteach.render.c import CRenderer
from tinyteach.runtime.numpy import NUMPY_OPS


def reference_interpreter() -> InterpreterBackend:
    return InterpreterBackend({op: NUMPY_OPS[op] for op in INTERPRETER_OPS})


def reference_codegen() -> CodegenBackend:
    return CodegenBackend({op: CRenderer.code_for_op[op] for op in CODEGEN_OPS})


x = UPat.var("x")


def zero_for_ints(x: UOp) -> UOp | None:
    """x+(-x) is 0 for integers only: for floats inf + -inf is NaN."""
    return UOp.const(x.dtype, 0) if dtypes.is_int(x.dtype) else None


def false_unless_float(x: UOp) -> UOp | None:
    """x != x is False, except for a float NaN."""
    return None if dtypes.is_float(x.dtype) else UOp.const(dtypes.bool, False)


def times_two() -> PatternAndBuild:
    return UPat(Ops.MUL, src=(x, UPat.const(2))), lambda x: x + x  # x*2 -> x+x


def times_minus_one() -> PatternAndBuild:
    return UPat(Ops.MUL, src=(x, UPat.const(-1))), lambda x: -x  # x*-1 -> -x


def plus_negation() -> PatternAndBuild:
    return UPat(Ops.ADD, src=(x, UPat(Ops.NEG, src=(x,)))), zero_for_ints  # x+(-x) -> 0


def not_equal_itself() -> PatternAndBuild:
    return UPat(Ops.CMPNE, src=(x, x)), false_unless_float  # x!=x -> False


def where_same() -> PatternAndBuild:
    return UPat(Ops.WHERE, src=(UPat.var("c"), x, x)), lambda c, x: x  # where(c, x, x) -> x


def reference_rules() -> RewriteRules:
    return RewriteRules({
        "x*2 -> x+x": times_two, "x*-1 -> -x": times_minus_one,
        "x+(-x) -> 0 (ints)": plus_negation, "x!=x -> False (not floats)": not_equal_itself,
        "where(c, x, x) -> x": where_same,
    })


REFERENCE_INTERPRETER = reference_interpreter()
REFERENCE_CODEGEN = reference_codegen()
REFERENCE_RULES = reference_rules()
